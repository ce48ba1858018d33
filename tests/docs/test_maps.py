"""The docs' maps stay true, and their words are for a reader: docs/design.md
names every module of powerdev/, docs/development.md every test directory,
every wheel check every platform the image is built for; no page and no
--help says "seed", and no page speaks of the machine it was written on."""

from __future__ import annotations

import argparse
import re

import pytest

from powerdev import cli
from tests.docs.markdown import ROOT, blocks, pages

PACKAGE = ROOT / "powerdev"


def design_map() -> set[str]:
    """The paths (under powerdev/) the map in "Where the code lives" names:
    a tree, two spaces a level, a directory's name ending in /."""
    design = ROOT / "docs" / "design.md"
    (picture,) = [
        b for b in blocks(design) if b.text.startswith("powerdev/\n")
    ]  # the one tree of the package
    named: set[str] = set()
    parents: list[str] = []
    for line in picture.text.splitlines()[1:]:
        depth = (len(line) - len(line.lstrip(" "))) // 2
        name = line.split()[0]
        del parents[depth - 1 :]
        path = "/".join([*parents, name.rstrip("/")])
        if name.endswith("/"):
            parents.append(name.rstrip("/"))
        named.add(path)
    return named


def modules() -> set[str]:
    """Every module of powerdev/ but the generated code and the packages' own
    __init__.py (the map's line for a package stands for it)."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] == "_proto" or relative.name == "__init__.py":
            continue
        found.add(str(relative))
    return found


def packages() -> set[str]:
    return {
        str(p.parent.relative_to(PACKAGE))
        for p in PACKAGE.rglob("__init__.py")
        if p.parent != PACKAGE and "_proto" not in p.relative_to(PACKAGE).parts[:1]
    } | {"_proto"}


def test_the_design_map_names_every_module_and_package_and_nothing_else():
    named = design_map()
    assert modules() - named == set(), "modules docs/design.md's map leaves out"
    assert packages() - named == set(), "packages docs/design.md's map leaves out"
    assert named - modules() - packages() == set(), "on the map, but not in powerdev/"


def test_the_map_reader_finds_a_module_left_out(monkeypatch):
    """The check above can fail: a map without daemon/pods.py lacks it."""
    design = ROOT / "docs" / "design.md"
    text = design.read_text()
    assert "    pods.py " in text
    real = blocks

    def without_pods(page):
        found = real(page)
        for block in found:
            block.text = block.text.replace("    pods.py ", "    xpods.py ")
        return found

    monkeypatch.setattr(f"{__name__}.blocks", without_pods)
    assert "daemon/pods.py" in modules() - design_map()


def test_the_test_table_names_every_test_directory():
    text = (ROOT / "docs" / "development.md").read_text()
    section = text[text.index("## The tests") :]
    section = section[: section.index("\n## ")]
    named = set(re.findall(r"`(tests/\w+)/`", section))
    dirs = {f"tests/{p.name}" for p in (ROOT / "tests").iterdir() if (p / "__init__.py").exists()}
    assert dirs - named == set(), "test directories docs/development.md's table leaves out"
    assert named - dirs == set(), "in the table, but not in tests/"


# What the image's platforms are called in a wheel's platform tag.
WHEEL_ARCH = {"linux/amd64": "x86_64", "linux/arm64": "aarch64",
              "linux/ppc64le": "ppc64le", "linux/s390x": "s390x"}  # fmt: skip


def test_every_wheel_check_in_the_docs_checks_every_platform_of_the_image():
    from tests.deploy.test_release import PLATFORMS

    expected = [WHEEL_ARCH[p] for p in PLATFORMS]
    loops = []
    for page in pages():
        for block in blocks(page):
            for arches in re.findall(r"^for arch in ([\w ]+); do$", block.text, re.M):
                loops.append(page.name)
                assert arches.split() == expected, f"{page.name}: for arch in {arches}"
    assert loops, "no wheel check found in the docs"


def help_texts() -> dict[str, str]:
    parser = cli.build_parser()
    (group,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    texts = {"powerdev": parser.format_help()}
    for name, sub in group.choices.items():
        texts[f"powerdev {name}"] = sub.format_help()
    return texts


def test_no_help_says_seed():
    """A user was never told what "the seed" is: IBM's plugin is its name."""
    for command, text in help_texts().items():
        assert not re.search(r"\bseed", text, re.I), f"{command} --help: {text}"


# Words that speak of where the docs were written, or of a project's own
# aims, instead of what a figure means for whoever reads it.
NOT_FOR_A_READER = [
    r"\bseed\b",
    r"\bseed's\b",
    r"where this was written",
    r"not tried here",
    r"did not run here",
    r"\bmeasured here\b",
    r"\bthis machine\b",
    r"\(missed\)",
    r"\btargets? (is|are|stay) missed\b",
    r"\bthrowaway\b",
]


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_no_page_speaks_of_the_machine_it_was_written_on(page):
    text = page.read_text()
    found = [w for w in NOT_FOR_A_READER if re.search(w, text, re.I)]
    assert not found, f"{page.relative_to(ROOT)}: {found}"


def test_the_options_table_lists_every_option_of_run_with_its_variable():
    """configuration.md's "Options of `powerdev run`": a row per option,
    named with the environment variable the parser reads."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text[text.index("## Options of `powerdev run`") :]
    section = section[: section.index("\n## ")]
    rows = dict(re.findall(r"^\| `(--[\w-]+)` \| `(\w+)` \|", section, re.M))
    parser = cli.build_parser()
    (group,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    run = group.choices["run"]
    listed = {a.option_strings[-1]: a for a in run._actions if a.dest != "help"}
    assert set(listed) - set(rows) == set(), "options of run the table leaves out"
    assert set(rows) - set(listed) == set(), "in the table, but not an option of run"
    for flag, variable in rows.items():
        assert f"[env {variable};" in (listed[flag].help or "") or (
            f"[env {variable}," in (listed[flag].help or "")
        ), f"{flag}: the table says {variable}, its help says otherwise"
