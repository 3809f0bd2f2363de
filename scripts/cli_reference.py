"""Writes docs/reference/cli.md: every `hsmon` command's flags, from the real argument parsers.

usage: python scripts/cli_reference.py [--check]
(--check: exit 1 when the committed page differs from what the parsers say; tests/test_docs_site.py
runs it). The page is generated, never edited by hand: change a flag's help in its module, then rerun.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hsmon.cli import COMMANDS  # noqa: E402

PAGE = ROOT / "docs" / "reference" / "cli.md"
HEADER = """# Command-line reference

Every `hsmon` command and its flags, generated from the argument parsers themselves
(`python scripts/cli_reference.py`; a test fails when this page and the parsers differ).
`hsmon COMMAND --help` prints the same in a terminal. How-to guides show the flags in use.
"""


def cell(text: str) -> str:
    """Markdown-table-safe text on one line."""
    return " ".join(text.split()).replace("|", "\\|")


def flag_cell(action: argparse.Action) -> str:
    names = ", ".join(f"`{name}`" for name in action.option_strings) or f"`{action.metavar or action.dest}`"
    if action.nargs != 0 and action.option_strings:
        metavar = action.metavar or action.dest.upper()
        names += f" `{' '.join(metavar) if isinstance(metavar, tuple) else metavar}`"
    return names


def help_cell(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    text = parser._get_formatter()._expand_help(action) if action.help else ""
    if action.choices and "{" not in text:
        text += f" (one of: {', '.join(map(str, action.choices))})"
    return cell(text)


def command_section(name: str, module_name: str, helptext: str) -> list[str]:
    parser = argparse.ArgumentParser(prog=f"hsmon {name}", description=helptext)
    importlib.import_module(module_name).add_arguments(parser)
    lines = [f"## hsmon {name}", "", cell(helptext[0].upper() + helptext[1:]) + ".", "",
             "| flag | what it does |", "| --- | --- |"]
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
            continue
        lines.append(f"| {flag_cell(action)} | {help_cell(parser, action)} |")
    return [*lines, ""]


def render() -> str:
    lines = [HEADER]
    for name, (module_name, helptext) in COMMANDS.items():
        lines += command_section(name, module_name, helptext)
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    from generated_page import write_or_check  # beside this file

    return write_or_check(PAGE, render(), "parsers", "scripts/cli_reference.py")

if __name__ == "__main__":
    raise SystemExit(main())
