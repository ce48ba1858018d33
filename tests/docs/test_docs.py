"""The docs check themselves: every fenced block in README.md and docs/ says
what it is; the commands that can run here run, in made-up trees; every
sample output is what the code prints; the config and kustomize snippets
are accepted by what reads them; every link resolves.

POWERDEV_DOCS_UPDATE=1 rewrites the sample outputs from what the code
prints (review the diff), instead of failing on a difference."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from powerdev.devtools import kit
from tests.conftest import require_tool
from tests.docs.markdown import ROOT, Block, anchors, blocks, links, pages
from tests.docs.trees import TREES

UPDATE = os.environ.get("POWERDEV_DOCS_UPDATE") == "1"
LIMIT = 60  # seconds any one command may take
SHELL = {"sh", "bash", "console"}
BIN = str(Path(sys.executable).parent)  # powerdev, as installed with the test extras

ALL = [b for page in pages() for b in blocks(page)]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --- every block is marked ------------------------------------------------


def test_there_are_docs_to_check():
    kinds = {b.kind for b in ALL}
    assert {"run", "output", "output of", "file", "config", "render", "not run"} <= kinds


@pytest.mark.parametrize("page", pages(), ids=rel)
def test_every_block_says_what_it_is(page):
    unmarked = [b.where for b in blocks(page) if b.kind is None]
    assert not unmarked, f"blocks with no <!-- run, not run: REASON, ... --> before: {unmarked}"
    for b in blocks(page):
        if b.kind == "not run":
            assert b.value, f"{b.where}: say why it cannot run here"
        if b.kind == "run":
            assert b.lang in SHELL and b.value in TREES, b.where
        if b.lang in SHELL:
            assert b.kind in ("run", "not run"), f"{b.where}: a shell block is run or not run"
        if b.kind in ("output", "output of"):
            assert b.lang == "text", b.where


def test_one_way_to_render():
    """kubectl and oc apply -k; never a kustomize binary piped into apply -f."""
    for page in pages():
        text = page.read_text()
        assert not re.search(r"kustomize build \S", text), rel(page)
        assert not re.search(r"\|\s*(oc|kubectl) (apply|delete) -f -", text), rel(page)


# --- links ------------------------------------------------------------------


@pytest.mark.parametrize("page", pages(), ids=rel)
def test_every_link_resolves(page):
    for link in links(page):
        if re.match(r"[a-z]+:", link):
            continue  # http(s), mailto: not ours to check here
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        assert path.exists(), f"{rel(page)}: {link}: no such file"
        if anchor:
            assert path.suffix == ".md", f"{rel(page)}: {link}"
            assert anchor in anchors(path), f"{rel(page)}: {link}: no such heading"


def test_every_page_is_reached_from_the_readme():
    reached, todo = set(), [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        if page in reached or not page.exists():
            continue
        reached.add(page)
        for link in links(page):
            target = link.partition("#")[0]
            if target.endswith(".md") and not re.match(r"[a-z]+:", target):
                todo.append((page.parent / target).resolve())
    assert set(pages()) <= reached, sorted(rel(p) for p in set(pages()) - reached)


def test_python_modules_named_by_the_docs_exist():
    """`python -m X` in a page names a module that is there (the code moves)."""
    for page in pages():
        for module in re.findall(r"python3? -m ((?:powerdev|tests)[\w.]*)", page.read_text()):
            assert importlib.util.find_spec(module) is not None, f"{rel(page)}: {module}"


# --- commands and their output ---------------------------------------------


def normalise(text: str, tree: Path | None = None) -> str:
    if tree is not None:
        text = text.replace(str(tree), "")
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d", "TIME", text)
    text = re.sub(r"\S*/powerdev-local-[^/\s]+", "/tmp/powerdev-local-TMP", text)
    text = re.sub(r"\[::\]:\d+", "[::]:PORT", text)
    return text


def shown(text: str, tree: Path | None = None) -> str:
    """What a sample shows for an output: the temp tree gone, the port the
    DaemonSet uses."""
    if tree is not None:
        text = text.replace(str(tree), "")
    text = re.sub(r"\[::\]:\d+", "[::]:8080", text)
    return re.sub(r"\S*/powerdev-local-[^/\s]+", "/tmp/powerdev-local-k3x9q2vd", text)


def commands(text: str) -> list[str]:
    """The block's commands: one a line, `\\` continuing."""
    joined = re.sub(r"\\\n", " ", text)
    return [line for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def environment() -> dict[str, str]:
    """The pages' commands find powerdev (this venv's) and kubectl (the
    conformance kit's, when built) first."""
    env = dict(os.environ)
    kubectl = kit.find("kubectl", env)
    tools = [BIN] + ([str(kubectl.parent)] if kubectl is not None else [])
    env["PATH"] = os.pathsep.join([*tools, env.get("PATH", "")])
    for name in list(env):
        if name.startswith("POWERDEV_"):
            del env[name]  # the page's command says everything it needs
    env.pop("CI", None)
    env["COLUMNS"] = "80"  # argparse's help wraps at the terminal's width
    return env


def run(command: str, cwd: Path, options: dict[str, str]) -> str:
    """Run one command with bash in cwd; return what it printed."""
    command = command.removeprefix(".venv/bin/")
    expected = int(options.get("exit", "0"))
    if "until" not in options and "lines" not in options:
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=cwd,
            env=environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=LIMIT,
            check=False,
        )
        assert done.returncode == expected, (command, done.returncode, done.stdout)
        return done.stdout
    # A command that runs until stopped: read up to a line, then SIGINT.
    stream = options.get("stream", "stdout")
    process = subprocess.Popen(
        ["bash", "-c", "exec " + command],
        cwd=cwd,
        env=environment(),
        stdout=subprocess.PIPE if stream == "stdout" else subprocess.DEVNULL,
        stderr=subprocess.PIPE if stream == "stderr" else subprocess.DEVNULL,
        text=True,
    )
    pipe = process.stdout if stream == "stdout" else process.stderr
    assert pipe is not None
    watchdog = threading.Timer(LIMIT, process.kill)
    watchdog.start()
    lines: list[str] = []
    try:
        for line in pipe:
            lines.append(line)
            if "until" in options and options["until"] in line:
                break
            if "lines" in options and len(lines) == int(options["lines"]):
                break
        else:
            pytest.fail(f"{command}: ended before it printed what was awaited: {''.join(lines)}")
        process.send_signal(signal.SIGINT)
        pipe.read()
        assert process.wait() == expected, command
    finally:
        watchdog.cancel()
        process.kill()
        process.wait()
        pipe.close()
    return "".join(lines)


