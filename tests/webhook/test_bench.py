"""`powerdev bench-webhook --quick` runs end to end against the real process
and reports every figure docs/performance.md quotes (a smoke test; it asserts no speed)."""

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
    assert len(latency) == 6
    for row in latency:
        assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
    assert "review on a new connection (TLS handshake)" in done.stdout
