"""Command line: parse arguments, build settings, trio.run(); nothing else."""

from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import sys
from functools import partial
from pathlib import Path

from powerdev import __version__
from powerdev.cli import webhook as webhook_cli
from powerdev.config import (
    DEFAULT_CONFIG_PATH,
    DEFAULT_RESOURCE_NAME,
    DEFAULT_SOCKET_NAME,
    Config,
    ConfigError,
    load_config,
    socket_path_problem,
)
from powerdev.kubelet.paths import DEFAULT_PLUGIN_DIR, DEFAULT_POD_RESOURCES_SOCKET
from powerdev.ops import logformat
from powerdev.ops.status import DEFAULT_STATUS_FILE

LOG_LEVELS = ("debug", "info", "warning", "error")
UEVENT_SOURCES = ("auto", "udev", "kernel", "off")


def _env(name: str, default: str) -> str:
    return os.environ.get(f"POWERDEV_{name}", default)


def one_of(values: tuple[str, ...]):
    """An argparse type: one of `values`, in any case. argparse converts string
    defaults (our environment variables) with it too, so a bad variable gets
    the same one-line error and exit code 2 as a bad flag."""

    def convert(text: str) -> str:
        if text.lower() not in values:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(values)}")
        return text.lower()

    convert.__name__ = "value"
    return convert


def seconds_between(low: float, high: float):
    """An argparse type: a number of seconds from low to high."""

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number of seconds from {low:g} to {high:g}"
            )
        return value

    convert.__name__ = "seconds"
    return convert


