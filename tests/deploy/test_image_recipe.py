"""The Dockerfile's build recipe, run without Docker (this machine has no
engine): its build-stage RUN commands, read from the Dockerfile, make the
wheels, and its install gives a working `powerdev` with no test extras."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def stages(text: str) -> list[list[str]]:
    """The instructions of each stage, with continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    result: list[list[str]] = []
    for line in joined.splitlines():
        line = line.strip()
        if line.startswith("FROM "):
            result.append([])
        elif result and line and not line.startswith("#"):
            result[-1].append(line)
    return result


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_build_stage_makes_wheels_and_they_install_and_run(tmp_path):
    build, final = stages((ROOT / "Dockerfile").read_text())
    wheels = tmp_path / "wheels"
    src = tmp_path / "src"
    src.mkdir()
    bin_dir = str(Path(sys.executable).parent)
    for instruction in build:
        verb, _, rest = instruction.partition(" ")
        if verb == "COPY":
            *sources, _ = rest.split()
            for source in sources:
                target = src / source
                if (ROOT / source).is_dir():
                    shutil.copytree(  # COPY merges into what is there, as here
                        ROOT / source,
                        target,
                        dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"),
                    )
                else:
                    shutil.copy(ROOT / source, target)
        elif verb == "RUN":
            command = rest.replace("/wheels", str(wheels))
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=src,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
                env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
            )
            assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    names = sorted(p.name for p in wheels.glob("*.whl"))
    assert any(n.startswith("powerdev-") for n in names)
    assert any(n.startswith("betterproto-2.0.0b7") for n in names)
    assert not any(n.startswith(("pytest", "hypothesis", "ruff")) for n in names)

    (install,) = [i for i in final if i.startswith("RUN pip install")]
    venv = tmp_path / "image"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    command = install.removeprefix("RUN ").split("&&")[0].replace("/wheels", str(wheels))
    done = subprocess.run(
        ["bash", "-c", command],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={"PATH": f"{venv / 'bin'}:/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    (entrypoint,) = [i for i in final if i.startswith("ENTRYPOINT")]
    assert entrypoint == 'ENTRYPOINT ["powerdev", "run"]'
    version = subprocess.run(
        [str(venv / "bin" / "powerdev"), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert version.stdout.strip() == "powerdev 0.1.0", version.stderr[-2000:]
    imports = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import powerdev.app, powerdev.health, pyudev"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert imports.returncode == 0, imports.stderr
