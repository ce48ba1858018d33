"""The powerdev image itself, built here from the repository's Dockerfile
for the kit's real node, with no registry: written as an OCI image archive
that `ctr -n k8s.io images import` reads and names IMAGE.

The Dockerfile's default base, the official Python image, cannot be pulled
where there is no registry. The base is made instead from Debian's packages
(debootstrap, minbase variant, bookworm, with python3, python3-pip,
python-is-python3 and libudev1) and kept in buildah's local storage under
BASE_REPOSITORY, tagged by a hash of what defines it: a change to the
recipe makes a new base, and an unchanged one is reused. The Dockerfile is
then built with buildah (`--layers`: unchanged steps come from its cache)
and `--build-arg PYTHON_IMAGE=` that base. Two steps are always run again
(stale_steps says why: buildah 1.28, Debian 12's, caches them wrong), so
an unchanged tree still takes some seconds and reaches PyPI for the build
backend.

The build stage's RUN steps fetch wheels from PyPI, the way pip on this
machine does: the host's network (`--network host`), its proxy variables
(buildah passes them), and its pip settings (index, trusted hosts, timeout
and CA bundle), mounted read-only into each RUN step, never into a layer.

The RUN steps run with runc: crun, buildah's first choice, refuses a
machine whose cgroups are mounted in hybrid mode (v1 and the v2 unified
tree). `bash conformance/host-tools`, as root, installs what this needs:
buildah, runc and debootstrap."""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from powerdev.devtools.cluster.images import ARCHITECTURES as GO_ARCHITECTURES

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "Dockerfile"
IMAGE = "localhost/powerdev:kit"
BASE_REPOSITORY = "localhost/powerdev-base"
HOST_TOOLS = "bash conformance/host-tools"
# What defines the base: a change to any of these makes a new one.
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
MIRROR_ENV = "POWERDEV_DEBIAN_MIRROR"  # another Debian mirror, if that one is not reachable
PACKAGES = ("python3", "python3-pip", "python-is-python3", "libudev1", "ca-certificates")
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    # Debian's pip refuses to install outside a venv (PEP 668) unless told.
    "PIP_BREAK_SYSTEM_PACKAGES": "1",
}
BASE_RECIPE = 1  # raise when the steps below change what the base holds
# Debian's names of this machine's architecture, as debootstrap takes them
# (images.ARCHITECTURES has Go's, as an image config gives them).
DEBIAN_ARCHITECTURES = {
    "x86_64": "amd64",
    "aarch64": "arm64",
    "ppc64le": "ppc64el",
    "s390x": "s390x",
}
# The host's pip settings that the build's RUN steps get, by pip.conf key.
PIP_KEYS = ("index-url", "extra-index-url", "trusted-host", "timeout", "retries")
SYSTEM_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# Where the RUN steps find them: a directory of pip.conf and the CA bundle,
# bind-mounted over this one, which pip reads its system-wide pip.conf from.
# The base has it, empty, so that the mount leaves nothing in a layer (a
# mount point buildah must create stays behind as an empty file).
PIP_DIR = "/etc/xdg/pip"
BASE_TIMEOUT = 1800  # seconds, for debootstrap's downloads and installs
BUILD_TIMEOUT = 1800  # seconds, for the build stage's downloads from PyPI


class ImageBuildError(Exception):
    """The image cannot be built: str() names what is missing and the fix,
    or the step that failed and the log that has its output."""


def _tools() -> dict[str, str | None]:
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return {tool: shutil.which(tool, path=path) for tool in ("buildah", "debootstrap", "runc")}


def unavailable() -> str | None:
    """Why the image cannot be built on this machine, for a skip message;
    None if it can."""
    if platform.system() != "Linux":
        return "building the image needs Linux (buildah)"
    if os.geteuid() != 0:
        return "building the image needs root (buildah's storage, debootstrap)"
    if platform.machine() not in DEBIAN_ARCHITECTURES:
        return f"no Debian architecture known for {platform.machine()}"
    for tool, found in _tools().items():
        if found is None:
            return f"{tool} is missing: run {HOST_TOOLS} as root"
    if not DOCKERFILE.is_file():
        return f"no Dockerfile at {DOCKERFILE}"
    return None


