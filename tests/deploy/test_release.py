"""The release path kept in step with itself: the workflows in
.github/workflows/, the Dockerfile's header, the manifests' image,
pyproject.toml's version and docs/image.md say the same platforms, image,
tag and test command. Plain file reading, plus the conformance kit's
actionlint and kubectl where a test needs the real tool."""

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from powerdev.devtools.kit import TOOLS, KitBinary
from tests.conftest import require_tool

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
PLATFORMS = ["linux/amd64", "linux/arm64", "linux/ppc64le", "linux/s390x"]
ACTIONLINT = KitBinary("actionlint", "POWERDEV_ACTIONLINT", "actionlint (the workflow checker)")
# An action pinned to a major version (v6) or to a commit; never a branch,
# a moving minor, or nothing.
PINNED = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@(v\d+|[0-9a-f]{40})$")


def workflow(name: str) -> dict:
    doc = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the key `on` as True; GitHub reads it as "on".
    doc["on"] = doc.pop(True, doc.get("on"))
    return doc


def steps(doc: dict) -> list[dict]:
    return [step for job in doc["jobs"].values() for step in job.get("steps", [])]


def step_using(doc: dict, action: str) -> dict:
    (step,) = [s for s in steps(doc) if s.get("uses", "").startswith(f"{action}@")]
    return step


def base_image() -> dict:
    doc = yaml.safe_load((ROOT / "deploy" / "base" / "kustomization.yaml").read_text())
    (image,) = doc["images"]
    return image


def project_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def dockerfile_base() -> str:
    """The base image the Dockerfile names by default (ARG PYTHON_IMAGE)."""
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M)
    return base


def docs_build_command() -> str:
    (command,) = [
        line
        for line in (ROOT / "docs" / "image.md").read_text().splitlines()
        if line.startswith("docker buildx build ")
    ]
    return command


def test_the_workflows_parse_and_pin_every_action():
    names = sorted(p.name for p in WORKFLOWS.iterdir())
    assert names == ["ci.yml", "release.yml"]
    for name in names:
        doc = workflow(name)
        assert doc["on"], name
        assert doc["permissions"] == {"contents": "read"}, name  # nothing more by default
        for job_name, job in doc["jobs"].items():
            uses = (
                [job["uses"]] if "uses" in job else [s["uses"] for s in job["steps"] if "uses" in s]
            )
            for ref in uses:
                if ref.startswith("./"):  # a workflow of this repository, at this commit
                    assert (ROOT / ref).is_file(), (name, job_name, ref)
                else:
                    assert PINNED.match(ref), f"{name}: {job_name}: {ref} is not pinned"


def test_the_platforms_agree_everywhere():
    """release.yml builds, the Dockerfile's header names and docs/image.md's
    one command builds exactly the four platforms."""
    built = step_using(workflow("release.yml"), "docker/build-push-action")["with"]["platforms"]
    assert built.split(",") == PLATFORMS
    header = (ROOT / "Dockerfile").read_text().splitlines()[1]
    assert header.startswith("# powerdev: the device plugin image, for ")
    assert re.findall(r"linux/\w+", header) == PLATFORMS
    (example,) = re.findall(r"--platform (\S+)", (ROOT / "Dockerfile").read_text())
    assert example.split(",") == PLATFORMS
    (documented,) = re.findall(r"--platform (\S+)", docs_build_command())
    assert documented.split(",") == PLATFORMS


def test_the_documented_command_builds_pushes_and_attests():
    words = docs_build_command().split()
    assert words[-1] == "."  # the checkout's top, where the Dockerfile is
    assert "--sbom=true" in words and "--push" in words
    assert "--provenance=mode=max" in words  # what the release attaches too
    tag = words[words.index("-t") + 1]
    assert tag.rpartition(":")[0].endswith("/powerdev")


