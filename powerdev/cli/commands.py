"""What each daemon-side sub-command does once its arguments are parsed:
`run`, `local`, `scan` and `bench`. Each returns the process's exit code:
0 done, 1 could not start (the host is not ready: a port taken), 2 a bad
config or option (the same for `run` and `scan`)."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from functools import partial
from pathlib import Path

from powerdev.config import Config, ConfigError, load_config, socket_path_problem
from powerdev.devices.udevdb import Pyudev, UdevDatabase

BAD_CONFIG, CANNOT_START = 2, 1


def load_checked(args: argparse.Namespace, udev: UdevDatabase, plugin_dir: Path | None) -> Config:
    """The config `run` and `scan` both check, in the same steps: the file,
    the socket paths it makes in plugin_dir (`local` has its own temp one),
    then one device to one resource (ConfigError for any)."""
    from powerdev.resources import ownership

    _check_dev_root(args.dev_root)
    config = load_config(
        args.config, resource_name=args.resource_name, socket_name=args.socket_name
    )
    if plugin_dir is not None:
        _check_socket_paths(plugin_dir, config)
    ownership.check_devices(config, args.dev_root, args.sys_root, udev)
    return config


def run(args: argparse.Namespace) -> int:
    """`powerdev run`: check everything that can be checked, bind the ops
    port, then hand over to the supervisor until a signal."""
    import trio

    from powerdev.daemon import supervisor
    from powerdev.daemon.settings import Settings
    from powerdev.devtools import stepwatch
    from powerdev.ops import opsserver
    from powerdev.support import allocator

    os.umask(0o077)  # our sockets are for the kubelet (root) only
    allocator.tune()  # before the daemon allocates much, and before any worker thread
    udev = Pyudev()
    try:
        config = load_checked(args, udev, args.plugin_dir)
        port = opsserver.listen(args.metrics_address) if args.metrics_address else None
    except ConfigError as err:
        return _say("bad config", err, BAD_CONFIG)
    except opsserver.ListenError as err:
        return _say("cannot start", err, CANNOT_START)
    dra = _dra_settings(args, config)
    if isinstance(dra, ConfigError):
        return _say("bad config", dra, BAD_CONFIG)
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
        health_interval=args.health_interval,
        udev=udev,
        resource_name=args.resource_name,
        socket_name=args.socket_name,
        metrics_socket=port,
        dra=dra,
    )
    steps = stepwatch.from_environment()
    # What the imports made lives as long as the daemon. Frozen, the
    # collector never scans it again: the daemon's first full collection
    # scans what the daemon made, not every module (at 10,000 devices it took
    # 20 to 35 ms, and landed in the step that publishes the first scan).
    # Frozen without a collection first: the collections during the imports
    # have already freed their garbage (a full one here found about a dozen
    # objects, and cost 50 to 70 ms of the start on a slow 2-core machine).
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
    return 0


def _dra_settings(args: argparse.Namespace, config: Config) -> object:
    """Where DRA is served, when a resource says "api": "dra": DraSettings,
    None, or a ConfigError when this node's name is not known."""
    from powerdev.daemon.settings import DraSettings

    dra = [r.name for r in config.resources if r.dra]
    if args.node_name is None:
        if not dra:
            return None
        return ConfigError(
            "--node-name",
            None,
            f'is needed by {dra[0]} ("api": "dra"): its ResourceSlices name this node',
            "set NODE_NAME from the downward API (fieldRef spec.nodeName), or pass --node-name",
        )
    if dra:
        problem = _dra_problem(args)
        if problem is not None:
            return problem
    return DraSettings(
        node_name=args.node_name,
        driver=args.dra_driver,
        kubeconfig=args.kubeconfig,
        plugins_dir=args.dra_plugins_dir,
        registry_dir=args.dra_registry_dir,
        boot_id=args.boot_id_file,
        lun_namespace=args.lun_namespace,
        lun_report_interval=args.lun_report_interval,
    )


def _dra_problem(args: argparse.Namespace) -> ConfigError | None:
    """What would stop the DRA driver serving: a socket path too long to
    bind, or no way to reach the API server."""
    from powerdev.config import socket_path_problem
    from powerdev.dra.names import endpoint, registration_socket

    driver = args.dra_driver
    for option, socket in (
        ("--dra-registry-dir", registration_socket(args.dra_registry_dir, driver)),
        ("--dra-plugins-dir", endpoint(args.dra_plugins_dir, driver)),
    ):
        problem = socket_path_problem(socket.parent, socket.name)
        if problem:
            return ConfigError(
                option, None, problem, f"use a shorter {option}, or a shorter --dra-driver"
            )
    from powerdev.dra import kubeapi  # lightkube: only when a resource says "dra"

    problem = kubeapi.config_problem(args.kubeconfig)
    if problem:
        return ConfigError(
            "--kubeconfig",
            None,
            problem,
            "pass a kubeconfig that can be read, or run in a pod whose service account "
            "token is mounted, without --kubeconfig",
        )
    return None


