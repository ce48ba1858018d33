"""The `webhook` and `bench-webhook` sub-commands: their arguments (each
with an environment variable) and how they start. Imports only argparse and
the standard library at the top, so `powerdev` stays light for the others."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

COMMANDS = ("webhook", "bench-webhook")


def _env(name: str, default: str) -> str:
    return os.environ.get(f"POWERDEV_WEBHOOK_{name}", default)


def add_parsers(sub: argparse._SubParsersAction, log_levels: tuple[str, ...]) -> None:
    from powerdev.webhook.config import (
        DEFAULT_CERT_DIR,
        DEFAULT_HANDSHAKE_SECONDS,
        DEFAULT_LISTEN,
        DEFAULT_MAX_BODY,
        DEFAULT_MAX_CONNECTIONS,
        DEFAULT_NAMESPACE,
        DEFAULT_REQUEST_SECONDS,
        DEFAULT_WEBHOOK_CONFIG,
    )

    hook = sub.add_parser(
        "webhook", help="serve the mutating admission webhook that adds the resource to pods"
    )
    hook.add_argument(
        "--config",
        type=Path,
        default=Path(_env("CONFIG", DEFAULT_WEBHOOK_CONFIG)),
        help="webhook.json; a missing file means defaults "
        f"[env POWERDEV_WEBHOOK_CONFIG; default {DEFAULT_WEBHOOK_CONFIG}]",
    )
    hook.add_argument(
        "--cert-dir",
        type=Path,
        default=Path(_env("CERT_DIR", DEFAULT_CERT_DIR)),
        help="directory with tls.crt and tls.key (a mounted Secret), reloaded on change "
        f"[env POWERDEV_WEBHOOK_CERT_DIR; default {DEFAULT_CERT_DIR}]",
    )
    hook.add_argument(
        "--listen",
        default=_env("LISTEN", DEFAULT_LISTEN),
        help=f"HOST:PORT to serve HTTPS on [env POWERDEV_WEBHOOK_LISTEN; default {DEFAULT_LISTEN}]",
    )
    hook.add_argument(
        "--namespace",
        default=_env("NAMESPACE", DEFAULT_NAMESPACE),
        help="the webhook's own namespace, whose pods it never mutates "
        f"[env POWERDEV_WEBHOOK_NAMESPACE; default {DEFAULT_NAMESPACE}]",
    )
    hook.add_argument(
        "--max-body",
        type=int,
        default=_env("MAX_BODY", str(DEFAULT_MAX_BODY)),
        help="largest request body accepted, in bytes "
        f"[env POWERDEV_WEBHOOK_MAX_BODY; default {DEFAULT_MAX_BODY}]",
    )
    hook.add_argument(
        "--max-connections",
        type=int,
        default=_env("MAX_CONNECTIONS", str(DEFAULT_MAX_CONNECTIONS)),
        help="connections kept open; past this a new one closes the oldest of the client "
        "holding the most (at most a quarter of the descriptor limit) "
        f"[env POWERDEV_WEBHOOK_MAX_CONNECTIONS; default {DEFAULT_MAX_CONNECTIONS}]",
    )
    hook.add_argument(
        "--request-seconds",
        type=float,
        default=_env("REQUEST_SECONDS", str(DEFAULT_REQUEST_SECONDS)),
        help="seconds a request has, from its first byte to the answer sent; then the "
        "connection is closed "
        f"[env POWERDEV_WEBHOOK_REQUEST_SECONDS; default {DEFAULT_REQUEST_SECONDS:g}]",
    )
    hook.add_argument(
        "--handshake-seconds",
        type=float,
        default=_env("HANDSHAKE_SECONDS", str(DEFAULT_HANDSHAKE_SECONDS)),
        help="seconds a TLS handshake has from the connection "
        f"[env POWERDEV_WEBHOOK_HANDSHAKE_SECONDS; default {DEFAULT_HANDSHAKE_SECONDS:g}]",
    )
    hook.add_argument(
        "--drain-seconds",
        type=float,
        default=_env("DRAIN_SECONDS", "5"),
        help="after SIGTERM, keep answering (not ready) this long before stopping "
        "[env POWERDEV_WEBHOOK_DRAIN_SECONDS; default 5]",
    )
    hook.add_argument(
        "--log-level",
        choices=log_levels,
        default=_env("LOG_LEVEL", "info"),
        help="[env POWERDEV_WEBHOOK_LOG_LEVEL; default info]",
    )

    bench = sub.add_parser(
        "bench-webhook", help="measure the real webhook process: review latency and memory"
    )
    bench.add_argument("--reviews", type=int, default=2000, help="reviews per run [default 2000]")
    bench.add_argument("--quick", action="store_true", help="a smoke run: 50 reviews")
    bench.add_argument("--json", type=Path, default=None, help="also write the figures here")
    bench.add_argument("--log-level", choices=log_levels, default="warning")


def main(args: argparse.Namespace) -> int:
    import trio

    from powerdev.config import ConfigError

    if args.command == "bench-webhook":
        from powerdev.devtools import webhook_bench
        from powerdev.devtools.bytecode import compile_for_bench

        compile_for_bench("powerdev bench-webhook")  # as in the image
        trio.run(webhook_bench.run_bench, 50 if args.quick else args.reviews, args.json)
        return 0

    from powerdev.webhook import server
    from powerdev.webhook.tls import KeyPairError

    problem = _settings_problem(args)
    if problem:
        print(f"powerdev webhook: {problem}", file=sys.stderr)
        return 2
    settings = server.Settings(
        config_path=args.config,
        cert_dir=args.cert_dir,
        listen=args.listen,
        namespace=args.namespace,
        max_body=args.max_body,
        drain_seconds=args.drain_seconds,
        max_connections=args.max_connections,
        request_seconds=args.request_seconds,
        handshake_seconds=args.handshake_seconds,
    )
    try:
        prepared = server.prepare(settings)
    except ConfigError as err:
        print(f"powerdev webhook: bad config: {err}", file=sys.stderr)
        return 2
    except KeyPairError as err:
        print(f"powerdev webhook: bad key pair: {err}", file=sys.stderr)
        return 2
    except server.ListenError as err:
        print(f"powerdev webhook: {err}", file=sys.stderr)
        return 2

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    trio.run(server.run_until_signalled, settings, prepared, say)
    return 0


def _settings_problem(args: argparse.Namespace) -> str | None:
    if args.max_body < 1024:
        return f"--max-body {args.max_body}: too small for any review; use at least 1024"
    if not 0 <= args.drain_seconds <= 60:
        return f"--drain-seconds {args.drain_seconds}: use 0 to 60"
    if not 1 <= args.max_connections <= 65536:
        return f"--max-connections {args.max_connections}: use 1 to 65536"
    if not 0 < args.request_seconds <= 300:
        return f"--request-seconds {args.request_seconds:g}: use more than 0, at most 300"
    if not 0 < args.handshake_seconds <= 60:
        return f"--handshake-seconds {args.handshake_seconds:g}: use more than 0, at most 60"
    _host, colon, port = args.listen.rpartition(":")
    if not colon or not port.isdigit() or int(port) > 65535:
        return f"--listen {args.listen!r}: use HOST:PORT, like 0.0.0.0:8443"
    return None
