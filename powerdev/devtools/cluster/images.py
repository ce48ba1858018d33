"""Container images for the kit's real node, with no registry: a busybox
image for the test pods and a pause image for the pods' sandboxes, both
made from the host's statically linked busybox (Debian's busybox-static),
written as one OCI image layout archive that `ctr images import` reads.

Each image is one uncompressed layer: /bin/busybox, a link per applet the
tests use, and the directories a container's mounts land on. The pause
image's entrypoint only waits for SIGTERM. The pods name the images with
`imagePullPolicy: Never`; containerd's pinned sandbox image is PAUSE."""

from __future__ import annotations

import hashlib
import io
import json
import platform
import tarfile
from pathlib import Path

BUSYBOX_BINARY = Path("/bin/busybox")
BUSYBOX = "localhost/powerdev-kit/busybox:1"
PAUSE = "localhost/powerdev-kit/pause:1"
# The applets the test pods and the pause entrypoint run.
APPLETS = ("sh", "cat", "dd", "echo", "head", "id", "ls", "sleep", "stat", "test", "true", "od")
DIRS = ("bin", "dev", "etc", "proc", "sys", "tmp", "var", "run")
# Waits, and ends at once on SIGTERM (a shell as PID 1 has no default action).
PAUSE_SCRIPT = "trap 'exit 0' TERM INT; while true; do sleep 3600 & wait $!; done"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
# Go's names of this machine's architecture, as image configs give it.
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}


class ImageError(Exception):
    """The images cannot be made: str() names what is missing and the fix."""


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _layer(busybox: bytes) -> bytes:
    """A tar of busybox, its applet links and the mount point directories."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in DIRS:
            entry = tarfile.TarInfo(name)
            entry.type, entry.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(entry)
        binary = tarfile.TarInfo("bin/busybox")
        binary.size, binary.mode = len(busybox), 0o755
        tar.addfile(binary, io.BytesIO(busybox))
        for applet in APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    return out.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes, media_type: str) -> dict[str, object]:
    digest = _digest(data)
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def _image(
    blobs: dict[str, bytes], layer: bytes, name: str, entrypoint: list[str], arch: str
) -> dict[str, object]:
    """One image's manifest descriptor, its blobs added to `blobs`."""
    config = {
        "architecture": arch,
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": _blob(blobs, json.dumps(config).encode(), OCI_CONFIG),
        "layers": [_blob(blobs, layer, OCI_LAYER)],
    }
    descriptor = _blob(blobs, json.dumps(manifest).encode(), OCI_MANIFEST)
    descriptor["platform"] = {"architecture": arch, "os": "linux"}
    # containerd names an imported image by this annotation
    descriptor["annotations"] = {"io.containerd.image.name": name}
    return descriptor


def write_archive(path: Path, busybox: Path = BUSYBOX_BINARY) -> Path:
    """The OCI image layout archive of BUSYBOX and PAUSE, at path."""
    if not busybox.is_file():
        raise ImageError(
            f"{busybox} is missing: the kit's images are made from a static busybox; "
            "install Debian's busybox-static (bash conformance/host-tools does, as root)"
        )
    arch = ARCHITECTURES.get(platform.machine(), platform.machine())
    layer = _layer(busybox.read_bytes())
    blobs: dict[str, bytes] = {}
    index = {
        "schemaVersion": 2,
        "manifests": [
            _image(blobs, layer, BUSYBOX, ["/bin/sh"], arch),
            _image(blobs, layer, PAUSE, ["/bin/sh", "-c", PAUSE_SCRIPT], arch),
        ],
    }
    files = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index).encode(),
        **{f"blobs/sha256/{d.removeprefix('sha256:')}": data for d, data in blobs.items()},
    }
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            entry = tarfile.TarInfo(name)
            entry.size, entry.mode = len(data), 0o644
            tar.addfile(entry, io.BytesIO(data))
    return path
