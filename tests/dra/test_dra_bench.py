"""`powerdev bench --dra --quick` runs end to end against the kit's etcd and
kube-apiserver and reports every DRA figure docs/performance.md quotes,
with the shape the report promises (a smoke test: it asserts no speed);
without the kit it says, in one line, how to build it."""

import json
import os
import subprocess
import sys

from powerdev.devtools import bench, kit
from powerdev.devtools.testing import is_root
from tests.controlplane_fixtures import require_tools

PUBLICATION = {
    "DRA: inventory to every slice of a new pool accepted": bench.QUICK.dra_publications,
    "DRA: one device added, its slice accepted": (bench.QUICK.dra_changes),
    "DRA: one device degraded (a taint), its slice accepted": (bench.QUICK.dra_changes),
}
PREPARE = {
    "DRA: NodePrepareResources (1 device, claim read from the API server)",
    "DRA: NodePrepareResources again (from the checkpoint)",
    "DRA: NodeUnprepareResources",
}
DAEMON = {
    "DRA: daemon start to its pool at the API server",
    "DRA: RSS",
    "longest Trio step (DRA run)",
    *PREPARE,
}


def run_bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "powerdev", "bench", "--dra", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )


def test_the_quick_dra_bench_reports_publication_and_prepare_figures(tmp_path):
    require_tools(("etcd", "kube-apiserver"))
    out = tmp_path / "bench.json"
    done = run_bench("--quick", "--json", str(out))
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    rows = {row["measure"]: row for row in report["rows"]}
    assert rows.keys() == PUBLICATION.keys() | DAEMON
    (size,) = bench.QUICK.sizes
    for measure, count in PUBLICATION.items():
        row = rows[measure]
        assert row["devices"] == size and row["n"] == count
        assert row["slices"] == 2 and row["requests"] >= 1  # 56 devices a slice packed anew
        assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
    for measure in ("added", "degraded (a taint)"):  # a device keeps its slice: one write
        assert rows[f"DRA: one device {measure}, its slice accepted"]["requests"] == 1
    # The daemon's rows count the devices of its pool: without root, the
    # nodes are links to /dev/null, which are fewer devices.
    (published,) = {rows[m]["devices"] for m in DAEMON}
    assert published == size if is_root() else 0 < published <= size
    for measure in PREPARE:
        assert rows[measure]["n"] == bench.QUICK.claims
        assert 0 < rows[measure]["p50_ms"] <= rows[measure]["p99_ms"] <= rows[measure]["max_ms"]
    assert rows["DRA: daemon start to its pool at the API server"]["ms"] > 0
    assert rows["DRA: RSS"]["mib"] > 0
    assert rows["longest Trio step (DRA run)"]["ms"] > 0
    assert report["machine"]["api server"].startswith("kube-apiserver v")
    assert "| measure | devices | result |" in done.stdout
    assert "; 2 slices, " in done.stdout


def test_without_the_kit_it_says_in_one_line_how_to_build_it(tmp_path):
    env = {
        **os.environ,
        kit.TOOLS["etcd"].env: str(tmp_path / "etcd"),
        kit.TOOLS["kube-apiserver"].env: str(tmp_path / "kube-apiserver"),
    }
    done = run_bench("--quick", env=env)
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith("powerdev bench --dra: the conformance kit is not built: missing etcd")
    assert line.endswith("build it with: bash conformance/build")
    assert done.stdout == ""


LUNS = {
    "LUNs: both paths of a LUN lost or back on a node, to its report written",
    "LUNs: the same, to the cluster pool updated",
}
SCALE = {
    "LUNs: controller start to the whole cluster pool",
    "LUNs: one LUN lost or back on one node, report to the whole pool",
    "LUNs: the controller's CPU per change",
    "LUNs: the controller's RSS after the changes",
    "LUNs: one pass (a report parsed, all merged, the slices built), in process",
    "LUNs: a heartbeat (a report written again, its LUNs the same): the controller's CPU",
}


def test_the_quick_lun_bench_reports_a_path_change_and_the_controller_at_scale(tmp_path):
    require_tools(("etcd", "kube-apiserver"))
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "powerdev", "bench", "--luns", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = {row["measure"]: row for row in json.loads(out.read_text())["rows"]}
    # The real node needs root (block nodes); without it, that part is skipped.
    assert rows.keys() == (SCALE | LUNS if is_root() else SCALE)
    changes = bench.QUICK.lun_changes
    for measure in LUNS & rows.keys():
        assert rows[measure]["n"] == changes
        assert 0 < rows[measure]["p50_ms"] <= rows[measure]["p99_ms"] <= rows[measure]["max_ms"]
    if is_root():
        path = rows["LUNs: the same, to the cluster pool updated"]
        assert (path["report_writes"], path["slice_writes"]) == (1, 1)
    change = rows["LUNs: one LUN lost or back on one node, report to the whole pool"]
    assert (change["devices"], change["nodes"]) == (bench.QUICK.luns, bench.QUICK.lun_nodes)
    assert change["n"] == changes and change["slices"] == change["slice_writes"] == 1
    assert rows["LUNs: the controller's CPU per change"]["p50_ms"] > 0
    assert rows["LUNs: the controller's RSS after the changes"]["mib"] > 0
    assert rows["LUNs: controller start to the whole cluster pool"]["ms"] > 0
    assert f"| LUNs: the controller's CPU per change | {bench.QUICK.luns} |" in done.stdout
