"""The text of a Textual screenshot (the SVG the snapshot tests store), row by row, and the checks
the snapshot tests make on it: long floats, empty rows above the footer."""

from __future__ import annotations

import html
import re

CHAR_WIDTH = 12.2  # Textual's SVG export: pixels per terminal column
_TEXT = re.compile(
    r'<text [^>]*?x="([\d.]+)"[^>]*?clip-path="url\(#terminal-[\w-]*?line-(\d+)\)"[^>]*>([^<]*)</text>'
)
_FLOAT = re.compile(r"(?<![\w.])\d[\d,]*\.\d+(?![\w.])")


def screen_lines(svg: str) -> list[str]:
    """Every terminal row of the screenshot as plain text."""
    rows: dict[int, dict[int, str]] = {}
    for x, line, content in _TEXT.findall(svg):
        rows.setdefault(int(line), {})[round(float(x) / CHAR_WIDTH)] = html.unescape(content).replace(
            "\xa0", " "
        )
    lines = []
    for index in range(max(rows, default=-1) + 1):
        cells: list[str] = []
        for col, text in sorted(rows.get(index, {}).items()):
            cells.extend(" " * (col - len(cells)))
            cells[col : col + len(text)] = list(text)
        lines.append("".join(cells).rstrip())
    return lines


def significant_digits(number: str) -> int:
    digits = number.replace(",", "").replace(".", "").lstrip("0")
    return len(digits)


def long_floats(lines: list[str], most: int = 4) -> list[str]:
    """Decimal numbers printed with more than ``most`` significant digits (versions like 0.1.0 and
    addresses like 127.0.0.1 are not one number and are skipped)."""
    return [
        m.group(0) for line in lines for m in _FLOAT.finditer(line) if significant_digits(m.group(0)) > most
    ]


def empty_rows_above_footer(lines: list[str]) -> int:
    """Blank rows (or rows of only a scroll container's edge) between the last content and the
    footer (the last row)."""
    count = 0
    for line in reversed(lines[:-1]):
        if line.strip(" │▕▏▐▌"):
            break
        count += 1
    return count