def mirror() -> str:
    return os.environ.get(MIRROR_ENV) or MIRROR


def base_name() -> str:
    """The base's name in buildah's storage: BASE_REPOSITORY, tagged by a
    hash of what defines it."""
    recipe = {
        "recipe": BASE_RECIPE,
        "suite": SUITE,
        "mirror": mirror(),
        "arch": DEBIAN_ARCHITECTURES.get(platform.machine(), platform.machine()),
        "packages": sorted(PACKAGES),
        "env": BASE_ENV,
        "dirs": [PIP_DIR],
    }
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()
    return f"{BASE_REPOSITORY}:{digest[:16]}"


def _run(argv: Sequence[str], log: Path, timeout: float, what: str, **kwargs) -> str:
    """Run argv, its output appended to log; its stdout if asked to capture."""
    capture = kwargs.pop("capture", False)
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        try:
            done = subprocess.run(
                list(argv),
                stdout=subprocess.PIPE if capture else out,
                stderr=out,
                text=True,
                timeout=timeout,
                check=False,
                **kwargs,
            )
        except subprocess.TimeoutExpired:
            raise ImageBuildError(f"{what}: timed out after {timeout:.0f} s; see {log}") from None
        if capture:
            out.write(done.stdout)
    if done.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise ImageBuildError(
            f"{what} failed (exit {done.returncode}); the end of {log}:\n" + "\n".join(tail)
        )
    return done.stdout if capture else ""


def _exists(image: str) -> bool:
    done = subprocess.run(
        ["buildah", "inspect", "--type", "image", image],
        capture_output=True,
        timeout=60,
        check=False,
    )
    return done.returncode == 0


def base(*, log: Path) -> str:
    """The Debian base in buildah's storage, made now if it is not there;
    its name."""
    name = base_name()
    if _exists(name):
        return name
    started = time.monotonic()
    arch = DEBIAN_ARCHITECTURES[platform.machine()]
    with tempfile.TemporaryDirectory(prefix="powerdev-base-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        try:
            _debootstrap(rootfs, arch, log)
        finally:
            _unmount_under(rootfs)  # a failed debootstrap may leave /proc mounted there
        _commit(rootfs, name, log)
    with log.open("a") as out:
        out.write(f"\n{name}: made in {time.monotonic() - started:.1f} s\n")
    return name


def _debootstrap(rootfs: Path, arch: str, log: Path) -> None:
    _run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--arch={arch}",
            "--include=" + ",".join(PACKAGES),
            SUITE,
            str(rootfs),
            mirror(),
        ],
        log,
        BASE_TIMEOUT,
        f"debootstrap of Debian {SUITE} from {mirror()} (set ${MIRROR_ENV} for another mirror)",
    )
    # What a container image does without: the downloaded packages, the
    # package lists, and the device nodes the runtime gives each container.
    for deb in (rootfs / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()
    for entry in (rootfs / "var/lib/apt/lists").iterdir():
        if entry.is_file():
            entry.unlink()
    for entry in (rootfs / "dev").iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    (rootfs / PIP_DIR.lstrip("/")).mkdir(parents=True, exist_ok=True)


def _unmount_under(rootfs: Path) -> None:
    """Unmount whatever is mounted under rootfs, deepest first."""
    prefix = str(rootfs) + "/"
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    for point in sorted((p for p in points if p.startswith(prefix)), reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=60, check=False)


def _commit(rootfs: Path, name: str, log: Path) -> str:
    """rootfs as one layer of an image in buildah's storage, named name."""
    container = _run(
        ["buildah", "from", "scratch"], log, 120, "buildah from scratch", capture=True
    ).strip()
    try:
        mount = _run(
            ["buildah", "mount", container], log, 120, "buildah mount", capture=True
        ).strip()
        _run(["cp", "-a", f"{rootfs}/.", mount], log, 600, "copying the base's files")
        config = [
            "buildah",
            "config",
            "--os",
            "linux",
            "--arch",
            GO_ARCHITECTURES.get(platform.machine(), platform.machine()),
        ]
        for key, value in BASE_ENV.items():
            config += ["--env", f"{key}={value}"]
        config += ["--cmd", "python3", container]
        _run(config, log, 120, "buildah config")
        _run(["buildah", "commit", "--quiet", container, name], log, 600, "buildah commit")
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, timeout=120, check=False)
    return name


