"""Go's path/filepath Match and Glob, for IBM's plugin's patterns.

IBM's plugin's include and exclude patterns are Go globs, so they mean here what
they mean in Go: `*` is any run of characters but '/', `?` one character but
'/', `[...]` a class of characters and ranges, negated by a leading `^` (not
`!`, which is a plain character), and a backslash makes the next character
literal. A malformed pattern (a class never closed, empty, or with a range
missing an end; a trailing backslash) is an error, never a silent non-match:
the whole pattern is checked, where Go stops reading at the first mismatch.

Each pattern is parsed once into chunks: a run of single-character terms,
each but the first led by a star. Matching runs Go's own algorithm over the
name's UTF-8 bytes, so its answers are Go's even where a backtracking regex
would differ: each chunk after a star takes the first place it fits and
nothing is tried again, so a match costs at most about len(pattern) *
len(name) steps, however many stars there are (a regex took seconds for
eight). Glob walks the tree one path element at a time, as Go's does.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

_META = frozenset("*?[\\")
_SLASH = ord("/")


class BadPattern(ValueError):
    """A pattern Go's filepath.Match would refuse; str() says what is wrong."""


def has_magic(pattern: str) -> bool:
    return any(c in _META for c in pattern)


def match(pattern: str, name: str) -> bool:
    """Go's filepath.Match(pattern, name); BadPattern for a malformed pattern."""
    return _matches(compile_pattern(pattern), _utf8(name))


def problem(pattern: str) -> str | None:
    """Why a pattern is malformed, or None."""
    try:
        compile_pattern(pattern)
    except BadPattern as err:
        return str(err)
    return None


@dataclass(frozen=True, slots=True)
class _Class:
    """One character (one UTF-8 sequence, or one byte that starts none, read
    as U+FFFD as Go reads it) in or, when negated, outside the ranges."""

    negated: bool
    ranges: tuple[tuple[int, int], ...]  # code points, lo <= hi

    def admits(self, rune: int) -> bool:
        for lo, hi in self.ranges:
            if lo <= rune <= hi:
                return not self.negated
        return self.negated


_ANY_BUT_SLASH = _Class(True, ((_SLASH, _SLASH),))  # '?'


@dataclass(frozen=True, slots=True)
class _Chunk:
    """Single-character terms, led by a star or not. A term is a byte (a
    literal, or one byte of one) or a _Class; runs of bytes are kept whole."""

    star: bool
    pieces: tuple[bytes | _Class, ...]
    terms: int  # how many terms, one byte or class each: what a try costs
    shortest: int  # the fewest bytes the terms consume (one each) ...
    longest: int  # ... and the most (a class takes up to four)


@functools.lru_cache(maxsize=1024)
def compile_pattern(pattern: str) -> tuple[_Chunk, ...]:
    """The pattern's chunks; BadPattern if it is malformed."""
    chunks: list[_Chunk] = []
    star = False
    terms: list[int | _Class] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if terms:
                chunks.append(_chunk(star, terms))
                terms = []
            star = True
            i += 1
        elif c == "?":
            terms.append(_ANY_BUT_SLASH)
            i += 1
        elif c == "\\":
            if i + 1 >= n:
                raise BadPattern("it ends with a backslash that escapes nothing")
            terms.extend(_utf8(pattern[i + 1]))
            i += 2
        elif c == "[":
            negated, ranges, i = _class_ranges(pattern, i + 1)
            terms.append(_Class(negated, tuple((ord(lo), ord(hi)) for lo, hi in ranges)))
        else:
            terms.extend(_utf8(c))
            i += 1
    if star or terms:
        chunks.append(_chunk(star, terms))
    return tuple(chunks)


def _chunk(star: bool, terms: list[int | _Class]) -> _Chunk:
    pieces: list[bytes | _Class] = []
    run = bytearray()
    for term in terms:
        if isinstance(term, int):
            run.append(term)
            continue
        if run:
            pieces.append(bytes(run))
            run.clear()
        pieces.append(term)
    if run:
        pieces.append(bytes(run))
    classes = sum(isinstance(t, _Class) for t in terms)
    return _Chunk(star, tuple(pieces), len(terms), len(terms), len(terms) + 3 * classes)


