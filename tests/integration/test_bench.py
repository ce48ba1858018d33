"""`powerdev bench --quick` runs end to end; figures are reported, never asserted."""

import json
import subprocess
import sys


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
    } <= measures
    allocate = next(r for r in report["rows"] if r["measure"] == "Allocate")
    assert allocate["n"] == 20 and allocate["answer_bytes"] > 0
    assert "| measure | devices | result |" in done.stdout


def test_quick_probe_cost_reports_exec_and_http_probes(tmp_path):
    out = tmp_path / "probes.json"
    done = subprocess.run(
        [sys.executable, "-m", "powerdev.probecost", "--quick", "--json", str(out)],
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
    assert held["max_ms"] > 0 and held["daemon_descriptors_added"] >= 200