def test_the_release_pushes_the_image_the_manifests_name_at_the_projects_version():
    release = workflow("release.yml")
    meta = step_using(release, "docker/metadata-action")
    assert meta["with"]["images"] == base_image()["newName"] == "quay.io/powercloud/powerdev"
    # One tag, the checked version (no "latest": the manifests name a version).
    assert meta["with"]["tags"] == "type=raw,value=${{ needs.version.outputs.version }}"
    assert meta["with"]["flavor"] == "latest=false"
    assert base_image()["newTag"] == project_version()
    build = step_using(release, "docker/build-push-action")["with"]
    assert build["push"] is True and build["sbom"] is True
    assert build["provenance"] == "mode=max"
    assert build["tags"] == f"${{{{ steps.{meta['id']}.outputs.tags }}}}"
    assert build["context"] == "."
    jobs = release["jobs"]
    assert release["on"] == {"push": {"tags": ["v*"]}}
    assert jobs["test"] == {"needs": "version", "uses": "./.github/workflows/ci.yml"}
    assert sorted(jobs["image"]["needs"]) == ["test", "version"]  # tests pass first


def tag_check(tmp_path: Path, tag: str) -> tuple[subprocess.CompletedProcess, str]:
    """release.yml's version step, run as the runner would, for `tag`."""
    (step,) = [s for s in workflow("release.yml")["jobs"]["version"]["steps"] if "run" in s]
    assert step["env"] == {"TAG": "${{ github.ref_name }}"}
    output = tmp_path / "github-output"
    output.write_text("")
    done = subprocess.run(
        ["bash", "-e", "-c", step["run"]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "TAG": tag,
            "GITHUB_OUTPUT": str(output),
        },
    )
    return done, output.read_text()


def test_the_tag_check_takes_the_projects_version_and_refuses_another(tmp_path):
    version = project_version()
    done, output = tag_check(tmp_path, f"v{version}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert output == f"version={version}\n"
    for wrong in (version, f"v{version}.1", "v9.9.9"):
        done, output = tag_check(tmp_path, wrong)
        assert done.returncode == 1 and output == ""
        assert done.stdout.startswith("::error file=pyproject.toml::")
        assert f"the tag is {wrong} but pyproject.toml's version is {version}" in done.stdout


def test_ci_runs_ci_run_as_root_with_the_kits_go_and_caches():
    ci = workflow("ci.yml")
    assert set(ci["on"]) == {"push", "pull_request", "workflow_call"}
    assert ci["on"]["push"] == {"branches": ["**"]}  # tags: release.yml calls ci.yml
    runs = [s["run"] for s in steps(ci) if "run" in s]
    assert runs == [
        'sudo -E env "PATH=$PATH" "GOCACHE=$(go env GOCACHE)" "GOMODCACHE=$(go env GOMODCACHE)"'
        " bash .ci/run"
    ]
    # .ci/run is the README's test command from a fresh clone; CI runs nothing else.
    last = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert last.startswith("bash conformance/build && ") and "python -m pytest" in last
    go = step_using(ci, "actions/setup-go")["with"]
    assert go["go-version-file"] == "conformance/go.mod"
    # The cache key covers every Go module the kit builds.
    sums = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "conformance").rglob("go.sum"))
    assert sorted(go["cache-dependency-path"].split()) == sums
    assert go.get("cache", True) is True
    python = step_using(ci, "actions/setup-python")["with"]["python-version"]
    assert dockerfile_base() == f"python:{python}-slim-bookworm"  # the image's Python


def test_every_secret_the_workflows_use_is_named_in_the_docs():
    used = set()
    for path in WORKFLOWS.iterdir():
        used |= set(re.findall(r"secrets\.(\w+)", path.read_text()))
    assert used == {"QUAY_USERNAME", "QUAY_PASSWORD"}
    docs = (ROOT / "docs" / "image.md").read_text()
    for name in used:
        assert f"| `{name}` |" in docs, name