def _pip_settings(env: Mapping[str, str]) -> tuple[dict[str, str], Path | None]:
    """The host's pip settings the build needs, as pip would read them here
    (its config files, then $PIP_* over them), and the CA bundle pip trusts."""
    home = Path(env.get("HOME", "~")).expanduser()
    files = [
        Path("/etc/xdg/pip/pip.conf"),
        Path("/etc/pip.conf"),
        home / ".pip" / "pip.conf",
        Path(env.get("XDG_CONFIG_HOME", home / ".config")) / "pip" / "pip.conf",
    ]
    if env.get("PIP_CONFIG_FILE"):
        files.append(Path(env["PIP_CONFIG_FILE"]))
    settings: dict[str, str] = {}
    cert = None
    for file in files:
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(file)
        except (configparser.Error, OSError):
            continue
        if parser.has_section("global"):
            for key, value in parser.items("global"):
                if key in PIP_KEYS:
                    settings[key] = value
                elif key == "cert":
                    cert = value
    for key in PIP_KEYS:
        value = env.get("PIP_" + key.upper().replace("-", "_"))
        if value:
            settings[key] = value
    cert = env.get("PIP_CERT") or cert
    if cert is None and SYSTEM_CA.is_file():
        cert = str(SYSTEM_CA)  # what the host trusts, a proxy's CA included
    return settings, Path(cert) if cert and Path(cert).is_file() else None


def runtime() -> str:
    """The runc that buildah's RUN steps run with."""
    runc = _tools()["runc"]
    if runc is None:
        raise ImageBuildError(f"runc is missing: run {HOST_TOOLS} as root")
    return runc


def build_command(base_image: str, pip_dir: Path | None, name: str = IMAGE) -> list[str]:
    """The `buildah build` of the Dockerfile on the Debian base."""
    argv = [
        "buildah",
        "build",
        "--layers",
        "--force-rm",  # no container left behind by a failed step
        f"--runtime={runtime()}",
        "--pull=never",  # the base is local; nothing is pulled
        "--network=host",
        "--format=oci",
        f"--build-arg=PYTHON_IMAGE={base_image}",
        f"--file={DOCKERFILE}",
        f"--tag={name}",
    ]
    if pip_dir is not None:
        argv.append(f"--volume={pip_dir}:{PIP_DIR}:ro")
    return [*argv, str(ROOT)]


def _words(text: str) -> str:
    return " ".join(text.replace("\\\n", " ").split())


def stale_steps(dockerfile: str) -> list[str]:
    """The RUN steps of dockerfile whose cached results buildah 1.28
    (Debian 12's) gets wrong, their words as in an image's history: each
    RUN that bind-mounts another stage (its cache is keyed by its text and
    parent only, not by what it mounts, so a change to powerdev's code
    would rebuild the wheels and install the old ones), and the last RUN
    of each stage so mounted (when that stage is all cached, the mount
    shows it as it was before its later steps: /wheels without powerdev's
    wheel)."""
    joined = re.sub(r"\\\n", " ", dockerfile)
    stages: dict[str, list[str]] = {}
    runs: list[str] = []
    current: list[str] = []
    for line in joined.splitlines():
        line = line.strip()
        if line.upper().startswith("FROM "):
            current = []
            words = line.split()
            if len(words) >= 4 and words[2].upper() == "AS":
                stages[words[3]] = current
        elif line.upper().startswith("RUN "):
            current.append(line[4:])
            runs.append(line[4:])
    mounting = [run for run in runs if re.search(r"--mount=\S*\bfrom=", run)]
    steps = [_words(run) for run in mounting]
    for run in mounting:
        for stage in re.findall(r"--mount=\S*\bfrom=([\w.-]+)", run):
            if stages.get(stage):
                steps.append(_words(stages[stage][-1]))
    return steps


