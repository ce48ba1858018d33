"""`powerdev scan`: per resource, what would be advertised and what is left
out and why; the exit status says whether the config is valid."""

import json
import os
import re
import subprocess
import sys

from tests.conftest import make_dev_tree, needs_root, with_udev_database


def scan(tmp_path, config, *flags, udev_run=None):
    """`powerdev scan` of this config; with udev_run, where udev's database
    is /run/udev (root)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return scan_file(tmp_path, path, *flags, udev_run=udev_run)


def scan_file(tmp_path, path, *flags, udev_run=None):
    """`powerdev scan` of a config file as it is (empty, or missing, say)."""
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
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


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


def test_scan_says_through_which_api(tmp_path):
    make_dev_tree(tmp_path / "dev", ["lun0", "acc0"])
    config = {
        "resources": [
            {"name": "a.io/lun", "api": "both", "include-devices": ["/dev/lun*"]},
            {"name": "a.io/acc", "api": "dra", "include-devices": ["/dev/acc*"]},
        ]
    }
    text = scan(tmp_path, config)
    assert text.returncode == 0, text.stderr
    assert "a.io/lun (each, through the device plugin API and DRA): 1 device" in text.stdout
    assert "a.io/acc (each, through DRA): 1 device" in text.stdout
    lun, acc = json.loads(scan(tmp_path, config, "--json").stdout)
    assert (lun["api"], acc["api"]) == ("both", "dra")


def test_scan_of_a_bad_config_exits_2_with_one_line(tmp_path):
    make_dev_tree(tmp_path / "dev", ["acc0"])
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


async def run_warnings(tmp_path, config_path) -> list[str]:
    """The WARNING lines `powerdev run` logs, up to its wait for the kubelet."""
    import signal

    import trio

    from powerdev.devtools.testing import run_command

    plugin_dir = tmp_path / "device-plugins"
    plugin_dir.mkdir(exist_ok=True)
    command = run_command(
        plugin_dir,
        config_path,
        tmp_path / "dev",
        "--sys-root",
        str(tmp_path / "sys"),
        "--uevents",
        "off",
        "--status-file",
        str(tmp_path / "status"),
        "--pod-resources-socket",
        str(tmp_path / "no-kubelet.sock"),
    )
    lines: list[str] = []
    with trio.fail_after(30):
        proc = await trio.lowlevel.open_process(command, stderr=subprocess.PIPE)
        try:
            buffered = b""
            while not any("waiting for the kubelet" in line for line in lines):
                chunk = await proc.stderr.receive_some()
                assert chunk, "\n".join(lines)
                buffered += chunk
                *done, buffered = buffered.split(b"\n")
                lines += [line.decode() for line in done]
        finally:
            proc.send_signal(signal.SIGTERM)
            await proc.wait()
    # "<time> WARNING <logger>: <message>"
    return [
        line.split(" WARNING ", 1)[1].split(": ", 1)[1] for line in lines if " WARNING " in line
    ]


def scan_warnings(done: subprocess.CompletedProcess) -> list[str]:
    prefix = "powerdev: warning: "
    return [line[len(prefix) :] for line in done.stderr.splitlines() if line.startswith(prefix)]


async def test_scan_says_every_warning_that_run_logs_at_start(tmp_path):
    """The same words, in the same order, from the same config on the same
    host: the config file's warnings, a missing directory, nx-gzip on a
    host without it, the defaults of a missing or empty file."""
    make_dev_tree(tmp_path / "dev", ["acc0"])
    path = tmp_path / "config.json"
    cases = {
        "typo, gone, nx": {
            "include-devices": ["/dev/acc*", "/dev/gone/*"],
            "nx-gzip": True,
            "permisions_typo_far_away": 1,
        },
        "empty": " \n",
        "missing": None,
    }
    for case, config in cases.items():
        path.unlink(missing_ok=True)
        if isinstance(config, dict):
            path.write_text(json.dumps(config))
        elif config is not None:
            path.write_text(config)
        if isinstance(config, dict):
            done = scan(tmp_path, config)
        else:  # a missing file is checked only when its defaults are asked for
            done = scan_file(tmp_path, path, "--defaults-if-missing")
        assert done.returncode == 0, done.stderr
        said = scan_warnings(done)
        assert said == await run_warnings(tmp_path, path), case
        assert said, case
    # The first case: each warning there, named.
    first = scan(tmp_path, cases["typo, gone, nx"])
    text = "\n".join(scan_warnings(first))
    assert "field 'permisions_typo_far_away' is not known and is ignored" in text
    assert "'/dev/gone/*' can match nothing yet" in text
    assert "nx-gzip is true, but this host has no /dev/crypto/nx-gzip" in text


def test_scan_refuses_what_run_refuses_with_the_same_line_and_exit_code(tmp_path):
    """A socket name too long for the plugin directory: both exit 2 with the
    same one line, since both check the same steps in the same order."""
    make_dev_tree(tmp_path / "dev", ["acc0"])
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"resources": [{"name": "a.io/x", "socket": "s" * 95 + ".sock"}]}))
    plugin_dir = tmp_path / "device-plugins"
    common = ["--config", str(path), "--dev-root", str(tmp_path / "dev"), "--sys-root",
              str(tmp_path / "sys"), "--plugin-dir", str(plugin_dir)]  # fmt: skip
    said = {}
    for command in ("scan", "run"):
        done = subprocess.run(
            [sys.executable, "-m", "powerdev", command, *common],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        said[command] = (done.returncode, done.stderr)
    assert said["scan"] == said["run"]
    code, line = said["scan"]
    assert code == 2 and line.count("\n") == 1
    assert "over the 107" in line, line


def test_scan_of_a_missing_config_fails_unless_the_defaults_are_asked_for(tmp_path):
    """A checker that takes a typo for "no file, so defaults" checks nothing:
    a missing --config or POWERDEV_CONFIG is one line and exit 2, as in
    `powerdev local`; --defaults-if-missing checks the defaults instead."""
    make_dev_tree(tmp_path / "dev", ["acc0"])
    wrong = tmp_path / "wrong" / "config.json"
    fix = "or pass --defaults-if-missing"
    done = scan_file(tmp_path, wrong)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"powerdev: bad config: {wrong}: does not exist; ")
    assert "--config (or POWERDEV_CONFIG)" in line and fix in line
    from_env = subprocess.run(
        [sys.executable, "-m", "powerdev", "scan", "--dev-root", str(tmp_path / "dev")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "POWERDEV_CONFIG": str(wrong)},
    )
    assert (from_env.returncode, from_env.stderr) == (2, done.stderr)
    asked = scan_file(tmp_path, wrong, "--defaults-if-missing", "--json")
    assert asked.returncode == 0, asked.stderr
    (resource,) = json.loads(asked.stdout)
    assert resource["resource"] == "power-dev-plugin/dev"
    assert f"{wrong} does not exist: using the defaults" in asked.stderr


def test_a_dev_root_that_is_not_a_directory_is_refused_by_scan_run_and_local(tmp_path):
    config = tmp_path / "config.json"
    config.write_text('{"include-devices": ["/dev/acc*"]}')
    (tmp_path / "a-file").write_text("")
    for dev_root, problem in ((tmp_path / "no-dev", "does not exist"),
                              (tmp_path / "a-file", "is not a directory")):  # fmt: skip
        for command in ("scan", "run", "local"):
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "powerdev",
                    command,
                    "--config",
                    str(config),
                    "--dev-root",
                    str(dev_root),
                    *(["--plugin-dir", str(tmp_path / "dp")] if command == "run" else []),
                ],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 2, (command, done.stderr)
            (line,) = done.stderr.splitlines()
            assert line.startswith(f"powerdev: bad config: --dev-root: {dev_root} {problem}; ")
            assert "e.g. /host/dev" in line
    assert not (tmp_path / "dp").exists()
