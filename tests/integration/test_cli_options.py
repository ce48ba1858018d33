"""The command line's options say what they do: `scan --help` lists only
options scan reads, every option that is a time names its unit, and a wait
that cannot be waited is refused where it is given."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from powerdev import cli
from tests.conftest import make_dev_tree


def subparsers() -> dict[str, argparse.ArgumentParser]:
    (group,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(group.choices)


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


class Reads(argparse.Namespace):
    """A namespace that notes each option a command reads from it."""

    def __init__(self) -> None:
        object.__setattr__(self, "_read", set())

    def __getattribute__(self, name: str):
        if not name.startswith("_"):
            object.__getattribute__(self, "_read").add(name)
        return object.__getattribute__(self, name)


def test_scan_lists_only_the_options_it_reads(tmp_path, monkeypatch, capsys):
    make_dev_tree(tmp_path / "dev", ["acc0"])
    (tmp_path / "config.json").write_text('{"include-devices": ["/dev/acc*"]}')
    (tmp_path / "mountinfo").write_text("")
    namespace = Reads()
    real = cli.build_parser

    def parser() -> argparse.ArgumentParser:
        built = real()
        parse = built.parse_args

        def parse_args(argv):
            parse(argv, namespace)
            namespace._read.clear()  # argparse's own look at every default
            return namespace

        built.parse_args = parse_args  # type: ignore[method-assign]
        return built

    monkeypatch.setattr(cli, "build_parser", parser)
    argv = ["scan", "--config", str(tmp_path / "config.json"), "--dev-root", str(tmp_path / "dev"),
            "--sys-root", str(tmp_path / "sys"), "--host-mountinfo", str(tmp_path / "mountinfo"),
            "--plugin-dir", str(tmp_path / "dp")]  # fmt: skip
    assert cli.main(argv) == 0
    assert "/dev/acc0" in capsys.readouterr().out
    listed = {a.dest for a in options(subparsers()["scan"])}
    assert listed - namespace._read == set(), "listed by scan --help, never read by scan"


@pytest.mark.parametrize("command", sorted(subparsers()))
def test_every_option_that_is_a_time_names_its_unit(command):
    """In its name (--drain-seconds) or in its help, and as its metavar
    in the usage line when the name does not say it."""
    for action in options(subparsers()[command]):
        flag = action.option_strings[-1]
        timed = getattr(action.type, "__name__", "") == "seconds" or any(
            word in flag for word in ("interval", "timeout", "seconds", "delay", "period")
        )
        if not timed or flag.endswith("-seconds"):
            continue
        assert "seconds" in (action.help or ""), f"powerdev {command} {flag}: no unit in its help"
        assert action.metavar == "SECONDS", f"powerdev {command} {flag}: metavar {action.metavar}"


def health(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "powerdev", "health", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("timeout", ["-1", "0", "-0.5", "nan", "inf", "soon", "3601"])
def test_health_refuses_a_timeout_that_is_not_a_positive_number_of_seconds(tmp_path, timeout):
    done = health("--status-file", str(tmp_path / "status.json"), "--timeout", timeout)
    assert done.returncode == 2
    assert done.stderr == (
        f"powerdev health: error: argument --timeout: {timeout!r} is not a number of seconds "
        "above 0 and up to 3600 (see powerdev health --help)\n"
    )


def test_health_takes_a_positive_timeout(tmp_path):
    """Exit 1 (no daemon's status file), not 2: the value was taken."""
    done = health("--status-file", str(tmp_path / "status.json"), "--timeout", "0.5")
    assert done.returncode == 1, done.stderr
    assert "no status in" in done.stdout + done.stderr
