"""`powerdev bench --quick` runs end to end; figures are reported, never asserted."""

import json
import os
import subprocess
import sys

import trio

from powerdev.devtools import bench
from powerdev.devtools.kit import DMHARNESS
from powerdev.rpc import asyncio_door
from tests.conftest import needs_root

EVENT_MEASURES = {
    "device event to published list (add and remove)",
    "device event to published list (add)",
    "device event to published list (remove)",
    "device event that changes nothing, to applied",
    "device or mount event to the list at the fake kubelet",
    "mount that touches no listed device: host tables read (CPU)",
    "mount of a listed disk, to published list (Unhealthy)",
    "unmount of a listed disk, to published list",
    "longest Trio step (device events)",
}


def test_quick_bench_reports_every_measure(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "powerdev", "bench", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    measures = {row["measure"] for row in report["rows"]}
    assert {
        "start to first full list",
        "Allocate",
        "RSS",
        "idle CPU over 1 s",
        "kubelet restart to re-registration",
        "each: Allocate (two devices)",
        "each: GetPreferredAllocation (4 of all)",
        "each: RSS",
        "longest Trio step (fake kubelet run)",
    } <= measures
    allocate = next(r for r in report["rows"] if r["measure"] == "Allocate")
    assert allocate["n"] == 20 and allocate["answer_bytes"] > 0
    assert "| measure | devices | result |" in done.stdout
    if os.geteuid() == 0:
        assert EVENT_MEASURES <= measures
    else:
        assert "device events: skipped (needs root" in done.stdout
    if DMHARNESS.find() is not None:  # the kubelet's device manager: powerdev and the floor
        assert {
            "real kubelet: start to capacity",
            "real kubelet, each: steady admission",
            "design floor: start to capacity",
            "design floor, each: steady admission",
        } <= measures


@needs_root
async def test_device_events_are_timed_to_the_published_list_with_the_host_use_rule_on():
    """The synthetic host's host-used disk stays out; every event of every
    cycle is timed, and the longest Trio step meanwhile is reported."""
    results = bench.Results()
    said: list[str] = []
    with trio.fail_after(60):
        async with asyncio_door():
            await bench.measure_device_events(40, bench.QUICK, results, said.append)
    rows = {row["measure"]: row for row in results.rows}
    assert set(rows) == EVENT_MEASURES
    cycles = bench.QUICK.event_cycles
    assert rows["device event to published list (add and remove)"]["n"] == 2 * cycles
    for measure in ("add", "remove"):
        assert rows[f"device event to published list ({measure})"]["n"] == cycles
    assert rows["device event that changes nothing, to applied"]["n"] == cycles
    assert rows["device or mount event to the list at the fake kubelet"]["n"] == 4 * cycles
    for measure in (
        "mount that touches no listed device: host tables read (CPU)",
        "mount of a listed disk, to published list (Unhealthy)",
        "unmount of a listed disk, to published list",
    ):
        assert rows[measure]["n"] == cycles
    step = rows["longest Trio step (device events)"]
    assert step["ms"] > 0 and step["steps"]
    assert all(row["devices"] == 40 for row in results.rows)
    # 40 nodes, of which the host uses five: sda, its three partitions and dm-0
    assert "(35 listed)" in said[0]


def test_quick_probe_cost_reports_exec_and_http_probes(tmp_path):
    out = tmp_path / "probes.json"
    done = subprocess.run(
        [sys.executable, "-m", "powerdev.devtools.probecost", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["exec powerdev health"]["cpu_seconds_per_probe"] > 0
    assert report["exec powerdev health --ready"]["peak_rss_mib"] > 0
    assert "daemon_cpu_seconds_per_probe" in report["httpGet /healthz or /readyz"]
    assert report["GET /metrics"]["bytes"] > 0
    assert "average over the DaemonSet's periods" in done.stdout
    held = report["httpGet /healthz with 200 idle connections held"]
    # One connection of the steps before may still be closing when the
    # baseline is counted (the daemon closes it after its answer's end).
    assert held["max_ms"] > 0 and held["daemon_descriptors_added"] >= 200 - 1


def test_import_cost_names_every_step_with_its_resident_memory():
    from powerdev.devtools import importcost

    done = subprocess.run(
        [sys.executable, "-m", "powerdev.devtools.importcost"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("interpreter") and lines[-1].startswith("powerdev: the daemon")
    # the interpreter, each step, and the floor after the design's packages
    assert len(lines) == 1 + len(importcost.DESIGN) + 1 + len(importcost.CHOSEN)
    mib = {line[:48].strip(): float(line[48:].split()[0]) for line in lines}
    floor = mib[importcost.FLOOR]
    assert mib["interpreter"] < mib["trio"] <= floor < mib["powerdev: the daemon"]


def test_import_cost_measures_the_bare_interpreter_first():
    """Nothing it measures may be imported before its first line: the
    interpreter's figure would then hold trio's memory (it once did)."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, powerdev.devtools.importcost as m; "
            "print(sorted(n for _, n in m.DESIGN + m.CHOSEN if n in sys.modules))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "[]"


def test_benches_run_powerdev_from_bytecode_as_the_image_does():
    import importlib.util
    from pathlib import Path

    import powerdev
    from powerdev.devtools.bytecode import compile_powerdev

    def current(source: Path) -> bool:
        compiled = Path(importlib.util.cache_from_source(str(source)))
        return compiled.is_file() and compiled.stat().st_mtime >= source.stat().st_mtime

    assert compile_powerdev() is None
    sources = sorted(Path(powerdev.__file__).parent.rglob("*.py"))
    assert sources and [str(s) for s in sources if not current(s)] == []


def test_a_bench_says_when_it_cannot_byte_compile(monkeypatch, capsys):
    import compileall

    from powerdev.devtools import bytecode

    def refused(directory, quiet):
        print(f"*** can't write into {directory}: read-only file system")
        return False

    monkeypatch.setattr(compileall, "compile_dir", refused)
    bytecode.compile_for_bench("powerdev bench")
    err = capsys.readouterr().err
    assert err.startswith("powerdev bench: note: cannot byte-compile ")
    assert "read-only file system" in err and "compiles its source at start" in err
