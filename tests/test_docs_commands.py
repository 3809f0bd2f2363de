"""Every `hsmon` command line in README.md and docs/ is parsed by the real argument parsers: a flag
or value they refuse fails here, as does an option of one backend shown with another. Synopsis
lines (with [optional] parts or a|b choices) are skipped: they are grammar, not commands."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import shlex
from pathlib import Path

import pytest

from extractor.backend_options import EXTRACT_OPTIONS, misplaced_option
from hsmon.cli import COMMANDS

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```")


def command_lines(page: Path) -> list[tuple[int, str]]:
    """(line number, command) of each `hsmon ...` line in the page's fenced blocks, with its
    backslash continuations joined and a leading `$ ` or `VAR=... ` dropped."""
    found, inside, pending, start = [], False, "", 0
    for number, raw in enumerate(page.read_text().splitlines(), 1):
        if FENCE.match(raw.strip()):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        line = raw.strip()
        if pending:
            pending += " " + line.rstrip("\\").strip()
        else:
            line = re.sub(r"^(\$ |(?:[A-Z_]+=\S+ )+)", "", line)
            if not line.startswith("hsmon ") and not line.startswith(".venv/bin/hsmon "):
                continue
            pending, start = line.rstrip("\\").strip(), number
        if raw.rstrip().endswith("\\"):
            continue
        found.append((start, pending))
        pending = ""
    return found


def is_synopsis(command: str) -> bool:
    """Grammar ([optional] parts, a|b), a diagram, or a line the program printed (``hsmon x: ...``)."""
    return bool(re.search(r"\[|\]|\||\.\.\.|<|>|\{|│|\(", command)
                or re.match(r"\S+ [\w-]+:", command))


CASES = [(page, number, command) for page in PAGES for number, command in command_lines(page)
         if not is_synopsis(command)]


def parse(command: str) -> argparse.Namespace:
    words = shlex.split(command.split(" #", 1)[0])
    words = words[1:]  # the program
    name = words[0]
    assert name in COMMANDS, f"unknown command {name!r}"
    module = importlib.import_module(COMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"hsmon {name}")
    module.add_arguments(parser)
    rest = words[1:]
    if "--" in rest and name in ("run", "sglang-serve"):
        rest = [*rest[: rest.index("--") + 1], "CMD"]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parser.parse_args(rest)
    except SystemExit:
        raise AssertionError(err.getvalue().strip().splitlines()[-1]) from None
    if name == "extract":
        refusal = misplaced_option(args, args.backend, EXTRACT_OPTIONS, module.add_arguments)
        assert refusal is None, refusal
    return args


def test_the_docs_hold_commands():
    assert len(CASES) >= 20, [c for _, _, c in CASES]


@pytest.mark.parametrize(("page", "number", "command"), CASES,
                         ids=[f"{p.name}:{n}" for p, n, _ in CASES])
def test_command_parses(page, number, command):
    parse(command)


def synopsis_blocks(page: Path) -> list[tuple[int, str, str]]:
    """(line, command name, text) of each synopsis: a grammar line `hsmon NAME [...]` and the
    indented lines that continue it."""
    found, inside, current = [], False, None
    for number, raw in enumerate(page.read_text().splitlines(), 1):
        if FENCE.match(raw.strip()):
            inside, current = not inside, None
            continue
        if not inside:
            continue
        match = re.match(r"^hsmon ([a-z-]+) ", raw)
        if match and match.group(1) in COMMANDS and is_synopsis(raw) and not re.match(r"\S+ [\w-]+:", raw):
            current = [number, match.group(1), raw]
            found.append(current)
        elif current is not None and raw.startswith(" ") and raw.strip().startswith("["):
            current[2] += " " + raw.strip()
        else:
            current = None
    return [tuple(x) for x in found]


SYNOPSES = [(page, *block) for page in PAGES for block in synopsis_blocks(page)]


@pytest.mark.parametrize(("page", "number", "name", "text"), SYNOPSES,
                         ids=[f"{p.name}:{n}" for p, n, _, _ in SYNOPSES])
def test_synopsis_flags_exist_and_their_example_values_parse(page, number, name, text):
    """Every --flag a synopsis shows exists; a concrete default it shows (`[--port 9108]`) is a
    value the parser takes (placeholders in capitals are left alone)."""
    module = importlib.import_module(COMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"hsmon {name}")
    module.add_arguments(parser)
    actions = parser._option_string_actions
    for flag, value in re.findall(r"(--[a-z0-9-]+)(?:[ =]([^\s\[\]|]+))?", text.split(" -- ")[0]):
        assert flag in actions, f"{flag} is not an option of hsmon {name}"
        action = actions[flag]
        if not value or value.startswith("-") or not re.search(r"[a-z0-9]", value) or value.isupper():
            continue
        if action.choices is not None:
            assert all(v in action.choices for v in value.split("|")), f"{flag} {value}: not a choice"
        elif callable(action.type) and action.nargs != 0:
            try:
                action.type(value)
            except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
                raise AssertionError(f"{flag} {value}: the parser refuses it ({exc})") from None


FILE_REFERENCE = re.compile(
    r"(?<![\w/.-])((?:hsmon|extractor|trainer|tests|bench|docs|scripts|systemd|dashboards|examples)/"
    r"[\w./-]*\w|[\w-]+\.md)\b")


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_pages_name_only_files_that_exist_and_no_internal_issue_numbers(page):
    text = page.read_text()
    missing = sorted({m for m in FILE_REFERENCE.findall(text)
                      if not (ROOT / m).exists() and not (ROOT / "docs" / m).exists()})
    assert not missing, f"{page.name} names files that are not in the repository: {missing}"
    numbers = re.findall(r"\b(?:issues?|task) #?\d+\b", text)
    assert not numbers, f"{page.name} cites internal tracker numbers: {numbers}"


@pytest.mark.parametrize(("page", "number", "name", "text"), SYNOPSES,
                         ids=[f"{p.name}:{n}" for p, n, _, _ in SYNOPSES])
def test_synopsis_defaults_are_the_parsers(page, number, name, text):
    """A concrete value a synopsis shows in `[--flag VALUE]` is the flag's default, read from the
    parser (or from the daemon's configuration defaults, for flags whose parser default is None)."""
    from hsmon.core import config as cfgmod

    module = importlib.import_module(COMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"hsmon {name}")
    module.add_arguments(parser)
    actions = parser._option_string_actions
    fallback = {"--host": cfgmod.DEFAULT_HOST, "--port": cfgmod.DEFAULT_PORT,
                "--scan-interval": cfgmod.DEFAULT_SCAN_INTERVAL, "--notify-repeat": 3600.0,
                "--stall-after": cfgmod.DEFAULT_STALL_AFTER}
    for flag, value in re.findall(r"\[(--[a-z0-9-]+)[ =]([^\s\[\]|]+)\]", text.split(" -- ")[0]):
        action = actions[flag]
        if value.isupper() or not re.search(r"[0-9]", value) or action.nargs == 0:
            continue  # a placeholder or a word, not a default
        default = action.default if action.default is not None else fallback.get(flag)
        if default is None or isinstance(default, list):
            continue
        parsed = action.type(value) if callable(action.type) else value
        assert parsed == default, f"{page.name}:{number}: {flag} {value} but the default is {default!r}"
