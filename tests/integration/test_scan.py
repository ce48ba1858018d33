"""`powerdev scan`: per resource, what would be advertised and what is left
out and why; the exit status says whether the config is valid."""

import json
import re
import subprocess
import sys

from tests.conftest import make_dev_tree, needs_root, with_udev_database


def scan(tmp_path, config, *flags, udev_run=None):
    """`powerdev scan`; with udev_run, where udev's database is /run/udev (root)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    command = [
        sys.executable,
        "-m",
        "powerdev",
        "scan",
        "--config",
        str(path),
        "--dev-root",
        str(tmp_path / "dev"),
        "--sys-root",
        str(tmp_path / "sys"),
        *flags,
    ]
    if udev_run is not None:
        command = with_udev_database(command, udev_run)
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


CONFIG = {
    "resources": [
        {
            "name": "power-dev-plugin/lun",
            "include-devices": ["/dev/mapper/*"],
            "exclude-devices": ["/dev/mapper/skip"],
            "allocation": "each",
            "match-properties": {"DM_UUID": "mpath-*"},
        },
        {"name": "power-dev-plugin/acc", "include-devices": ["/dev/acc*", "/dev/loop*"]},
    ]
}


@needs_root
def test_scan_says_what_is_advertised_and_why_the_rest_is_not(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["mapper/skip", "acc0"])
    (dev / "mapper" / "mpatha").symlink_to("/dev/null")
    (dev / "mapper" / "lvm").symlink_to("/dev/zero")
    (dev / "mapper" / "notes").write_text("not a device")
    (dev / "loop-control").symlink_to("/dev/null")
    udev = tmp_path / "udev-run"  # as the DaemonSet mounts the host's /run/udev
    (udev / "data").mkdir(parents=True)
    (udev / "data" / "c1:3").write_text("E:DM_UUID=mpath-3600a\n")
    (udev / "data" / "c1:5").write_text("E:DM_UUID=LVM-xyz\n")
    done = scan(tmp_path, CONFIG, "--json", udev_run=udev)
    assert done.returncode == 0, done.stderr
    lun, acc = json.loads(done.stdout)
    assert [d["path"] for d in lun["advertised"]] == ["/dev/mapper/mpatha"]
    why = {x["path"]: x["reason"] for x in lun["left_out"]}
    assert why["/dev/mapper/skip"] == "excluded by '/dev/mapper/skip'"
    assert why["/dev/mapper/notes"] == "not a character or block device node"
    assert why["/dev/mapper/lvm"].startswith("properties DM_UUID=LVM-xyz do not match")
    assert [d["path"] for d in acc["advertised"]] == ["/dev/acc0"]
    (control,) = acc["left_out"]
    assert control["path"] == "/dev/loop-control" and "control node" in control["reason"]
    text = scan(tmp_path, CONFIG, udev_run=udev)
    assert text.returncode == 0
    assert "power-dev-plugin/lun (each): 1 device" in text.stdout
    assert "left out: /dev/mapper/lvm: properties" in text.stdout


def test_scan_of_a_bad_config_exits_2_with_one_line(tmp_path):
    done = scan(tmp_path, {"resources": [{"name": "a.io/x", "allocation": "some"}]})
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "field 'resources[0].allocation'" in done.stderr


async def test_powerdev_local_shows_several_resources(tmp_path):
    import trio

    from powerdev.devtools.local import run_local
    from powerdev.rpc import asyncio_door

    dev = make_dev_tree(tmp_path / "dev", ["acc0", "lun0", "lun1"])
    config = tmp_path / "multi.json"
    config.write_text(
        json.dumps(
            {
                "resources": [
                    {"name": "power-dev-plugin/acc", "include-devices": ["/dev/acc*"]},
                    {
                        "name": "power-dev-plugin/lun",
                        "include-devices": ["/dev/lun*"],
                        "allocation": "each",
                    },
                ]
            }
        )
    )
    lines: list[str] = []
    with trio.fail_after(30):
        async with asyncio_door(), trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: run_local(
                    config_path=config,
                    dev_root=dev,
                    sys_root=tmp_path / "sys",
                    uevents="off",
                    out=lines.append,
                    task_status=task_status,
                )
            )
            nursery.cancel_scope.cancel()
    text = "\n".join(lines)
    assert "kubelet: registered power-dev-plugin/acc" in text
    assert "kubelet: registered power-dev-plugin/lun" in text
    assert "a pod asking for power-dev-plugin/acc: 1 gets unit acc0 and 1 device node:" in text
    # mknod nodes sysfs does not know: in "each" mode a unit is named by its numbers
    assert re.search(
        r"a pod asking for power-dev-plugin/lun: 1 gets unit char-120-\d+ and 1 device node:", text
    )


def test_scan_says_every_warning_that_run_logs_at_start(tmp_path):
    make_dev_tree(tmp_path / "dev", ["acc0"])
    config = {"include-devices": ["/dev/acc*"], "permisions_typo_far_away": 1}
    done = scan(tmp_path, config)
    assert done.returncode == 0
    assert "powerdev: warning: " in done.stderr
    assert "field 'permisions_typo_far_away' is not known and is ignored" in done.stderr
    (tmp_path / "config.json").write_text(" \n")
    empty = subprocess.run(
        [sys.executable, "-m", "powerdev", "scan", "--config", str(tmp_path / "config.json")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert empty.returncode == 0
    assert "config.json is empty: using the defaults" in empty.stderr
    assert "They advertise every block device of the host" in empty.stderr
