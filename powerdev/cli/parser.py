"""The command line's parser: one function per sub-command, and the option
groups they share. Every setting has an environment variable (POWERDEV_...);
a command's own switches (scan's --json and --defaults-if-missing, health's
--ready, bench's) do not. A command lists only the options it reads."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from powerdev import __version__
from powerdev.cli import luns as luns_cli
from powerdev.cli import webhook as webhook_cli
from powerdev.cli.options import (
    LOG_LEVELS,
    UEVENT_SOURCES,
    Parser,
    dra_driver,
    env,
    metrics_address,
    one_of,
    positive_seconds,
    seconds_between,
)
from powerdev.config import DEFAULT_CONFIG_PATH, DEFAULT_RESOURCE_NAME, DEFAULT_SOCKET_NAME
from powerdev.kubelet.paths import (
    DEFAULT_DRA_DRIVER,
    DEFAULT_DRA_PLUGINS_DIR,
    DEFAULT_DRA_REGISTRY_DIR,
    DEFAULT_PLUGIN_DIR,
    DEFAULT_POD_RESOURCES_SOCKET,
)
from powerdev.ops import logformat
from powerdev.ops.status import DEFAULT_STATUS_FILE


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="powerdev", description="A Kubernetes device plugin for host device nodes."
    )
    parser.add_argument("--version", action="version", version=f"powerdev {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_run, _bench, _scan, _health, _local):
        add(sub)
    webhook_cli.add_parsers(sub, LOG_LEVELS)
    luns_cli.add_parser(sub, LOG_LEVELS)
    return parser


def _run(sub: argparse._SubParsersAction) -> None:
    """`powerdev run`: the daemon, as the DaemonSet runs it."""
    run = sub.add_parser("run", help="run the device plugin daemon (what the DaemonSet runs)")
    _plugin_dir(run)
    run.add_argument(
        "--config",
        type=Path,
        default=Path(env("CONFIG", DEFAULT_CONFIG_PATH)),
        help="config.json, in IBM's plugin's format or as a resources list; a missing file "
        "means the defaults "
        f"[env POWERDEV_CONFIG; default {DEFAULT_CONFIG_PATH}]",
    )
    _common(run)
    _uevents(run)
    _host_views(run)
    run.add_argument(
        "--cdi-spec-dir",
        type=Path,
        default=Path(env("CDI_SPEC_DIR", "/var/run/cdi")),
        help='where resources with "cdi": true write their CDI spec [env '
        "POWERDEV_CDI_SPEC_DIR; default /var/run/cdi]",
    )
    run.add_argument(
        "--pod-resources-socket",
        type=Path,
        default=Path(env("POD_RESOURCES_SOCKET", DEFAULT_POD_RESOURCES_SOCKET)),
        help="the kubelet's PodResources API, asked which devices pods still hold before a "
        "CDI spec forgets one [env POWERDEV_POD_RESOURCES_SOCKET; default "
        f"{DEFAULT_POD_RESOURCES_SOCKET}]",
    )
    run.add_argument(
        "--cdi-recheck-interval",
        type=seconds_between(0.01, 3600),
        metavar="SECONDS",
        default=env("CDI_RECHECK_INTERVAL", "30"),
        help="while a CDI spec keeps devices only because pods may hold them, ask the kubelet "
        "again this often, in seconds from 0.01 to 3600 [env POWERDEV_CDI_RECHECK_INTERVAL; "
        "default 30 seconds]",
    )
    run.add_argument(
        "--health-interval",
        type=seconds_between(0, 3600),
        metavar="SECONDS",
        default=env("HEALTH_INTERVAL", "5"),
        help="read what each device says of its own health (multipath paths, SCSI and NVMe "
        "state, NX-GZIP credits) again this often, in seconds up to 3600; 0: only at device "
        "events [env POWERDEV_HEALTH_INTERVAL; default 5 seconds]",
    )

    _dra(run)
    run.add_argument(
        "--status-file",
        type=Path,
        default=Path(env("STATUS_FILE", DEFAULT_STATUS_FILE)),
        help="where to record each resource's state for `powerdev health` "
        f"[env POWERDEV_STATUS_FILE; default {DEFAULT_STATUS_FILE}]",
    )
    run.add_argument(
        "--metrics-address",
        type=metrics_address,
        default=env("METRICS_ADDRESS", "") or None,
        help="serve /metrics, /healthz and /readyz over HTTP here: HOST:PORT, :PORT "
        "(every interface) or [IPv6]:PORT [env POWERDEV_METRICS_ADDRESS; default: off]",
    )


def _dra(run: argparse.ArgumentParser) -> None:
    """Where resources with "api": "dra" are served (needed only by them)."""
    run.add_argument(
        "--dra-driver",
        type=dra_driver,
        default=env("DRA_DRIVER", DEFAULT_DRA_DRIVER),
        help="the DRA driver's name, a DNS subdomain, that DeviceClasses select on "
        f"[env POWERDEV_DRA_DRIVER; default {DEFAULT_DRA_DRIVER}]",
    )
    run.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME") or None,
        help='this node\'s name, for resources with "api": "dra" [env NODE_NAME, from the '
        "downward API's spec.nodeName]",
    )
    run.add_argument(
        "--kubeconfig",
        type=Path,
        default=env("KUBECONFIG", "") or None,
        help="the API server, for DRA [env POWERDEV_KUBECONFIG; default: the pod's "
        "service account]",
    )
    run.add_argument(
        "--dra-plugins-dir",
        type=Path,
        default=Path(env("DRA_PLUGINS_DIR", DEFAULT_DRA_PLUGINS_DIR)),
        help="the kubelet's DRA plugins directory: the driver serves <dir>/<driver>/dra.sock "
        f"[env POWERDEV_DRA_PLUGINS_DIR; default {DEFAULT_DRA_PLUGINS_DIR}]",
    )
    run.add_argument(
        "--dra-registry-dir",
        type=Path,
        default=Path(env("DRA_REGISTRY_DIR", DEFAULT_DRA_REGISTRY_DIR)),
        help="the kubelet's plugin registry, where <driver>-reg.sock goes "
        f"[env POWERDEV_DRA_REGISTRY_DIR; default {DEFAULT_DRA_REGISTRY_DIR}]",
    )
    run.add_argument(
        "--boot-id-file",
        type=Path,
        default=Path(env("BOOT_ID_FILE", DEFAULT_BOOT_ID_FILE)),
        help="this boot's ID, to tell a DRA claim prepared before a reboot [env "
        f"POWERDEV_BOOT_ID_FILE; default {DEFAULT_BOOT_ID_FILE}]",
    )

    run.add_argument(
        "--lun-namespace",
        default=env("LUN_NAMESPACE", "power-device-plugin"),
        help='where the node reports the LUNs of resources with "scope": "cluster" (a '
        "ConfigMap each), which `powerdev luns` reads [env POWERDEV_LUN_NAMESPACE; default "
        "power-device-plugin]",
    )
    run.add_argument(
        "--lun-report-interval",
        type=positive_seconds(300.0),
        metavar="SECONDS",
        default=env("LUN_REPORT_INTERVAL", "10"),
        help="at least how often, in seconds, the node writes its LUN report again (its heartbeat: "
        "`powerdev luns --report-ttl` drops a node whose report stops) "
        "[env POWERDEV_LUN_REPORT_INTERVAL; default 10]",
    )


DEFAULT_BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"  # not namespaced: the host's


def _bench(sub: argparse._SubParsersAction) -> None:
    """`powerdev bench`: the developer's measure (powerdev.devtools.bench)."""
    bench = sub.add_parser(
        "bench", help="measure the real daemon against the fake kubelet (prints a table)"
    )
    bench.add_argument(
        "--quick",
        action="store_true",
        help="a small smoke run (100 devices, a few calls) instead of the full one",
    )
    bench.add_argument(
        "--sizes", default="1000,10000", help="device counts, comma-separated [default 1000,10000]"
    )
    bench.add_argument("--json", type=Path, default=None, help="also write the figures here")
    bench.add_argument(
        "--dra",
        action="store_true",
        help="measure DRA instead: ResourceSlice publication and NodePrepareResources against "
        "the conformance kit's etcd and kube-apiserver, which it starts (bash conformance/build)",
    )
    bench.add_argument(
        "--luns",
        action="store_true",
        help='measure LUNs seen by several nodes ("scope": "cluster") instead: a path change '
        "on a node to the cluster pool, and `powerdev luns` at 100 simulated nodes and 1,000 "
        "LUNs (--quick: 3 and 20), against the conformance kit's etcd and kube-apiserver",
    )
    bench.add_argument(
        "--node",
        action="store_true",
        help="measure the kit's real node instead (root): its start to Node Ready, and a pod's "
        "start with a device, through DeviceSpecs, CDI and DRA, against one without",
    )
    _choice(
        bench,
        "--log-level",
        LOG_LEVELS,
        default="warning",
        help="the bench's own log verbosity [default warning]",
    )


