"""Go's path/filepath Match and Glob, for the seed's patterns.

The seed's include and exclude patterns are Go globs, so they mean here what
they mean in Go: `*` is any run of characters but '/', `?` one character but
'/', `[...]` a class of characters and ranges, negated by a leading `^` (not
`!`, which is a plain character), and a backslash makes the next character
literal. A malformed pattern (a class never closed, empty, or with a range
missing an end; a trailing backslash) is an error, never a silent non-match.

Each pattern is compiled once to an anchored regular expression. Glob walks
the tree one path element at a time, as Go's does.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

_META = frozenset("*?[\\")


class BadPattern(ValueError):
    """A pattern Go's filepath.Match would refuse; str() says what is wrong."""


def has_magic(pattern: str) -> bool:
    return any(c in _META for c in pattern)


def match(pattern: str, name: str) -> bool:
    """Go's filepath.Match(pattern, name); BadPattern for a malformed pattern."""
    return compile_pattern(pattern).fullmatch(name) is not None


def problem(pattern: str) -> str | None:
    """Why a pattern is malformed, or None."""
    try:
        compile_pattern(pattern)
    except BadPattern as err:
        return str(err)
    return None


@functools.lru_cache(maxsize=1024)
def compile_pattern(pattern: str) -> re.Pattern[str]:
    parts: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            parts.append("[^/]*")
            i += 1
        elif c == "?":
            parts.append("[^/]")
            i += 1
        elif c == "\\":
            if i + 1 >= n:
                raise BadPattern("it ends with a backslash that escapes nothing")
            parts.append(re.escape(pattern[i + 1]))
            i += 2
        elif c == "[":
            regex, i = _class(pattern, i + 1)
            parts.append(regex)
        else:
            parts.append(re.escape(c))
            i += 1
    return re.compile("".join(parts), re.DOTALL)


def _class_ranges(pattern: str, i: int) -> tuple[bool, tuple[tuple[str, str], ...], int]:
    """A character class starting after its '[': negated?, its ranges (a
    reversed one, which matches nothing in Go, left out), and where it ends."""
    negated = i < len(pattern) and pattern[i] == "^"
    if negated:
        i += 1
    ranges: list[tuple[str, str]] = []
    while True:
        if i < len(pattern) and pattern[i] == "]" and ranges:
            return negated, tuple(r for r in ranges if r[0] <= r[1]), i + 1
        lo, i = _class_char(pattern, i)
        hi = lo
        if pattern[i] == "-":
            hi, i = _class_char(pattern, i + 1)
        ranges.append((lo, hi))


def _class(pattern: str, i: int) -> tuple[str, int]:
    """A character class starting after its '['; its regex and where it ends."""
    negated, ranges, i = _class_ranges(pattern, i)
    members = "".join(_code(lo) if lo == hi else f"{_code(lo)}-{_code(hi)}" for lo, hi in ranges)
    if not members:  # only reversed ranges: they match nothing, as in Go
        return ("(?s:.)" if negated else "(?!)"), i
    return f"[{'^' if negated else ''}{members}]", i


def _class_char(pattern: str, i: int) -> tuple[str, int]:
    """One possibly escaped character of a class, as Go's getEsc reads it."""
    if i >= len(pattern):
        raise BadPattern("a '[' is never closed")
    c = pattern[i]
    if c in "-]":
        raise BadPattern(
            "a character class is empty or has a range without a start or end "
            f"(a bare {c!r}; write it as '\\{c}')"
        )
    if c == "\\":
        i += 1
        if i >= len(pattern):
            raise BadPattern("it ends with a backslash that escapes nothing")
        c = pattern[i]
    if i + 1 >= len(pattern):
        raise BadPattern("a '[' is never closed")
    return c, i + 1


def _code(c: str) -> str:
    return f"\\U{ord(c):08x}"


def glob(root: Path, pattern: str) -> list[str]:
    """The paths under `root` that an absolute pattern matches, as absolute
    paths relative to root ("/dev/pattern" under root /host/dev). Each
    element is matched against directory entries as Go's Glob does."""
    elements = [e for e in pattern.split("/") if e]
    found = [""]
    for depth, element in enumerate(elements):
        last = depth == len(elements) - 1
        following = []
        for prefix in found:
            here = root / prefix.lstrip("/") if prefix else root
            if not has_magic(element):
                name = re.sub(r"\\(.)", r"\1", element)
                if last or (here / name).is_dir():
                    following.append(f"{prefix}/{name}")
                continue
            try:
                entries = sorted(os.scandir(here), key=lambda e: e.name)
            except OSError:
                continue
            for entry in entries:
                if match(element, entry.name) and (last or _is_dir(entry)):
                    following.append(f"{prefix}/{entry.name}")
        found = following
    return [p for p in found if p] if elements else []


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


# --- overlap: can two patterns match one name? ------------------------------

_STAR = ("star",)
_NOT_SLASH = (True, (("/", "/"),))  # a charset: (negated, ranges)


def overlap(a: str, b: str) -> bool:
    """Is there a name that both patterns match? (Used to refuse configs
    in which one device could belong to two resources.)"""
    ta, tb = _tokens(a), _tokens(b)

    @functools.cache
    def common(i: int, j: int) -> bool:
        if i == len(ta) and j == len(tb):
            return True
        if i < len(ta) and ta[i] is _STAR:
            if common(i + 1, j):
                return True
            if j < len(tb) and tb[j] is not _STAR and _meet(tb[j], _NOT_SLASH):
                return common(i, j + 1)
            return j < len(tb) and tb[j] is _STAR and common(i, j + 1)
        if j < len(tb) and tb[j] is _STAR:
            if common(i, j + 1):
                return True
            return i < len(ta) and _meet(ta[i], _NOT_SLASH) and common(i + 1, j)
        if i == len(ta) or j == len(tb):
            return False
        return _meet(ta[i], tb[j]) and common(i + 1, j + 1)

    return common(0, 0)


def _tokens(pattern: str) -> tuple[object, ...]:
    """A checked pattern as tokens: _STAR, or a charset for one character."""
    compile_pattern(pattern)  # raises BadPattern for a malformed one
    out: list[object] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "*":
            if not out or out[-1] is not _STAR:
                out.append(_STAR)
            i += 1
        elif c == "?":
            out.append(_NOT_SLASH)
            i += 1
        elif c == "\\":
            out.append((False, ((pattern[i + 1], pattern[i + 1]),)))
            i += 2
        elif c == "[":
            negated, ranges, i = _class_ranges(pattern, i + 1)
            out.append((negated, ranges))
        else:
            out.append((False, ((c, c),)))
            i += 1
    return tuple(out)


def _meet(x: object, y: object) -> bool:
    """Do two charsets share a character?"""
    (nx, rx), (ny, ry) = x, y  # type: ignore[misc]
    if nx and ny:
        return True  # each leaves out finitely many characters
    if nx:
        (nx, rx), (ny, ry) = (ny, ry), (nx, rx)
    if not ny:
        return any(a_lo <= b_hi and b_lo <= a_hi for a_lo, a_hi in rx for b_lo, b_hi in ry)
    return any(_outside(lo, hi, ry) for lo, hi in rx)


def _outside(lo: str, hi: str, ranges: tuple[tuple[str, str], ...]) -> bool:
    """Is some character of lo..hi outside every one of the ranges?"""
    point = ord(lo)
    for r_lo, r_hi in sorted((ord(a), ord(b)) for a, b in ranges):
        if r_hi < point:
            continue
        if r_lo > point:
            break
        point = r_hi + 1
    return point <= ord(hi)
