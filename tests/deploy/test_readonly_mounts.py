"""The DaemonSet's host mounts, made on this machine as a runtime makes them
(root): a recursive bind of each hostPath, made read-only at its top
(`readOnly`) or all the way down (`recursiveReadOnly: Enabled`, which runc
and containerd do with mount_setattr(AT_RECURSIVE)), in a private mount
namespace. Then every mount reachable below the target must be read-only."""

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import needs_root
from tests.deploy.test_manifests import daemonset

pytestmark = [
    needs_root,
    pytest.mark.skipif(shutil.which("unshare") is None, reason="unshare (util-linux) missing"),
]

# Run in a child in its own mount namespace: bind, make read-only, report
# every mount at or below the target that is still writable.
CHILD = textwrap.dedent(
    """
    import ctypes, json, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    MS_BIND, MS_REC, MS_REMOUNT, MS_RDONLY = 4096, 16384, 32, 1
    AT_RECURSIVE, MOUNT_ATTR_RDONLY, SYS_MOUNT_SETATTR = 0x8000, 1, 442

    class Attr(ctypes.Structure):
        _fields_ = [("set", ctypes.c_uint64), ("clr", ctypes.c_uint64),
                    ("propagation", ctypes.c_uint64), ("userns", ctypes.c_uint64)]

    def check(rc):
        if rc != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))

    source, target, recursive = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    check(libc.mount(source.encode(), target.encode(), None, MS_BIND | MS_REC, None))
    if recursive:
        attr = Attr(MOUNT_ATTR_RDONLY, 0, 0, 0)
        check(libc.syscall(SYS_MOUNT_SETATTR, -100, target.encode(), AT_RECURSIVE,
                           ctypes.byref(attr), ctypes.sizeof(attr)))
    else:
        check(libc.mount(None, target.encode(), None, MS_REMOUNT | MS_BIND | MS_RDONLY, None))
    writable = []
    for line in open("/proc/self/mountinfo"):
        fields = line.split()
        point, options = fields[4], fields[5].split(",")
        if (point == target or point.startswith(target + "/")) and "rw" in options:
            writable.append(point)
    print(json.dumps(writable))
    """
)


def writable_below(source: str, target: Path, recursive: bool) -> list[str]:
    if Path(source).is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.touch()
    unshare = ["unshare", "--mount", "--propagation", "private"]
    done = subprocess.run(
        [*unshare, sys.executable, "-c", CHILD, source, str(target), "1" if recursive else "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def read_only_host_mounts():
    spec = daemonset()["spec"]["template"]["spec"]
    paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    for mount in spec["containers"][0]["volumeMounts"]:
        if mount["name"] in paths and mount.get("readOnly"):
            yield paths[mount["name"]], mount.get("recursiveReadOnly") == "Enabled"


def test_the_check_sees_what_a_plain_read_only_mount_leaves_writable(tmp_path):
    # Without recursiveReadOnly, the host's /dev keeps writable submounts here
    # (/dev/shm, /dev/pts): the reason the DaemonSet asks for it.
    below = writable_below("/dev", tmp_path / "dev", recursive=False)
    assert below, "expected writable submounts under a top-only read-only /dev"
    assert str(tmp_path / "dev") not in below  # the top itself is read-only


def test_no_writable_host_path_is_reachable(tmp_path):
    mounts = list(read_only_host_mounts())
    kubelets, udev = "/var/lib/kubelet/pod-resources", "/run/udev"
    assert {path for path, _ in mounts} == {"/dev", "/proc/1/mountinfo", kubelets, udev}
    for index, (path, recursive) in enumerate(mounts):
        if path in (kubelets, udev) and not Path(path).exists():
            continue  # no kubelet, no udevd on this machine; on a node, plain directories
        assert writable_below(path, tmp_path / f"m{index}", recursive) == [], path
