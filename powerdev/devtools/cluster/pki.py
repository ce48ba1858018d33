"""Certificates and kubeconfigs for the test control plane, written to one
directory: a CA that signs the API server's and etcd's serving certificates
and every client certificate, the service-account signing key, and a
kubeconfig for each client (admin, scheduler, controller manager).

Clients are named as the API server's bootstrap RBAC expects: the admin is
in the group system:masters (O=), the scheduler and the controller manager
are the users system:kube-scheduler and system:kube-controller-manager (CN=).
Written with `cryptography`, not trustme: trustme gives a certificate without
names an empty critical subjectAltName, which Go refuses ("unhandled critical
extension"), and client certificates have no names.
controlplane.py passes these files to the processes it starts."""

from __future__ import annotations

import datetime
import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# What the API server's certificate names: how the tests dial it, and the
# names of the `kubernetes` Service, for a client inside the cluster.
APISERVER_NAMES = (
    "127.0.0.1",
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
CLIENTS = {  # kubeconfig name: (user, groups)
    "admin": ("kubernetes-admin", ("system:masters",)),
    "scheduler": ("system:kube-scheduler", ()),
    "controller-manager": ("system:kube-controller-manager", ()),
}
# With a real node: the kubelet, as the Node authorizer expects a node's
# client to be named, and the API server's client to the kubelets (logs,
# exec), which the kubelet's x509 authentication checks against the CA.
NODE_CLIENTS = {
    "kubelet": ("system:node:{node}", ("system:nodes",)),
    "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", ("system:masters",)),
}
LIFETIME = datetime.timedelta(days=2)  # a test session's, with room


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    dir: Path
    ca: Path
    apiserver: KeyPair
    etcd: KeyPair  # serves etcd, and is its peer client certificate
    etcd_client: KeyPair  # the API server's, to etcd
    clients: dict[str, KeyPair]
    users: dict[str, str]  # each client's user name, by kubeconfig name
    service_account_key: Path  # private: the API server and the token controller sign with it
    service_account_public: Path  # what the API server verifies tokens with

    def kubeconfig(self, client: str) -> Path:
        return self.dir / f"{client}.kubeconfig"


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _key_usage(*, signs: bool) -> x509.KeyUsage:
    """Digital signatures; and with `signs`, certificates and CRLs too (a CA)."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs,
        crl_sign=signs,
        encipher_only=False,
        decipher_only=False,
    )


class _Ca:
    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "powerdev e2e CA")])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            self._builder(self.name, self.key.public_key(), now)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(signs=True), critical=True)
            .sign(self.key, hashes.SHA256())
        )

    def _builder(self, subject: x509.Name, public_key, now) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + LIFETIME)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        )

    def issue(
        self,
        dir: Path,
        file: str,
        common_name: str,
        *,
        groups: tuple[str, ...] = (),
        names: tuple[str, ...] = (),
        server: bool = False,
        client: bool = False,
    ) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name(
            [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
            + [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        )
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            self._builder(subject, key.public_key(), now)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
            .add_extension(_key_usage(signs=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if names:
            sans: list[x509.GeneralName] = []
            for name in names:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(name)))
                except ValueError:
                    sans.append(x509.DNSName(name))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        pair = KeyPair(dir / f"{file}.crt", dir / f"{file}.key")
        pair.cert.write_bytes(
            builder.sign(self.key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
        )
        pair.key.write_bytes(_key_pem(key))
        pair.key.chmod(0o600)
        return pair


def make_pki(dir: Path, node: str | None = None) -> Pki:
    """Everything the control plane needs; with `node`, also the clients of
    a real node by that name (NODE_CLIENTS)."""
    dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca = _Ca()
    ca_path = dir / "ca.crt"
    ca_path.write_bytes(ca.cert.public_bytes(serialization.Encoding.PEM))
    wanted = dict(CLIENTS)
    if node is not None:
        wanted |= {k: (user.format(node=node), g) for k, (user, g) in NODE_CLIENTS.items()}
    clients = {
        name: ca.issue(dir, name, user, groups=groups, client=True)
        for name, (user, groups) in wanted.items()
    }
    sa_key = ec.generate_private_key(ec.SECP256R1())
    sa_private = dir / "service-account.key"
    sa_private.write_bytes(_key_pem(sa_key))
    sa_private.chmod(0o600)
    sa_public = dir / "service-account.pub"  # the API server wants the public half apart
    sa_public.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return Pki(
        dir=dir,
        ca=ca_path,
        apiserver=ca.issue(dir, "apiserver", "kube-apiserver", names=APISERVER_NAMES, server=True),
        # etcd's peer listener checks client certificates too: both usages
        etcd=ca.issue(dir, "etcd", "etcd", names=("127.0.0.1",), server=True, client=True),
        etcd_client=ca.issue(dir, "etcd-client", "kube-apiserver", client=True),
        clients=clients,
        users={name: user for name, (user, _) in wanted.items()},
        service_account_key=sa_private,
        service_account_public=sa_public,
    )


def write_kubeconfigs(pki: Pki, server: str) -> None:
    """A kubeconfig for each client, naming the files (JSON is YAML)."""
    for name, pair in pki.clients.items():
        user = pki.users[name]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "e2e", "cluster": {"server": server, "certificate-authority": str(pki.ca)}}
            ],
            "users": [
                {
                    "name": user,
                    "user": {"client-certificate": str(pair.cert), "client-key": str(pair.key)},
                }
            ],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
            "current-context": "e2e",
        }
        path = pki.kubeconfig(name)
        path.write_text(json.dumps(config, indent=2) + "\n")
        path.chmod(0o600)