def forget_stale_steps(log: Path, dockerfile: Path = DOCKERFILE) -> list[str]:
    """Remove buildah's cached results of stale_steps(dockerfile), so that
    the build runs them again (the build stage's last pip wheel and the
    final stage's pip install: seconds); every other step stays cached.
    The images removed."""
    steps = stale_steps(dockerfile.read_text())
    listed = _run(
        ["buildah", "images", "--all", "--json"], log, 120, "buildah images", capture=True
    )
    removed = []
    for entry in json.loads(listed or "[]"):
        if entry.get("names"):
            continue  # a named image, never a cache entry
        done = subprocess.run(
            ["buildah", "inspect", "--type", "image", entry["id"]],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            continue
        history = json.loads(done.stdout).get("History") or [{}]
        created_by = _words(history[-1].get("created_by", ""))
        if any(created_by.endswith(step) for step in steps):
            removal = subprocess.run(
                ["buildah", "rmi", entry["id"]], capture_output=True, timeout=120, check=False
            )
            if removal.returncode == 0:
                removed.append(entry["id"])
    with log.open("a") as out:
        out.write(
            f"\nforgot the cached steps buildah 1.28 gets wrong: {' '.join(removed) or 'none'}\n"
        )
    return removed


def build(archive: Path, *, log: Path, name: str = IMAGE) -> Path:
    """Build the image from the Dockerfile on the Debian base (both cached
    in buildah's storage) and write it to archive as an OCI image archive
    whose one image `ctr images import` names `name`. Every command and its
    output is appended to log. Raises ImageBuildError."""
    why = unavailable()
    if why is not None:
        raise ImageBuildError(why)
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    base_image = base(log=log)
    settings, ca = _pip_settings(os.environ)
    forget_stale_steps(log)
    with tempfile.TemporaryDirectory(prefix="powerdev-image-") as tmp:
        pip_dir = None
        if settings or ca is not None:
            pip_dir = Path(tmp) / "pip"
            pip_dir.mkdir(mode=0o755)
            lines = ["[global]", *(f"{key} = {value}" for key, value in settings.items())]
            if ca is not None:
                shutil.copyfile(ca, pip_dir / "ca.crt")
                lines.append(f"cert = {PIP_DIR}/ca.crt")
            (pip_dir / "pip.conf").write_text("\n".join(lines) + "\n")
        _run(
            build_command(base_image, pip_dir, name),
            log,
            BUILD_TIMEOUT,
            f"buildah build of {DOCKERFILE}",
            cwd=ROOT,
        )
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    partial.unlink(missing_ok=True)
    # The reference after the path is the index's org.opencontainers.image.ref.name,
    # which ctr keeps as the image's name when it is a full reference.
    _run(
        ["buildah", "push", "--quiet", name, f"oci-archive:{partial}:{name}"],
        log,
        600,
        f"buildah push of {name} to {partial}",
    )
    partial.replace(archive)
    with log.open("a") as out:
        out.write(f"\n{name}: {archive} in {time.monotonic() - started:.1f} s\n")
    return archive


def main(argv: Sequence[str] | None = None) -> int:
    """python -m powerdev.devtools.cluster.image ARCHIVE [--log LOG]"""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m powerdev.devtools.cluster.image",
        description=f"Build {IMAGE} from the Dockerfile on a base of Debian's packages "
        "and write it as an OCI image archive.",
    )
    parser.add_argument("archive", type=Path, help="the OCI image archive to write")
    parser.add_argument(
        "--log", type=Path, help="where the commands' output goes (default: ARCHIVE.log)"
    )
    args = parser.parse_args(argv)
    log = args.log or args.archive.with_name(args.archive.name + ".log")
    try:
        build(args.archive, log=log)
    except ImageBuildError as error:
        print(f"image: {error}", file=sys.stderr)
        return 1
    print(f"{IMAGE}: {args.archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
