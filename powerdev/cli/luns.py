"""The `luns` sub-command: the cluster-level writer of the pools of LUNs
that several nodes see ("scope": "cluster"; dra/lun_controller.py), run
as a Deployment of the same image, its replicas taking turns through a
Lease. Its arguments, each with an environment variable, and its start."""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import sys
from pathlib import Path

from powerdev.cli.options import dra_driver, env, positive_seconds
from powerdev.kubelet.paths import DEFAULT_DRA_DRIVER

COMMAND = "luns"


def add_parser(sub: argparse._SubParsersAction, log_levels: tuple[str, ...]) -> None:
    luns = sub.add_parser(
        COMMAND,
        help='publish the LUNs that nodes report for resources with "scope": "cluster", once '
        "for the cluster (a Deployment; its replicas elect a leader through a Lease)",
    )
    luns.add_argument(
        "--kubeconfig",
        type=Path,
        default=env("KUBECONFIG", "") or None,
        help="the API server [env POWERDEV_KUBECONFIG; default: the pod's service account]",
    )
    luns.add_argument(
        "--namespace",
        default=env("LUN_NAMESPACE", "power-device-plugin"),
        help="where the nodes' reports and the Lease are [env POWERDEV_LUN_NAMESPACE; "
        "default power-device-plugin]",
    )
    luns.add_argument(
        "--dra-driver",
        type=dra_driver,
        default=env("DRA_DRIVER", DEFAULT_DRA_DRIVER),
        help="the DRA driver whose reports are read and whose cluster pools are written "
        f"[env POWERDEV_DRA_DRIVER; default {DEFAULT_DRA_DRIVER}]",
    )
    luns.add_argument(
        "--report-ttl",
        type=positive_seconds(3600.0),
        metavar="SECONDS",
        default=env("LUN_REPORT_TTL", "30"),
        help="seconds a node's report may go unchanged (its heartbeat stopped) before the "
        "node leaves every LUN's selection; more than the nodes' --lun-report-interval "
        "[env POWERDEV_LUN_REPORT_TTL; default 30]",
    )
    luns.add_argument(
        "--lease-name",
        default=env("LUN_LEASE", "powerdev-luns"),
        help="the coordination.k8s.io Lease the replicas elect a leader with "
        "[env POWERDEV_LUN_LEASE; default powerdev-luns]",
    )
    luns.add_argument(
        "--lease-duration",
        type=positive_seconds(300.0),
        metavar="SECONDS",
        default=env("LUN_LEASE_DURATION", "15"),
        help="seconds a leader that stops renewing keeps the Lease; another takes over "
        "after that [env POWERDEV_LUN_LEASE_DURATION; default 15]",
    )
    luns.add_argument(
        "--identity",
        default=os.environ.get("POD_NAME") or None,
        help="this replica's name in the Lease [env POD_NAME; default: the host name and a "
        "random suffix]",
    )
    luns.add_argument(
        "--log-level",
        choices=log_levels,
        default=env("LOG_LEVEL", "info"),
        help="[env POWERDEV_LOG_LEVEL; default info]",
    )


def main(args: argparse.Namespace) -> int:
    import trio

    from powerdev.dra.kubeapi import config_problem
    from powerdev.dra.lun_controller import serve

    problem = config_problem(args.kubeconfig)
    if problem is not None:
        print(f"powerdev luns: {problem}", file=sys.stderr)
        return 2
    identity = args.identity or f"{socket.gethostname()}-{secrets.token_hex(3)}"
    trio.run(
        lambda: serve(
            kubeconfig=args.kubeconfig,
            namespace=args.namespace,
            driver=args.dra_driver,
            ttl=args.report_ttl,
            lease_name=args.lease_name,
            lease_duration=args.lease_duration,
            identity=identity,
        )
    )
    return 0
