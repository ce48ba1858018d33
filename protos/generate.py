"""Regenerate powerdev/_proto from the .proto files in protos/.

Two outputs from each .proto: betterproto's classes and grpclib service
bases, in a package named after the proto package (powerdev/_proto/v1beta1/,
powerdev/_proto/k8s/io/kubelet/pkg/apis/dra/v1/), and protobuf's own module,
named after the file (powerdev/_proto/api_pb2.py), whose C (upb) encoder
builds the large replies. So no two .proto files may have the same name.

    python protos/generate.py           write the generated code
    python protos/generate.py --check   exit 1 when the committed code is stale

Needs the test extras (grpcio-tools, betterproto[compiler], pinned black and
isort), so that the same input always gives the same bytes.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROTOS = Path(__file__).resolve().parent
OUTPUT = PROTOS.parent / "powerdev" / "_proto"
SOURCES = sorted(p.relative_to(PROTOS).as_posix() for p in PROTOS.rglob("*.proto"))


def generate(dest: Path) -> None:
    """Run protoc with the betterproto plugin and protobuf's Python output."""
    names = [Path(source).name for source in SOURCES]
    if twice := sorted({name for name in names if names.count(name) > 1}):
        sys.exit(
            f"two .proto files named {', '.join(twice)} under {PROTOS}: "
            "their _pb2 modules would overwrite each other; rename one"
        )
    (dest / "pb").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTOS}",
            f"--python_betterproto_out={dest}",
            f"--python_out={dest / 'pb'}",
            *SOURCES,
        ],
        env=env,
        cwd=PROTOS,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        sys.exit(f"protoc failed:\n{done.stderr}")
    # protoc mirrors the .proto's path; one flat module is all powerdev imports.
    for made in sorted((dest / "pb").rglob("*_pb2.py")):
        made.rename(dest / made.name)
    shutil.rmtree(dest / "pb")


def stale_files(fresh: Path, committed: Path) -> list[str]:
    """Names of the files that differ between two generated trees."""
    names = {p.relative_to(fresh) for p in fresh.rglob("*.py")}
    names |= {p.relative_to(committed) for p in committed.rglob("*.py")}
    return sorted(
        str(n)
        for n in names
        if not (fresh / n).exists()
        or not (committed / n).exists()
        or not filecmp.cmp(fresh / n, committed / n, shallow=False)
    )


def main(argv: list[str]) -> int:
    if argv not in ([], ["--check"]):
        print(__doc__, file=sys.stderr)
        return 2
    if argv == ["--check"]:
        with tempfile.TemporaryDirectory() as tmp:
            generate(Path(tmp))
            stale = stale_files(Path(tmp), OUTPUT)
        if stale:
            print(
                f"stale generated code in {OUTPUT}: {', '.join(stale)}; "
                "run `python protos/generate.py` and commit the result",
                file=sys.stderr,
            )
            return 1
        return 0
    OUTPUT.mkdir(parents=True, exist_ok=True)
    generate(OUTPUT)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
