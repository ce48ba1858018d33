"""One device, one holder, across resources (ownership.py): the same device
under two names in two resources, a device a reload moves while a pod holds
it, and a node plus a link in "each" mode. Real sockets, the fake kubelet
with its PodResources API, real inotify on the device directories."""

from __future__ import annotations

import json
import subprocess
import sys

import trio

from tests.conftest import config_for, daemon_and_kubelet, make_dev_tree, needs_root

LIMIT = 30
A, B = "example.com/a", "example.com/b"


def two(a: list[str], b: list[str], **each: object) -> str:
    return json.dumps(
        {
            "resources": [
                {"name": A, "socket": "a.sock", "include-devices": a, **each},
                {"name": B, "socket": "b.sock", "include-devices": b, **each},
            ]
        }
    )


def units(kubelet, name: str) -> dict[str, str]:
    state = kubelet.resources.get(name)
    return dict(state.devices) if state is not None else {}


@needs_root
async def test_a_second_name_in_another_resource_takes_the_device_from_both(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["a/x"])
    (dev / "b").mkdir()
    config = config_for(two(["/dev/a/*"], ["/dev/b/*"]))
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config, dev_root=dev) as h:
            await h.kubelet.wait_until(lambda k: units(k, A) == {"a.x": "Healthy"})
            (dev / "b" / "y").symlink_to(dev / "a" / "x")  # the same device, B's pattern
            await h.kubelet.wait_until(lambda k: units(k, A) == {"a.x": "Unhealthy"})
            assert units(h.kubelet, B) == {}
            (dev / "b" / "y").unlink()
            await h.kubelet.wait_until(lambda k: units(k, A) == {"a.x": "Healthy"})


@needs_root
async def test_a_device_moved_by_reload_waits_while_a_pod_holds_it_and_names_the_pod(
    tmp_path, caplog
):
    dev = make_dev_tree(tmp_path / "dev", ["a/x", "b/z"])
    file = tmp_path / "config.json"
    file.write_text(two(["/dev/a/*"], ["/dev/b/*"], allocation="each"))
    config = config_for(file.read_text())
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(
            tmp_path, config, dev_root=dev, config_path=file, cdi_recheck_interval=0.05
        ) as h:
            kubelet = h.kubelet
            await kubelet.wait_until(lambda k: len(units(k, A)) == 1 and len(units(k, B)) == 1)
            (unit,) = units(kubelet, A)
            await kubelet.allocate(A, [unit])
            kubelet.pods = {"p1": {A: [unit]}}
            file.write_text(two(["/dev/none*"], ["/dev/a/*", "/dev/b/*"], allocation="each"))
            await kubelet.wait_until(
                lambda k: (
                    units(k, A) == {}
                    and sorted(units(k, B).values())
                    == [
                        "Healthy",
                        "Unhealthy",
                    ]
                )
            )
            asked = kubelet.pod_resources_asked
            await kubelet.wait_until(lambda k: k.pod_resources_asked > asked + 1)
            assert sorted(units(kubelet, B).values()) == ["Healthy", "Unhealthy"]  # still held
            said = [r.getMessage() for r in caplog.records if "is Unhealthy" in r.getMessage()]
            assert any(
                f"{B}: /dev/a/x is Unhealthy: it is held as unit {unit} of {A}" in line
                and "by pod default/p1, and until the kubelet says no pod holds it" in line
                for line in said
            ), said
            kubelet.pods = {}  # the pod is gone
            await kubelet.wait_until(
                lambda k: sorted(units(k, B).values()) == ["Healthy", "Healthy"]
            )


@needs_root
async def test_each_a_node_and_its_link_are_one_unit(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["lun/x", "lun/y"])
    (dev / "lun" / "by-name").symlink_to(dev / "lun" / "x")
    config = config_for(json.dumps({"include-devices": ["/dev/lun/*"], "allocation": "each"}))
    with trio.fail_after(LIMIT):
        async with daemon_and_kubelet(tmp_path, config, dev_root=dev) as h:
            name = h.name
            await h.kubelet.wait_until(lambda k: len(units(k, name)) == 2)
            (x,) = [u for u in units(h.kubelet, name) if u != _unit_of(h, "/dev/lun/y")]
            grant = await h.kubelet.allocate(name, [x])
            assert sorted(d.host_path for d in grant.devices) == [
                "/dev/lun/by-name",
                "/dev/lun/x",
            ]


def _unit_of(h, path: str) -> str:
    (plugin,) = h.plugins
    return next(d.id for d in plugin.inventory.current.devices if d.path == path)


@needs_root
def test_run_and_scan_refuse_two_resources_on_one_device(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["dm-3"])
    (dev / "mapper").mkdir()
    (dev / "mapper" / "mpatha").symlink_to(dev / "dm-3")
    config = tmp_path / "config.json"
    config.write_text(two(["/dev/dm-*"], ["/dev/mapper/*"]))
    common = ["--config", str(config), "--dev-root", str(dev), "--sys-root", str(tmp_path)]
    for command in (
        ["scan", *common],
        ["run", *common, "--plugin-dir", str(tmp_path / "dp"), "--uevents", "off"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "powerdev", *command],
            capture_output=True,
            text=True,
            timeout=LIMIT,
        )
        assert done.returncode == 2, done.stderr
        assert f"{config}: field 'resources[1]': {B} matches /dev/mapper/mpatha" in done.stderr
        assert f"and {A} lists it too, as /dev/dm-3" in done.stderr
        assert "a device belongs to one resource only" in done.stderr