def sessions() -> list[tuple[Path, str]]:
    """(page, tree) pairs: each tree's files, commands and samples on a page
    form one session."""
    found = []
    for page in pages():
        for b in blocks(page):
            tree = b.options.get("tree") if b.kind in ("file", "output of") else None
            tree = b.value if b.kind == "run" else tree
            if tree and (page, tree) not in found:
                found.append((page, tree))
    return found


class Rewrites:
    """Sample blocks to rewrite, in POWERDEV_DOCS_UPDATE mode."""

    def __init__(self) -> None:
        self.new: dict[tuple[Path, int], str] = {}

    def check(self, block: Block, printed: str, tree: Path) -> None:
        if UPDATE:
            self.new[(block.page, block.line)] = shown(printed, tree)
            return
        assert normalise(block.text) == normalise(printed, tree), (
            f"{block.where}: the sample differs from what the code prints "
            f"(POWERDEV_DOCS_UPDATE=1 rewrites it):\n{shown(printed, tree)}"
        )

    def write(self, page: Path) -> None:
        lines = page.read_text().splitlines(keepends=True)
        for b in sorted(blocks(page), key=lambda b: -b.line):
            if (page, b.line) in self.new:
                lines[b.line : b.end - 1] = [self.new[(page, b.line)]]
        page.write_text("".join(lines))


@pytest.mark.parametrize(
    ("page", "tree_name"), sessions(), ids=[f"{rel(p)}-{t}" for p, t in sessions()]
)
def test_commands_run_and_print_what_the_page_shows(page, tree_name, tmp_path):
    tree = tmp_path / tree_name
    tree.mkdir()
    TREES[tree_name](tree)
    rewrites = Rewrites()
    printed: str | None = None
    for b in blocks(page):
        mine = (b.kind == "run" and b.value == tree_name) or b.options.get("tree") == tree_name
        if b.kind == "output" and printed is not None:
            rewrites.check(b, printed, tree)
            printed = None
            continue
        printed = None
        if not mine:
            continue
        if b.kind == "file":
            if b.lang == "json":
                json.loads(b.text)
            (tree / b.value).write_text(b.text)
        elif b.kind == "run":
            printed = "".join(run(c, tree, b.options) for c in commands(b.text))
        elif b.kind == "output of":
            command = b.value.replace("{tree}", shlex.quote(str(tree)))
            rewrites.check(b, run(command, tree, b.options), tree)
    if UPDATE:
        rewrites.write(page)


def test_every_sample_follows_a_command():
    for page in pages():
        previous = None
        for b in blocks(page):
            if b.kind == "output":
                assert previous is not None and previous.kind == "run", b.where
            previous = b


# --- snippets ----------------------------------------------------------------

CONFIGS = [b for b in ALL if b.kind == "config"]
RENDERS = [b for b in ALL if b.kind == "render"]


@pytest.mark.parametrize("block", CONFIGS, ids=[b.where for b in CONFIGS])
def test_config_examples_are_accepted(block, tmp_path):
    TREES["empty"](tmp_path)
    (tmp_path / "config.json").write_text(block.text)
    scan = "powerdev scan --config config.json --dev-root dev --sys-root sys"
    run(f"{scan} --host-mountinfo mountinfo", tmp_path, {})


@pytest.mark.parametrize("block", RENDERS, ids=[b.where for b in RENDERS])
def test_kustomize_snippets_render(block, tmp_path):
    """The snippet, merged into a copy of the kustomization it names, renders;
    an image set in the base reaches the DaemonSet."""
    require_tool(kit.TOOLS["kubectl"])  # the kit's: skips without it, fails in CI
    TREES["repo"](tmp_path)
    kustomization = tmp_path / block.value / "kustomization.yaml"
    doc = yaml.safe_load(kustomization.read_text())
    snippet = yaml.safe_load(block.text)
    doc.update(snippet)
    kustomization.write_text(yaml.safe_dump(doc))
    rendered = run(f"kubectl kustomize {block.value}", tmp_path, {})
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    assert docs, block.where
    overlay = "deploy" if block.value == "deploy/base" else block.value
    for image in snippet.get("images", []):
        shown_image = f"{image['newName']}:{image['newTag']}"
        daemonset = run(f"kubectl kustomize {overlay}", tmp_path, {})
        assert f"image: {shown_image}" in daemonset, block.where
