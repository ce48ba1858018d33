"""docs/deployment.md's node pages: the tolerations patch lands on the
DaemonSet's pods, in every overlay and with every component, and changes
nothing else; and the commands that check one node ask that node's pod (by
the DaemonSet's namespace and pod labels, and the node's name) for commands
powerdev has, with the environment the page says the pod has."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from powerdev.cli import build_parser
from tests.deploy.test_components import COMPONENTS, OVERLAYS, render
from tests.deploy.test_manifests import ROOT, daemonset
from tests.docs.markdown import blocks

pytestmark = pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl is not on this machine"
)
PAGE = ROOT / "docs" / "deployment.md"


def toleration_snippets() -> list[dict]:
    found = []
    for b in blocks(PAGE):
        if b.kind == "render" and "tolerations" in b.text:
            found.append(yaml.safe_load(b.text))
    return found


def pod_spec(rendered: dict) -> dict:
    (ds,) = [d for k, d in rendered.items() if k[0] == "DaemonSet"]
    return ds["spec"]["template"]["spec"]


def test_the_page_has_a_toleration_to_add():
    assert len(toleration_snippets()) == 2  # a toleration; and one with a nodeSelector


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("with_components", [False, True], ids=["alone", "components"])
def test_the_documented_toleration_reaches_the_daemonsets_pods_and_nothing_else(
    tmp_path, overlay, with_components
):
    names = COMPONENTS if with_components else []
    before = render(tmp_path, overlay, names)
    snippets = toleration_snippets()
    assert snippets
    for i, snippet in enumerate(snippets):
        (patch,) = snippet["patches"]
        ops = yaml.safe_load(patch["patch"])
        after = render(tmp_path / str(i), overlay, names, snippet["patches"])
        assert set(after) == set(before)
        for key, doc in after.items():
            if key[0] != "DaemonSet":
                assert doc == before[key], key
        spec, old = pod_spec(after), pod_spec(before)
        (tolerate,) = [op for op in ops if op["path"].endswith("/tolerations")]
        assert "tolerations" not in old  # none of the manifests' own
        assert spec["tolerations"] == tolerate["value"]
        selected = {
            op["path"].rsplit("/", 1)[1]: op["value"]
            for op in ops
            if "/nodeSelector/" in op["path"]
        }
        assert spec["nodeSelector"] == {**old["nodeSelector"], **selected}
        rest = {k: v for k, v in spec.items() if k not in ("tolerations", "nodeSelector")}
        assert rest == {k: v for k, v in old.items() if k != "nodeSelector"}


def node_commands() -> list[list[str]]:
    (block,) = [b for b in blocks(PAGE) if "--field-selector spec.nodeName" in b.text]
    lines = [line.split("#")[0].strip() for line in block.text.splitlines()]
    return [line for line in lines if line]


def test_one_nodes_pod_is_found_by_its_node_and_the_daemonsets_labels():
    ds = daemonset()
    namespace = ds["metadata"]["namespace"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    lines = node_commands()
    (find,) = [line for line in lines if line.startswith("POD=")]
    words = shlex.split(re.sub(r"^POD=\$\((.*)\)$", r"\1", find))
    assert words[:3] == ["kubectl", "get", "pod"]
    assert words[words.index("-n") + 1] == namespace
    key, _, value = words[words.index("-l") + 1].partition("=")
    assert labels[key] == value
    assert words[words.index("--field-selector") + 1] == "spec.nodeName=$NODE"
    assert words[words.index("-o") + 1] == "name"  # pod/NAME, which exec and logs take
    execs = [shlex.split(line) for line in lines if " exec " in line]
    assert len(execs) >= 2
    for words in execs:
        assert words[words.index("-n") + 1] == namespace
        assert words[words.index("--") - 1] == "$POD"  # never ds/...: any one pod
        command = words[words.index("--") + 1 :]
        assert command[0] == "powerdev"
        assert build_parser().parse_args(command[1:]).command in ("scan", "health")
    assert any(w[w.index("--") + 1 :][:2] == ["powerdev", "scan"] for w in execs)


def test_in_the_pod_scan_reads_the_nodes_dev_as_the_page_says():
    env = {
        e["name"]: e.get("value")
        for e in daemonset()["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    text = PAGE.read_text()
    for name in re.findall(r"`(POWERDEV_\w+)=([^`]+)`", text):
        assert env[name[0]] == name[1], name
    assert "POWERDEV_DEV_ROOT=/host/dev" in text
    # scan's default config is where the DaemonSet mounts the ConfigMap
    mounts = daemonset()["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    (config,) = [m["mountPath"] for m in mounts if m["name"] == "config"]
    assert build_parser().parse_args(["scan"]).config == Path(config) / "config.json"