def test_the_build_context_holds_only_what_the_dockerfile_copies():
    """.dockerignore leaves everything out but what a COPY names, so the
    kit's binaries and a venv never go to the builder."""
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    rules = [line for line in lines if line and not line.startswith("#")]
    assert rules[0] == "*"
    allowed = {rule[1:].rstrip("/") for rule in rules if rule.startswith("!")}
    copied = re.findall(r"^COPY (?!--from)(.+) \S+$", (ROOT / "Dockerfile").read_text(), re.M)
    assert allowed == {source for sources in copied for source in sources.split()}
    assert rules[-1] == "**/__pycache__"  # after the "!" lines, so it wins


def test_the_workflows_pass_actionlint(tmp_path):
    """actionlint checks expressions, job outputs, each pinned action's
    inputs and the `run:` scripts' syntax. Its shellcheck and pyflakes
    passes are off: they depend on what else the machine has installed."""
    actionlint = require_tool(ACTIONLINT)

    def lint(*paths: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(actionlint), "-no-color", "-shellcheck=", "-pyflakes=", *map(str, paths)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    done = lint(*sorted(WORKFLOWS.iterdir()))
    assert done.returncode == 0, done.stdout + done.stderr
    # And it does check: an input build-push-action does not have is caught.
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    broken = tmp_path / ".github" / "workflows" / "release.yml"
    broken.write_text((WORKFLOWS / "release.yml").read_text().replace("sbom: true", "sboms: true"))
    shutil.copy(WORKFLOWS / "ci.yml", broken.parent / "ci.yml")
    done = lint(broken)
    assert done.returncode == 1 and 'input "sboms" is not defined' in done.stdout, done.stdout


def kustomize(kubectl: Path, path: Path) -> list[dict]:
    done = subprocess.run(
        [str(kubectl), "kustomize", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return list(yaml.safe_load_all(done.stdout))


@pytest.mark.parametrize(
    "resource",
    ["../deploy", "../deploy/openshift", "../deploy/webhook", "../deploy/webhook/openshift"],
)
def test_the_documented_overlay_puts_your_image_in_every_workload(tmp_path, resource):
    kubectl = require_tool(TOOLS["kubectl"])
    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / "docs" / "image.md").read_text(), re.S)
    (overlay,) = [b for b in blocks if "resources:" in b]
    doc = yaml.safe_load(overlay)
    assert doc["resources"] == ["../deploy"]
    (image,) = doc["images"]
    assert image["name"] == base_image()["newName"]  # what deploy/base has already set
    assert image["newTag"] in docs_build_command()  # the image the command pushed
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    (tmp_path / "my-powerdev").mkdir()
    (tmp_path / "my-powerdev" / "kustomization.yaml").write_text(
        overlay.replace("  - ../deploy\n", f"  - {resource}\n")
    )
    workloads = [
        d
        for d in kustomize(kubectl, tmp_path / "my-powerdev")
        if d["kind"] in ("DaemonSet", "Deployment")
    ]
    assert len(workloads) == (2 if "webhook" in resource else 1)
    for workload in workloads:
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        assert container["image"] == f"{image['newName']}:{image['newTag']}", workload["kind"]


def test_the_kit_builds_actionlint_at_the_pinned_version():
    """conformance/build builds it from its own module, as it does cdicheck."""
    build = (ROOT / "conformance" / "build").read_text()
    assert 'step actionlint "$here/actionlint" github.com/rhysd/actionlint/cmd/actionlint' in build
    gomod = (ROOT / "conformance" / "actionlint" / "go.mod").read_text()
    assert "tool github.com/rhysd/actionlint/cmd/actionlint" in gomod
    assert re.search(r"github\.com/rhysd/actionlint v\d+\.\d+\.\d+ ", gomod)


DIGEST = "sha256:" + "0123456789abcdef" * 4


def pin_step(tmp_path: Path, docker: str, dockerfile: str | None = None):
    """release.yml's base pin, run as the runner would, with a fake `docker`
    (the script `docker` runs as) and the Dockerfile (or another text);
    what it printed, what it wrote to GITHUB_OUTPUT, and docker's arguments."""
    (step,) = [
        s for s in workflow("release.yml")["jobs"]["image"]["steps"] if s.get("id") == "base"
    ]
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "docker").write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {tmp_path}/args\n{docker}\n')
    (fake / "docker").chmod(0o755)
    work = tmp_path / "checkout"
    work.mkdir(exist_ok=True)
    (work / "Dockerfile").write_text(dockerfile or (ROOT / "Dockerfile").read_text())
    output = tmp_path / "github-output"
    output.write_text("")
    (tmp_path / "args").unlink(missing_ok=True)
    done = subprocess.run(
        ["bash", "-e", "-c", step["run"]],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": f"{fake}:/usr/bin:/bin", "GITHUB_OUTPUT": str(output)},
    )
    args = (tmp_path / "args").read_text().splitlines() if (tmp_path / "args").exists() else None
    return done, output.read_text(), args