def _scan(sub: argparse._SubParsersAction) -> None:
    """`powerdev scan`: the config checker and what it would advertise on this node."""
    scan = sub.add_parser(
        "scan",
        help="check a config.json and print what each resource would advertise on this node, "
        "and what is left out and why",
    )
    scan.add_argument(
        "--config",
        type=Path,
        default=Path(env("CONFIG", DEFAULT_CONFIG_PATH)),
        help="the config.json to check; a missing file is an error (exit 2) unless "
        f"--defaults-if-missing [env POWERDEV_CONFIG; default {DEFAULT_CONFIG_PATH}]",
    )
    scan.add_argument(
        "--defaults-if-missing",
        action="store_true",
        help="when the --config file does not exist, check the defaults `run` would use "
        "instead of failing",
    )
    scan.add_argument("--json", action="store_true", help="print JSON instead of text")
    _plugin_dir(scan)
    _common(scan)
    _host_views(scan)


def _health(sub: argparse._SubParsersAction) -> None:
    """`powerdev health`: the exec probe."""
    health = sub.add_parser(
        "health", help="exit 0 if the daemon is alive (--ready: and registered), else 1"
    )
    health.add_argument(
        "--ready",
        action="store_true",
        help="also require every resource to be registered with the kubelet",
    )
    health.add_argument(
        "--status-file",
        type=Path,
        default=Path(env("STATUS_FILE", DEFAULT_STATUS_FILE)),
        help=f"[env POWERDEV_STATUS_FILE; default {DEFAULT_STATUS_FILE}]",
    )
    health.add_argument(
        "--timeout",
        type=positive_seconds(3600),
        metavar="SECONDS",
        default=3.0,
        help="how long to wait for the plugin's socket to answer, in seconds above 0 "
        "[default 3 seconds]",
    )
    _choice(
        health,
        "--log-level",
        LOG_LEVELS,
        default="warning",
        help="accepted like the other commands'; the probe prints only why it fails",
    )


