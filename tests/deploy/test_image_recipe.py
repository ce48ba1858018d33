"""The Dockerfile's build recipe, run without Docker (this machine has no
engine): its build-stage RUN commands, read from the Dockerfile, make the
wheels at the versions constraints.txt pins, and its install, from those
wheels alone, gives a working `powerdev` with no test extras."""

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned() -> dict[str, str]:
    """constraints.txt: canonical name -> version."""
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not pinned with =="
            pins[canonical(name)] = version
    return pins


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
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    for instruction in build:
        verb, _, rest = instruction.partition(" ")
        if verb == "ENV":
            name, _, value = rest.partition("=")
            env[name] = value.replace("/src/", f"{src}/")
        elif verb == "COPY":
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
                env=env,
            )
            assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    assert env["PIP_CONSTRAINT"] == str(src / "constraints.txt")
    names = sorted(p.name for p in wheels.glob("*.whl"))
    assert any(n.startswith("powerdev-") for n in names)
    assert not any(n.startswith(("pytest", "hypothesis", "ruff")) for n in names)
    # Exactly the pinned versions, and a pin for every wheel the image gets.
    built = {canonical(n.split("-")[0]): n.split("-")[1] for n in names}
    built.pop("powerdev")
    pins = pinned()
    assert {name: pins.get(name) for name in built} == built

    (install,) = [i for i in final if i.startswith("RUN ") and "pip install" in i]
    mount, command = install.removeprefix("RUN ").split(" ", 1)
    assert mount == "--mount=type=bind,from=build,source=/wheels,target=/wheels"
    assert "--no-index" in command  # nothing fetched in the final stage
    venv = tmp_path / "image"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    command = command.split("&&")[0].replace("/wheels", str(wheels))
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
        [
            str(venv / "bin" / "python"),
            "-c",
            "import powerdev.daemon.supervisor, powerdev.ops.health, pyudev",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert imports.returncode == 0, imports.stderr


def test_constraints_pin_every_runtime_dependency_within_pyproject_ranges():
    """Each dependency named in pyproject.toml is pinned, at a version its
    range allows (so the image is what `pip install .` would give)."""
    from packaging.requirements import Requirement

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = pinned()
    for text in pyproject["project"]["dependencies"]:
        requirement = Requirement(text)
        name = canonical(requirement.name)
        assert name in pins, f"constraints.txt has no pin for {requirement.name}"
        assert requirement.specifier.contains(pins[name], prereleases=True), (text, pins[name])
    backend = Requirement(pyproject["build-system"]["requires"][0])
    assert backend.specifier.contains(pins[canonical(backend.name)])


def test_the_final_stage_fetches_nothing_and_keeps_no_wheels():
    build, final = stages((ROOT / "Dockerfile").read_text())
    assert not any("apt-get" in i for i in build + final)  # libudev1 comes with the base
    assert not any(i.startswith("COPY") for i in final)  # wheels are mounted, not a layer
    assert any(i.startswith("ENV PIP_CONSTRAINT=") for i in build)
    text = (ROOT / "Dockerfile").read_text()
    assert text.startswith("# syntax=docker/dockerfile:1\n")  # RUN --mount
    for path in re.findall(r"\b(deploy/[\w./-]+\.yaml)", text):
        assert (ROOT / path).exists(), f"the Dockerfile names {path}, which does not exist"