def test_the_base_is_a_tag_that_gets_rebuilds():
    """A minor tag (python:3.11-slim-bookworm), which moves to each patch
    release and each Debian security rebuild; never an exact patch tag
    (3.11.11 is frozen once 3.11.12 is out) nor a digest, which the release
    adds; and both stages build FROM it, so one build-arg pins both."""
    assert re.fullmatch(r"python:3\.\d+-slim-[a-z]+", dockerfile_base()), dockerfile_base()
    text = (ROOT / "Dockerfile").read_text()
    assert re.findall(r"^FROM (\S+)", text, re.M) == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
    assert text.index("ARG PYTHON_IMAGE=") < text.index("FROM ")  # global: a --build-arg sets it
    docs = (ROOT / "docs" / "image.md").read_text()
    assert f"`{dockerfile_base()}`" in docs
    assert f"PYTHON_IMAGE={dockerfile_base()}@sha256:" in docs


def test_the_release_builds_on_the_base_pinned_by_its_digest(tmp_path):
    done, output, args = pin_step(tmp_path, f"echo {DIGEST}")
    assert done.returncode == 0, done.stdout + done.stderr
    base = dockerfile_base()
    assert args == ["buildx", "imagetools", "inspect", base, "--format", "{{ .Manifest.Digest }}"]
    assert output.splitlines() == [
        f"image={base}@{DIGEST}",
        f"name=docker.io/library/{base}",
        f"digest={DIGEST}",
    ]
    image = workflow("release.yml")["jobs"]["image"]["steps"]
    ids = [s.get("id") for s in image]
    build = step_using(workflow("release.yml"), "docker/build-push-action")
    assert ids.index("base") < image.index(build)
    assert build["with"]["build-args"] == "PYTHON_IMAGE=${{ steps.base.outputs.image }}"
    labels = build["with"]["labels"].splitlines()
    assert labels == [
        "${{ steps.meta.outputs.labels }}",
        "org.opencontainers.image.base.name=${{ steps.base.outputs.name }}",
        "org.opencontainers.image.base.digest=${{ steps.base.outputs.digest }}",
    ]


def test_the_release_stops_when_the_base_has_no_digest_or_is_pinned_already(tmp_path):
    for docker in ("exit 1", "echo", "echo sha256:abc", f"echo {DIGEST}x"):
        done, output, _ = pin_step(tmp_path, docker)
        assert done.returncode != 0 and output == "", docker
        if docker != "exit 1":
            assert done.stdout.startswith("::error file=Dockerfile::the base image "), docker
            assert "has no digest that can be read" in done.stdout
    pinned = (
        (ROOT / "Dockerfile")
        .read_text()
        .replace(
            f"ARG PYTHON_IMAGE={dockerfile_base()}",
            f"ARG PYTHON_IMAGE={dockerfile_base()}@{DIGEST}",
        )
    )
    done, output, args = pin_step(tmp_path, f"echo {DIGEST}", pinned)
    assert done.returncode == 1 and output == "" and args is None
    assert "must name the base by a tag alone" in done.stdout