class _Parser(argparse.ArgumentParser):
    """Errors in one line, without the usage block: a log shows the line."""

    def error(self, message: str):  # type: ignore[no-untyped-def]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="powerdev", description="A Kubernetes device plugin for host device nodes."
    )
    parser.add_argument("--version", action="version", version=f"powerdev {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--log-level",
            type=one_of(LOG_LEVELS),
            metavar="{" + ",".join(LOG_LEVELS) + "}",
            default=_env("LOG_LEVEL", "info"),
            help="log verbosity [env POWERDEV_LOG_LEVEL; default info]",
        )
        p.add_argument(
            "--log-format",
            type=one_of(logformat.FORMATS),
            metavar="{" + ",".join(logformat.FORMATS) + "}",
            default=_env("LOG_FORMAT", "text"),
            help="text, or json: one object per line [env POWERDEV_LOG_FORMAT; default text]",
        )
        p.add_argument(
            "--resource-name",
            default=_env("RESOURCE_NAME", DEFAULT_RESOURCE_NAME),
            help="extended resource to advertise [env POWERDEV_RESOURCE_NAME; "
            f"default {DEFAULT_RESOURCE_NAME}]",
        )
        p.add_argument(
            "--socket-name",
            default=_env("SOCKET_NAME", DEFAULT_SOCKET_NAME),
            help="file name of our socket in the plugin dir [env POWERDEV_SOCKET_NAME; "
            f"default {DEFAULT_SOCKET_NAME}]",
        )
        p.add_argument(
            "--dev-root",
            type=Path,
            default=Path(_env("DEV_ROOT", "/dev")),
            help="where the host's /dev is visible, e.g. /host/dev; reported paths "
            "stay /dev/... [env POWERDEV_DEV_ROOT; default /dev]",
        )
        p.add_argument(
            "--uevents",
            type=one_of(UEVENT_SOURCES),
            metavar="{" + ",".join(UEVENT_SOURCES) + "}",
            default=_env("UEVENTS", "auto"),
            help="device events to follow: udev (links made; needs /run/udev), kernel, "
            "auto (udev when udevd runs), off (rescans only) [env POWERDEV_UEVENTS; default auto]",
        )
        p.add_argument(
            "--sys-root",
            type=Path,
            default=Path(_env("SYS_ROOT", "/sys")),
            help="where the host's /sys is visible [env POWERDEV_SYS_ROOT; default /sys]",
        )

    def host_views(p: argparse.ArgumentParser) -> None:
        """Where the host's mount table is seen: run and scan. (udev's database
        is read through libudev, from /run/udev: see devices/udevdb.py.)"""
        p.add_argument(
            "--host-mountinfo",
            type=Path,
            default=Path(_env("HOST_MOUNTINFO", "/proc/self/mountinfo")),
            help="the host's mount table, to keep devices the host uses out, e.g. "
            "/host/proc/1/mountinfo [env POWERDEV_HOST_MOUNTINFO; default /proc/self/mountinfo]",
        )

    run = sub.add_parser("run", help="run the device plugin daemon (what the DaemonSet runs)")
    run.add_argument(
        "--plugin-dir",
        type=Path,
        default=Path(_env("PLUGIN_DIR", DEFAULT_PLUGIN_DIR)),
        help="the kubelet's device-plugins directory [env POWERDEV_PLUGIN_DIR; "
        f"default {DEFAULT_PLUGIN_DIR}]",
    )
    run.add_argument(
        "--config",
        type=Path,
        default=Path(_env("CONFIG", DEFAULT_CONFIG_PATH)),
        help="config.json in the seed's format; a missing file means defaults "
        f"[env POWERDEV_CONFIG; default {DEFAULT_CONFIG_PATH}]",
    )
    common(run)
    host_views(run)
    run.add_argument(
        "--cdi-spec-dir",
        type=Path,
        default=Path(_env("CDI_SPEC_DIR", "/var/run/cdi")),
        help='where resources with "cdi": true write their CDI spec [env '
        "POWERDEV_CDI_SPEC_DIR; default /var/run/cdi]",
    )
    run.add_argument(
        "--pod-resources-socket",
        type=Path,
        default=Path(_env("POD_RESOURCES_SOCKET", DEFAULT_POD_RESOURCES_SOCKET)),
        help="the kubelet's PodResources API, asked which devices pods still hold before a "
        "CDI spec forgets one [env POWERDEV_POD_RESOURCES_SOCKET; default "
        f"{DEFAULT_POD_RESOURCES_SOCKET}]",
    )
    run.add_argument(
        "--cdi-recheck-interval",
        type=seconds_between(0.01, 3600),
        default=_env("CDI_RECHECK_INTERVAL", "30"),
        help="while a CDI spec keeps devices only because pods may hold them, ask the kubelet "
        "again this often [env POWERDEV_CDI_RECHECK_INTERVAL; default 30]",
    )

    run.add_argument(
        "--status-file",
        type=Path,
        default=Path(_env("STATUS_FILE", DEFAULT_STATUS_FILE)),
        help="where to record each resource's state for `powerdev health` "
        f"[env POWERDEV_STATUS_FILE; default {DEFAULT_STATUS_FILE}]",
    )
    run.add_argument(
        "--metrics-address",
        type=metrics_address,
        default=_env("METRICS_ADDRESS", "") or None,
        help="serve /metrics, /healthz and /readyz over HTTP here: HOST:PORT, :PORT "
        "(every interface) or [IPv6]:PORT [env POWERDEV_METRICS_ADDRESS; default: off]",
    )

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
    bench.add_argument("--log-level", type=one_of(LOG_LEVELS), default="warning")

    scan = sub.add_parser(
        "scan",
        help="print what each resource would advertise here, and what is left out and why",
    )
    scan.add_argument(
        "--config",
        type=Path,
        default=Path(_env("CONFIG", DEFAULT_CONFIG_PATH)),
        help=f"the config.json to check [env POWERDEV_CONFIG; default {DEFAULT_CONFIG_PATH}]",
    )
    scan.add_argument("--json", action="store_true", help="print JSON instead of text")
    common(scan)
    host_views(scan)

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
        default=Path(_env("STATUS_FILE", DEFAULT_STATUS_FILE)),
        help=f"[env POWERDEV_STATUS_FILE; default {DEFAULT_STATUS_FILE}]",
    )
    health.add_argument(
        "--timeout",
        type=float,
        default=3.0,
        help="seconds to wait for the plugin's socket to answer [default 3]",
    )
    health.add_argument("--log-level", type=one_of(LOG_LEVELS), default="warning")

    local = sub.add_parser(
        "local",
        help="run the daemon against a fake kubelet in a temp dir and print what the kubelet sees",
    )
    local.add_argument(
        "--config", type=Path, default=None, help="use this config.json instead of the demo one"
    )
    common(local)
    webhook_cli.add_parsers(sub, LOG_LEVELS)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "health":  # a probe: the status file and one connect, nothing more
        from powerdev.ops import health

        return health.main(args.status_file, ready=args.ready, timeout=args.timeout)
    log_format = getattr(args, "log_format", None) or one_of(logformat.FORMATS)(
        _env("LOG_FORMAT", "text")
    )
    logformat.configure(args.log_level, log_format)
    if args.log_level != "debug":
        logging.getLogger("grpclib").setLevel(logging.WARNING)
    if args.command in webhook_cli.COMMANDS:
        return webhook_cli.main(args)
    os.umask(0o077)  # our sockets are for the kubelet (root) only
    import trio

    from powerdev.daemon import supervisor  # after logging is set up
    from powerdev.daemon.settings import Settings
    from powerdev.devices.udevdb import Pyudev
    from powerdev.devtools import stepwatch
    from powerdev.ops import opsserver
    from powerdev.resources import ownership

    if args.command == "bench":
        from powerdev.devtools import bench as bench_module

        plan = (
            bench_module.QUICK
            if args.quick
            else bench_module.Plan(sizes=tuple(int(n) for n in args.sizes.split(",")))
        )
        trio.run(partial(bench_module.run_bench, plan, args.json))
        return 0
    if args.command == "scan":
        return _scan(args)
    try:
        if args.command == "run":
            config = load_config(
                args.config, resource_name=args.resource_name, socket_name=args.socket_name
            )
            _check_socket_paths(args.plugin_dir, config)
            udev = Pyudev()
            ownership.check_devices(config, args.dev_root, args.sys_root, udev)
            port = opsserver.listen(args.metrics_address) if args.metrics_address else None
            settings = Settings(
                plugin_dir=args.plugin_dir,
                dev_root=args.dev_root,
                sys_root=args.sys_root,
                uevents=args.uevents,
                status_file=args.status_file,
                config_path=args.config,
                host_mountinfo=args.host_mountinfo,
                cdi_spec_dir=args.cdi_spec_dir,
                pod_resources_socket=args.pod_resources_socket,
                cdi_recheck_interval=args.cdi_recheck_interval,
                udev=udev,
                resource_name=args.resource_name,
                socket_name=args.socket_name,
                metrics_socket=port,
            )
            steps = stepwatch.from_environment()
            # What the imports made lives as long as the daemon. Collected
            # once now and frozen, the collector never scans it again: the
            # daemon's first full collection scans what the daemon made,
            # not every module (at 10,000 devices it took 20 to 35 ms, and
            # landed in the step that publishes the first scan).
            gc.collect()
            gc.freeze()
            try:
                trio.run(
                    supervisor.run_until_signalled,
                    partial(supervisor.run, settings, config),
                    instruments=[steps[0]] if steps else [],
                )
            finally:
                if steps:
                    stepwatch.write(*steps)
        else:
            from powerdev.devtools import local  # the fake kubelet: never in the daemon

            if args.config is not None:  # named by the user: it must exist and be good
                if not args.config.is_file():
                    raise ConfigError(
                        str(args.config), None, "does not exist", "give the path of a config.json"
                    )
                config = load_config(
                    args.config, resource_name=args.resource_name, socket_name=args.socket_name
                )
                ownership.check_devices(config, args.dev_root, args.sys_root, Pyudev())
            trio.run(
                supervisor.run_until_signalled,
                partial(
                    local.run_local,
                    config_path=args.config,
                    resource_name=args.resource_name,
                    socket_name=args.socket_name,
                    dev_root=args.dev_root,
                    sys_root=args.sys_root,
                    uevents=args.uevents,
                ),
            )
    except ConfigError as err:
        print(f"powerdev: bad config: {err}", file=sys.stderr)
        return 2
    return 0


