"""The README's test command is what CI runs: .ci/run's last line is it."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    """The one-line commands in the README's "The two commands" section."""
    section = ROOT.joinpath("README.md").read_text().split("## The two commands", 1)[1]
    section = section.split("\n## ", 1)[0]
    blocks = section.split("```sh\n")[1:]
    return [block.split("\n```", 1)[0].strip() for block in blocks]


def test_ci_runs_the_readme_test_command():
    run_locally, run_tests = readme_commands()
    assert run_locally.endswith("powerdev local")
    ci = ROOT.joinpath(".ci", "run").read_text().strip().splitlines()
    assert ci[-1] == run_tests
    assert run_tests.startswith("bash conformance/build && ")