def _matches(chunks: tuple[_Chunk, ...], name: bytes) -> bool:
    """Go's Match over parsed chunks. A chunk led by a star may start
    anywhere from where the last one ended up to the next '/'; it takes the
    first start that fits (the last chunk: that fits and ends the name)."""
    end = len(name)
    at = 0
    slash = -1  # the first '/' at or after `at` (or `end`), once looked up
    for k, chunk in enumerate(chunks):
        final = k == len(chunks) - 1
        if chunk.star and slash < at:
            slash = name.find(b"/", at)
            if slash < 0:
                slash = end
        if not chunk.pieces:  # a trailing star takes the rest, if it has no '/'
            return slash == end
        first, last = at, (slash if chunk.star else at)
        if final:  # only a start from which the terms can reach the end
            first = max(first, end - chunk.longest)
            last = min(last, end - chunk.shortest)
        for start in range(first, last + 1):
            stop = _chunk_at(chunk, name, start)
            if stop >= 0 and (stop == end or not final):
                at = stop
                break
        else:
            return False
    return at == end


def _chunk_at(chunk: _Chunk, name: bytes, start: int) -> int:
    """Where the chunk's terms end when read from `start`, or -1. Costs at
    most one step a term (a class: one a range)."""
    i = start
    for piece in chunk.pieces:
        if isinstance(piece, bytes):
            if not name.startswith(piece, i):
                return -1
            i += len(piece)
        else:
            if i >= len(name):
                return -1
            rune, width = _rune_at(name, i)
            if not piece.admits(rune):
                return -1
            i += width
    return i


def _rune_at(name: bytes, i: int) -> tuple[int, int]:
    """The character at byte i and its length, as Go's utf8.DecodeRune
    reads it: a byte that starts no valid sequence is U+FFFD, one byte long."""
    lead = name[i]
    if lead < 0x80:
        return lead, 1
    if 0xC2 <= lead <= 0xDF:
        width = 2
    elif 0xE0 <= lead <= 0xEF:
        width = 3
    elif 0xF0 <= lead <= 0xF4:
        width = 4
    else:  # a continuation byte, or a lead no valid sequence has
        return 0xFFFD, 1
    if i + width <= len(name):
        try:
            return ord(name[i : i + width].decode("utf-8")), width
        except UnicodeDecodeError:
            pass
    return 0xFFFD, 1


def _utf8(text: str) -> bytes:
    """The bytes Go would see: undecodable bytes that Python carried as
    surrogates (os.fsdecode) go back to what they were."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that no byte stood for
        return text.encode("utf-8", "surrogatepass")


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
    in which one device could belong to two resources.) Any split of a name
    counts, not only Go's first fit, so the answer errs towards a clash;
    names are read as characters, so one that only matches by a star
    stopping inside a character is not seen.

    A table of "do a[i:] and b[j:] share a name?", filled from the ends
    back to (0, 0), one row at a time: len(a) * len(b) cells, no recursion
    (a recursive walk ran out of stack on patterns of a few hundred terms)."""
    ta, tb = _tokens(a), _tokens(b)
    below: list[bool] = []  # the row for a[i + 1:]
    for i in range(len(ta), -1, -1):
        x = ta[i] if i < len(ta) else None
        row = [False] * (len(tb) + 1)
        for j in range(len(tb), -1, -1):
            y = tb[j] if j < len(tb) else None
            if x is None and y is None:
                row[j] = True
            elif x is _STAR:  # a's star takes nothing more, or what b's next term takes
                row[j] = below[j] or (
                    y is not None and (y is _STAR or _meet(y, _NOT_SLASH)) and row[j + 1]
                )
            elif y is _STAR:
                row[j] = row[j + 1] or (x is not None and _meet(x, _NOT_SLASH) and below[j])
            elif x is not None and y is not None:
                row[j] = _meet(x, y) and below[j + 1]
        below = row
    return below[0]


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