def _scan(args: argparse.Namespace) -> int:
    """`powerdev scan`: exit 0 with the report for a valid config, 2 for a bad one."""
    from powerdev.devices.inuse import HostUseGuard
    from powerdev.devices.udevdb import Pyudev
    from powerdev.ops import scan
    from powerdev.resources import ownership

    try:
        config = load_config(
            args.config, resource_name=args.resource_name, socket_name=args.socket_name
        )
    except ConfigError as err:
        print(f"powerdev: bad config: {err}", file=sys.stderr)
        return 2
    for warning in config.warnings:  # what `powerdev run` logs at start, said the same way
        print(f"powerdev: warning: {warning}", file=sys.stderr)
    try:
        ownership.check_devices(config, args.dev_root, args.sys_root, Pyudev())
    except ConfigError as err:
        print(f"powerdev: bad config: {err}", file=sys.stderr)
        return 2
    guard = HostUseGuard(args.dev_root, args.sys_root, args.host_mountinfo, Path("/proc/swaps"))
    reports = scan.scan(config, args.dev_root, args.sys_root, Pyudev(), guard)
    print(scan.as_json(reports) if args.json else scan.as_text(reports))
    return 0


def metrics_address(text: str) -> str:
    """An argparse type: HOST:PORT, :PORT or [IPv6]:PORT (bound later)."""
    from powerdev.ops.opsserver import parse_address

    try:
        parse_address(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def _check_socket_paths(plugin_dir: Path, config: Config) -> None:
    """Refuse, at start, socket paths the kernel cannot bind or dial."""
    for name in (*(r.socket for r in config.resources), "kubelet.sock"):
        problem = socket_path_problem(plugin_dir, name)
        if problem:
            raise ConfigError(
                "--plugin-dir", None, problem, "use a shorter --plugin-dir, or shorter socket names"
            )


if __name__ == "__main__":
    sys.exit(main())