def local(args: argparse.Namespace) -> int:
    """`powerdev local`: the daemon and a fake kubelet, in a temp directory."""
    import trio

    from powerdev.daemon import supervisor
    from powerdev.devtools import local as local_runner  # the fake kubelet: never in the daemon

    os.umask(0o077)
    try:
        if args.config is not None:  # named by the user: it must exist and be good
            if not args.config.is_file():
                raise ConfigError(
                    str(args.config), None, "does not exist", "give the path of a config.json"
                )
            config = load_checked(args, Pyudev(), None)
            _check_local(args.config, config)
        else:
            _check_dev_root(args.dev_root)
    except ConfigError as err:
        return _say("bad config", err, BAD_CONFIG)
    trio.run(
        supervisor.run_until_signalled,
        partial(
            local_runner.run_local,
            config_path=args.config,
            resource_name=args.resource_name,
            socket_name=args.socket_name,
            dev_root=args.dev_root,
            sys_root=args.sys_root,
            uevents=args.uevents,
        ),
    )
    return 0


def _check_local(path: Path, config: Config) -> None:
    """`local` serves the device plugin API to a fake kubelet: it has no API
    server to publish ResourceSlices to, so a resource served through DRA
    is refused at once (ConfigError), not waited for."""
    for i, resource in enumerate(config.resources):
        if resource.dra:
            raise ConfigError(
                str(path),
                f"resources[{i}].api",
                f'{resource.name} says "{resource.api}": powerdev local runs a fake kubelet, '
                "with no API server for DRA",
                'set "api": "device-plugin" to try the resource with powerdev local, or serve '
                "it through DRA with powerdev run on a node (docs/dra.md)",
            )


def scan(args: argparse.Namespace) -> int:
    """`powerdev scan`: the config checked as `run` checks it, every warning
    `run` would give at start, then the report. Exit 0, or 2 for a bad config."""
    from powerdev.devices.table import HostFiles
    from powerdev.ops import scan as scanning

    udev = Pyudev()
    try:
        if not args.defaults_if_missing:
            _check_config_exists(args.config)
        config = load_checked(args, udev, args.plugin_dir)
    except ConfigError as err:
        return _say("bad config", err, BAD_CONFIG)
    host = HostFiles(args.host_mountinfo, Path("/proc/swaps"))
    reports = scanning.scan(config, args.dev_root, args.sys_root, udev, host)
    for warning in scanning.warnings(config, reports, args.dev_root, args.sys_root):
        print(f"powerdev: warning: {warning}", file=sys.stderr)
    print(scanning.as_json(reports) if args.json else scanning.as_text(reports))
    return 0


def bench(args: argparse.Namespace) -> int:
    """`powerdev bench`: the developer's measure."""
    import trio

    from powerdev.devtools import bench as benchmark
    from powerdev.devtools.bytecode import compile_for_bench

    compile_for_bench("powerdev bench")  # the daemon loads bytecode, as in the image
    plan = (
        benchmark.QUICK
        if args.quick
        else benchmark.Plan(sizes=tuple(int(n) for n in args.sizes.split(",")))
    )
    if args.node:
        from powerdev.devtools import node_bench

        if args.dra or args.luns or args.quick:
            print("powerdev bench --node: takes no --dra, --luns or --quick", file=sys.stderr)
            return 2

        problem = node_bench.problem()
        if problem:
            print(f"powerdev bench --node: {problem}", file=sys.stderr)
            return 1
        trio.run(partial(node_bench.run_bench, args.json))
        return 0
    if args.luns:
        from powerdev.devtools import lun_bench

        if args.dra:
            print("powerdev bench --luns: takes no --dra", file=sys.stderr)
            return 2
        problem = lun_bench.problem()
        if problem:
            print(f"powerdev bench --luns: {problem}", file=sys.stderr)
            return 1
        trio.run(partial(lun_bench.run_bench, plan, args.json))
        return 0
    if args.dra:
        from powerdev.devtools import dra_bench

        problem = dra_bench.problem()
        if problem:
            print(f"powerdev bench --dra: {problem}", file=sys.stderr)
            return 1
        trio.run(partial(dra_bench.run_bench, plan, args.json))
        return 0
    trio.run(partial(benchmark.run_bench, plan, args.json))
    return 0


def _say(what: str, err: Exception, code: int) -> int:
    print(f"powerdev: {what}: {err}", file=sys.stderr)
    return code


def _check_config_exists(path: Path) -> None:
    """What a checker says of a config file that is not there: `run` takes
    the defaults, but a check of a file that was never read checks nothing."""
    if not path.exists():
        raise ConfigError(
            str(path),
            None,
            "does not exist",
            "give the path of the config.json to check with --config (or POWERDEV_CONFIG), "
            "or pass --defaults-if-missing to check the defaults `run` uses without a file",
        )


def _check_dev_root(dev_root: Path) -> None:
    """Refuse a --dev-root that is not a directory: every pattern would match
    nothing, and say so only as 'can match nothing yet'."""
    if dev_root.is_dir():
        return
    problem = "is not a directory" if dev_root.exists() else "does not exist"
    raise ConfigError(
        "--dev-root",
        None,
        f"{dev_root} {problem}",
        "point --dev-root (or POWERDEV_DEV_ROOT) at the directory where the host's /dev "
        "is visible, e.g. /host/dev in the DaemonSet, or /dev on the host",
    )


def _check_socket_paths(plugin_dir: Path, config: Config) -> None:
    """Refuse, at start, socket paths the kernel cannot bind or dial."""
    for name in (*(r.socket for r in config.resources), "kubelet.sock"):
        problem = socket_path_problem(plugin_dir, name)
        if problem:
            raise ConfigError(
                "--plugin-dir", None, problem, "use a shorter --plugin-dir, or shorter socket names"
            )
