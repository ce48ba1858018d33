"""The `powerdev` command: parse arguments, set up logging, and hand over to
the sub-command. parser.py builds the parser (options.py: the value types
and environment variables), commands.py runs the daemon-side commands,
webhook.py the webhook's. `powerdev health` is a probe: it imports only what
it needs, before logging or anything else is set up.

May import: support, devices, config, resources, ops, dra (its names), kubelet, daemon,
webhook, devtools. Nothing imports it; it reaches the gRPC door only
through the daemon.
"""

from __future__ import annotations

import logging
import sys

from powerdev.cli import luns as luns_cli
from powerdev.cli import webhook as webhook_cli
from powerdev.cli.options import env, one_of
from powerdev.cli.parser import build_parser
from powerdev.ops import logformat

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "health":  # a probe: the status file and one connect, nothing more
        from powerdev.ops import health

        return health.main(args.status_file, ready=args.ready, timeout=args.timeout)
    log_format = getattr(args, "log_format", None) or one_of(logformat.FORMATS)(
        env("LOG_FORMAT", "text")
    )
    logformat.configure(args.log_level, log_format)
    if args.log_level != "debug":
        # grpclib's and the API server client's per-request lines
        for noisy in ("grpclib", "httpx", "httpcore"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.command in webhook_cli.COMMANDS:
        return webhook_cli.main(args)
    if args.command == luns_cli.COMMAND:
        return luns_cli.main(args)
    from powerdev.cli import commands  # after logging is set up

    return {
        "run": commands.run,
        "local": commands.local,
        "scan": commands.scan,
        "bench": commands.bench,
    }[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