def _local(sub: argparse._SubParsersAction) -> None:
    """`powerdev local`: the daemon against a fake kubelet, no cluster needed."""
    local = sub.add_parser(
        "local",
        help="run the daemon against a fake kubelet in a temp dir and print what the kubelet sees",
    )
    local.add_argument(
        "--config", type=Path, default=None, help="use this config.json instead of the demo one"
    )
    _common(local)
    _uevents(local)


def _common(p: argparse.ArgumentParser) -> None:
    """What every daemon-side command takes: logging, names, the host's /dev and /sys;
    each reads all of them (a test checks scan's)."""
    _choice(
        p,
        "--log-level",
        LOG_LEVELS,
        default=env("LOG_LEVEL", "info"),
        help="log verbosity [env POWERDEV_LOG_LEVEL; default info]",
    )
    _choice(
        p,
        "--log-format",
        logformat.FORMATS,
        default=env("LOG_FORMAT", "text"),
        help="text, or json: one object per line [env POWERDEV_LOG_FORMAT; default text]",
    )
    p.add_argument(
        "--resource-name",
        default=env("RESOURCE_NAME", DEFAULT_RESOURCE_NAME),
        help="extended resource to advertise [env POWERDEV_RESOURCE_NAME; "
        f"default {DEFAULT_RESOURCE_NAME}]",
    )
    p.add_argument(
        "--socket-name",
        default=env("SOCKET_NAME", DEFAULT_SOCKET_NAME),
        help="file name of our socket in the plugin dir [env POWERDEV_SOCKET_NAME; "
        f"default {DEFAULT_SOCKET_NAME}]",
    )
    p.add_argument(
        "--dev-root",
        type=Path,
        default=Path(env("DEV_ROOT", "/dev")),
        help="where the host's /dev is visible, e.g. /host/dev; reported paths "
        "stay /dev/... [env POWERDEV_DEV_ROOT; default /dev]",
    )
    p.add_argument(
        "--sys-root",
        type=Path,
        default=Path(env("SYS_ROOT", "/sys")),
        help="where the host's /sys is visible [env POWERDEV_SYS_ROOT; default /sys]",
    )


def _uevents(p: argparse.ArgumentParser) -> None:
    """The device events a running daemon follows: run and local (scan looks
    once and follows nothing)."""
    _choice(
        p,
        "--uevents",
        UEVENT_SOURCES,
        default=env("UEVENTS", "auto"),
        help="device events to follow: udev (links made; needs /run/udev), kernel, "
        "auto (udev when udevd runs), off (rescans only) [env POWERDEV_UEVENTS; default auto]",
    )


def _host_views(p: argparse.ArgumentParser) -> None:
    """Where the host's mount table is seen: run and scan. (udev's database
    is read through libudev, from /run/udev: see devices/udevdb.py.)"""
    p.add_argument(
        "--host-mountinfo",
        type=Path,
        default=Path(env("HOST_MOUNTINFO", "/proc/self/mountinfo")),
        help="the host's mount table, to keep devices the host uses out, e.g. "
        "/host/proc/1/mountinfo [env POWERDEV_HOST_MOUNTINFO; default /proc/self/mountinfo]",
    )


def _plugin_dir(p: argparse.ArgumentParser) -> None:
    """Where the sockets go: run serves there, scan checks their paths fit."""
    p.add_argument(
        "--plugin-dir",
        type=Path,
        default=Path(env("PLUGIN_DIR", DEFAULT_PLUGIN_DIR)),
        help="the kubelet's device-plugins directory [env POWERDEV_PLUGIN_DIR; "
        f"default {DEFAULT_PLUGIN_DIR}]",
    )


def _choice(
    p: argparse.ArgumentParser, flag: str, values: tuple[str, ...], *, default: str, help: str
) -> None:
    """An option that is one of `values`, in any case, listed in --help."""
    p.add_argument(
        flag,
        type=one_of(values),
        metavar="{" + ",".join(values) + "}",
        default=default,
        help=help,
    )
