"""How the command line reads values: each option's environment variable,
and the argparse types that check a value where it is given, so a bad flag
and a bad variable get the same one-line error and exit code 2."""

from __future__ import annotations

import argparse
import math
import os

LOG_LEVELS = ("debug", "info", "warning", "error")
UEVENT_SOURCES = ("auto", "udev", "kernel", "off")


def env(name: str, default: str) -> str:
    """POWERDEV_<name> from the environment, or the default."""
    return os.environ.get(f"POWERDEV_{name}", default)


def one_of(values: tuple[str, ...]):
    """An argparse type: one of `values`, in any case. argparse converts string
    defaults (our environment variables) with it too."""

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


def positive_seconds(high: float):
    """An argparse type: a number of seconds above 0, up to high (a wait that
    cannot end, or ends before it starts, is refused where it is given)."""

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not 0 < value <= high:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number of seconds above 0 and up to {high:g}"
            )
        return value

    convert.__name__ = "seconds"
    return convert


def metrics_address(text: str) -> str:
    """An argparse type: HOST:PORT, :PORT or [IPv6]:PORT (bound later)."""
    from powerdev.ops.opsserver import parse_address

    try:
        parse_address(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


class Parser(argparse.ArgumentParser):
    """Errors in one line, without the usage block: a log shows the line."""

    def error(self, message: str):  # type: ignore[no-untyped-def]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def dra_driver(text: str) -> str:
    """An argparse type: a DRA driver name, a DNS subdomain."""
    from powerdev.dra.names import driver_problem

    problem = driver_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{text!r} {problem}, such as dra.powerdev.io")
    return text
