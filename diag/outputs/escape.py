"""Names from the input made safe for the output they are written into, one helper per format.

A run's names (its id, hosts, groups, tags, phases, file names) are the input's: a name may hold
a terminal escape (ESC [ ... recolours or clears the screen, OSC 8 makes a link), a newline that
starts a forged line of the report, a backtick or a `<` that closes Markdown's code span or
opens raw HTML, or a lone surrogate that no output can encode. Each format's helper shows such a
character as a visible escape instead (`\\x1b`, `\\n`, `\\u202e`), and leaves every ordinary
character as it is, so a clean report reads the same. The HTML report escapes with
`html.escape` and the Perfetto export writes JSON; both are safe already.
"""

from __future__ import annotations

import html
import re

_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f"  # C0 and C1 controls: ESC, CSI, newline, carriage return, bell, ...
    "\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"  # bidi marks, line separators
    "\ud800-\udfff]"  # lone surrogates: not encodable as UTF-8
)
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[|~])")
"""Backslash-escaped in Markdown text: emphasis, code, a link's or an image's opening bracket
(a `]` without one opens nothing), a table cell's bar, strikethrough."""


def _shown(match: re.Match[str]) -> str:
    code = ord(match.group())
    return repr(match.group())[1:-1] if code < 0x100 else f"\\u{code:04x}"


def terminal(text: object) -> str:
    """One line of plain text for a terminal or a log: controls, bidi overrides, line
    separators and lone surrogates shown escaped (`\\x1b`, `\\n`, `\\u202e`)."""
    return _UNSAFE.sub(_shown, str(text))


def terminal_lines(lines: list[str]) -> str:
    """Lines the caller made, each escaped on its own, joined with newlines: a newline inside a
    line (from a name) is shown as `\\n`, never a line of its own."""
    return "\n".join(terminal(line) for line in lines)


def markdown(text: object) -> str:
    """Inline Markdown text (a list item, a table cell, a title): escaped for a terminal, HTML's
    `<` and `&` as entities (no raw HTML), and Markdown's emphasis, code, link and table
    characters backslash-escaped (`\\[PP001, ...]`)."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", html.escape(terminal(text), quote=False))


def markdown_code(text: object) -> str:
    """Text as an inline code span: fenced by one more backtick than the longest run of them in
    it (CommonMark), so a backtick in a name never closes the span; inside, `<` stays text."""
    shown = terminal(text)
    longest = max((len(run) for run in re.findall("`+", shown)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if shown.startswith("`") or shown.endswith("`") else ""
    return f"{fence}{pad}{shown}{pad}{fence}"
