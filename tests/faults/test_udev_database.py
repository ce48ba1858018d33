"""match-properties as the DaemonSet runs it (root): the host's /run/udev
mounted where libudev looks, and the README's own example, which gave
capacity 0 when the database was not mounted. The database is read at
every look, so properties udev writes after the daemon started count."""

import json
import signal

import trio

from powerdev.devtools.testing import run_command
from tests.conftest import make_dev_tree, needs_root, with_udev_database
from tests.faults.harness import STOP_LIMIT, kubelet_running

LUN = "power-dev-plugin/lun"
README_EXAMPLE = {
    "name": LUN,
    "include-devices": ["/dev/mapper/*"],
    "exclude-devices": ["/dev/mapper/control"],
    "match-properties": {"DM_UUID": "mpath-*", "ID_MODEL": ["2145", "FlashSystem*"]},
    "allocation": "each",
    "permissions": "rw",
}


def capacity(count):
    def check(kubelet):
        state = kubelet.resources.get(LUN)
        return state is not None and state.connected and state.capacity == count

    return check


@needs_root
async def test_the_readmes_match_properties_example_finds_its_luns(tmp_path):
    dev = make_dev_tree(tmp_path / "dev", ["mapper/mpatha"], target="/dev/null")  # 1:3
    (dev / "mapper" / "mpathb").symlink_to("/dev/zero")  # 1:5
    (dev / "mapper" / "other").symlink_to("/dev/full")  # 1:7: not a 2145
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"resources": [README_EXAMPLE]}))
    udev = tmp_path / "run-udev"  # the host's /run/udev: udevd has written nothing yet
    udev.mkdir()
    data = udev / "data"
    command = run_command(tmp_path / "device-plugins", config, dev, "--uevents", "off")
    with trio.fail_after(60):
        async with kubelet_running(tmp_path / "device-plugins") as (kubelet, _):
            with (tmp_path / "daemon.log").open("w") as log:
                daemon = await trio.lowlevel.open_process(
                    with_udev_database(command, udev), stderr=log
                )
            try:
                await kubelet.wait_until(capacity(0))
                data.mkdir()
                (data / "c1:3").write_text("E:DM_UUID=mpath-3600a\nE:ID_MODEL=2145\n")
                (data / "c1:5").write_text("E:DM_UUID=mpath-3600b\nE:ID_MODEL=FlashSystem-9500\n")
                (data / "c1:7").write_text("E:DM_UUID=mpath-3600c\nE:ID_MODEL=Other\n")
                daemon.send_signal(signal.SIGHUP)  # a rescan
                await kubelet.wait_until(capacity(2))
                # stand-ins are character nodes, which have no identity: in
                # "each" mode a unit is then named by the kernel's name for it
                assert sorted(kubelet.resources[LUN].devices) == ["null", "zero"]
                daemon.send_signal(signal.SIGTERM)
                with trio.fail_after(STOP_LIMIT):
                    assert await daemon.wait() == 0
            finally:
                if daemon.returncode is None:
                    daemon.kill()
                    with trio.CancelScope(shield=True):
                        await daemon.wait()
