"""The served key pair: tls.crt and tls.key from a mounted Secret, reloaded
when the Secret changes, without dropping the listener.

Each load builds a fresh SSLContext. The listener's context only picks, for
every new handshake, the current one (an SNI callback that swaps the
connection's context, called whether or not the client sends SNI), so a
rotation never leaves a context half-updated, and connections already open
keep theirs. A pair that fails to load (a cert without its key, a partial
write) is logged, and the last good pair keeps serving.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
from collections.abc import Callable
from pathlib import Path

import trio

from powerdev.config.watch import ConfigWatch

log = logging.getLogger(__name__)
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
ALPN = ["http/1.1"]  # what the server speaks (powerdev/webhook/server.py)


class KeyPairError(ValueError):
    """A key pair that cannot be served; str() names the files and the fix."""


def _context() -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION
    context.set_alpn_protocols(ALPN)
    return context


class KeyPair:
    """`front` is the context to serve with; `reload()` reads the files again."""

    def __init__(self, cert_dir: Path) -> None:
        self.cert_dir = cert_dir
        self.cert_path = cert_dir / CERT_FILE
        self.key_path = cert_dir / KEY_FILE
        self._seen: tuple[bytes, bytes] | None = None
        self.fingerprint = ""
        self.current = self._load()
        self.loads = 1
        self.failures = 0
        self._tried = trio.Event()
        self.front = _context()
        self.front.load_cert_chain(self.cert_path, self.key_path)
        self.front.sni_callback = self._pick

    def _pick(self, ssl_object: ssl.SSLObject, server_name: str | None, _: object) -> None:
        ssl_object.context = self.current
        return None

    def _read(self) -> tuple[bytes, bytes]:
        return self.cert_path.read_bytes(), self.key_path.read_bytes()

    def _load(self) -> ssl.SSLContext:
        try:
            seen = self._read()
            context = _context()
            context.load_cert_chain(self.cert_path, self.key_path)
            if self._read() != seen:
                raise KeyPairError(f"{self.cert_dir}: the files changed while being read")
        except FileNotFoundError as err:
            raise KeyPairError(
                f"{err.filename}: missing; mount the webhook's TLS Secret "
                f"({CERT_FILE}, {KEY_FILE}) at {self.cert_dir}"
            ) from None
        except ssl.SSLError as err:
            raise KeyPairError(
                f"{self.cert_path}, {self.key_path}: not a PEM certificate and its key "
                f"({err.reason or err}); check the Secret"
            ) from None
        except OSError as err:
            raise KeyPairError(f"{self.cert_dir}: cannot be read ({err})") from None
        self._seen = seen
        self.fingerprint = fingerprint(seen[0])
        log.info(
            "serving the key pair in %s: certificate sha256 %s", self.cert_dir, self.fingerprint
        )
        return context

    def reload(self) -> bool:
        """Load the pair again if its files changed; False if the new one is bad."""
        try:
            if self._read() == self._seen:
                return True
        except OSError:
            pass  # _load says what is wrong
        try:
            self.current = self._load()
            self.loads += 1
            return True
        except KeyPairError as err:
            self.failures += 1
            log.error("key pair not reloaded, the last good one keeps serving: %s", err)
            return False
        finally:
            self._tried.set()
            self._tried = trio.Event()

    async def wait_until(self, predicate: Callable[[KeyPair], bool]) -> None:
        """Until predicate(self) holds; checked after every reload attempt."""
        while not predicate(self):
            await self._tried.wait()

    async def watch(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Reload on every change in the directory (a Secret volume changes by
        a `..data` symlink swap, which is seen here as a rename)."""
        with ConfigWatch(self.cert_path) as watch:
            task_status.started()
            while True:
                await watch.wait_for_change()
                self.reload()


def fingerprint(cert_pem: bytes) -> str:
    """SHA-256 of the first certificate in a PEM chain (what `openssl x509
    -fingerprint -sha256` prints, without colons), to say in the log which
    certificate is served."""
    text = cert_pem.decode("ascii", "replace")
    end = text.find("-----END CERTIFICATE-----")
    if end < 0:
        return "no certificate"
    der = ssl.PEM_cert_to_DER_cert(text[: end + len("-----END CERTIFICATE-----")])
    return hashlib.sha256(der).hexdigest()
