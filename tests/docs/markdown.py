"""The docs as data: the fenced blocks of README.md and docs/*.md with the
HTML comment that says what a test does with each, their links, and their
headings' anchors as GitHub makes them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\S*)\s*$")
MARKER = re.compile(r"^<!--\s*(.*?)\s*-->$")
KINDS = ("run", "output", "output of", "file", "config", "render", "not run")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str  # the lines between the fences, each ending in a newline
    kind: str | None  # None: no marker comment before it
    value: str = ""
    options: dict[str, str] = field(default_factory=dict)
    end: int = 0  # 1-based line of the closing fence

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def parse_marker(comment: str) -> tuple[str, str, dict[str, str]] | None:
    """'run: mapper; exit: 2' -> ('run', 'mapper', {'exit': '2'})."""
    for kind in sorted(KINDS, key=len, reverse=True):
        if comment == kind or comment.startswith(kind + ":"):
            rest = comment[len(kind) + 1 :].strip()
            value, *pairs = [p.strip() for p in rest.split("; ")] if rest else [""]
            options = {}
            for pair in pairs:
                key, _, val = pair.partition(":")
                options[key.strip()] = val.strip()
            return kind, value, options
    return None


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and lines[i] != "```":
            i += 1
        text = "".join(line + "\n" for line in lines[start + 1 : i])
        before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        comment = MARKER.match(before.strip())
        parsed = parse_marker(comment.group(1)) if comment else None
        kind, value, options = parsed if parsed else (None, "", {})
        found.append(Block(page, start + 1, opening.group(1), text, kind, value, options, i + 1))
        i += 1
    return found


def prose(page: Path) -> str:
    """The page without its fenced blocks."""
    out, inside = [], False
    for line in page.read_text().splitlines():
        if FENCE.match(line) or (inside and line == "```"):
            inside = not inside
            continue
        if not inside:
            out.append(line)
    return "\n".join(out)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m.group(2)) for m in map(HEADING.match, prose(page).splitlines()) if m}


def links(page: Path) -> list[str]:
    return LINK.findall(re.sub(r"`[^`]*`", "", prose(page)))
