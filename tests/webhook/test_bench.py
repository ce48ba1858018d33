"""`powerdev bench-webhook --quick` runs end to end against the real process
and reports every figure docs/performance.md quotes, and the memory held
under 60 hostile connections (a smoke test; it asserts no speed and no size)."""

import json
import subprocess
import sys


def test_bench_webhook_quick_reports_latency_and_rss(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "powerdev", "bench-webhook", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = {row["measure"]: row for row in json.loads(out.read_text())["rows"]}
    assert rows["RSS after start"]["mib"] > 0
    assert rows["RSS after the reviews"]["mib"] > 0
    latency = [row for name, row in rows.items() if name.startswith("review")]
    assert len(latency) == 7
    held = "RSS, highest while 60 connections hold 3 MiB bodies unfinished"
    assert rows[held]["mib"] > 0
    assert rows["of 60 hostile connections, ended by the webhook"]["ended"] >= 0
    assert "review on a new connection while 60 hostile ones are open" in done.stdout
    for row in latency:
        assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
    assert "review on a new connection (TLS handshake)" in done.stdout
