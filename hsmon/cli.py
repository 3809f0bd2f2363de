"""The `hsmon` command: a thin dispatcher that imports only the subcommand it runs.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and ``run(args) -> int``.
Heavy imports (torch, transformers, textual) stay inside ``run`` so that `hsmon daemon` and
`hsmon status` start fast beside a job that holds the machine.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
import signal
import sys
from typing import Any, NoReturn

from hsmon import __version__
from hsmon.contracts import stop_signals

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "regenerate": ("extractor.regenerate.cli", "the target answers a dataset's prompts again, in order"),
    "extract": ("extractor.cli", "extract hidden states from a target model into SpecForge-layout chunks"),
    "sglang-serve": ("extractor.sglang.serve", "start SGLang with the capture flags and hsmon's plugin"),
    "vllm-serve": ("extractor.vllm.serve", "start vLLM capturing hidden states (or serving a drafter)"),
    "daemon": ("hsmon.daemon", "watch jobs; serve /metrics, /api/v1/status and /healthz"),
    "run": ("hsmon.runner", "run any command (your own script) with a log and events: its ending is known"),
    "status": ("hsmon.status.cli", "one-shot status of a job, from a daemon or straight from paths"),
    "tui": ("hsmon.tui.cli", "the terminal dashboard"),
    "train": ("trainer.cli", "train an EAGLE-3 drafter on extracted hidden states"),
    "online": ("hsmon.online", "extract and train at once through a spool (extract + train --follow)"),
    "export-drafter": ("trainer.export", "export a drafter checkpoint in the layout SGLang and vLLM load"),
    "eval-drafter": ("trainer.evaluate", "measure a drafter's acceptance length against the target"),
    "verify-data": ("extractor.verify", "re-extract a sample of stored rows and compare them with the data"),
    "install-units": ("hsmon.install_units", "install the systemd units and the polkit rule"),
    "make-target": ("extractor.make_target", "build the embedded target, or a preset (--preset smollm2)"),
    "launched": ("hsmon.launch.child", "the first step of a training the daemon launched (not by hand)"),
}


class SuggestingParser(argparse.ArgumentParser):
    """An argparse parser whose refusal of a mistyped option is one line with the nearest options
    ("did you mean --chunk-size?"), also when the option misspelled is a required one (argparse says
    it is missing), and of a mistyped choice the same way (what Python 3.14's ``suggest_on_error``
    does for choices, on every Python); every other refusal is one line too, never a screen of usage."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._argv = list(sys.argv[1:] if args is None else args)  # for error(): what was typed
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments: "):
            self.exit(2, f"{self.prog}: {self.suggest(message.split(': ', 1)[1].split())}\n")
        if message.startswith("the following arguments are required: "):
            # a misspelled required option (--otu) is reported as the missing one (--out): say both
            typed = [w.split("=", 1)[0] for w in getattr(self, "_argv", []) if w.startswith("--")]
            unknown = [w for w in typed if w not in self._option_string_actions]
            if unknown:
                self.exit(2, f"{self.prog}: {self.suggest(unknown)}\n")
            missing = message.split(": ", 1)[1]
            self.exit(2, f"{self.prog}: {missing} missing (`{self.prog} --help` lists the options)\n")
        choice = re.match(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if choice:  # one line too: the value, the nearest choice, all of them
            names = re.findall(r"'([^']*)'", choice.group(3))
            near = difflib.get_close_matches(choice.group(2), names, n=1)
            hint = f"did you mean {near[0]}? " if near else ""
            self.exit(2, f"{self.prog}: {choice.group(1)} {choice.group(2)}: not a choice; {hint}"
                         f"(choose from {', '.join(names)})\n")
        self.exit(2, f"{self.prog}: {message} (`{self.prog} --help` lists the options)\n")

    def suggest(self, unknown: list[str]) -> str:
        """'unrecognized argument --chunksize: did you mean --chunk-size? (...)' for each unknown."""
        options = [o for o in self._option_string_actions if o.startswith("--")]
        said = []
        for word in unknown:
            flag = word.split("=", 1)[0]
            if not flag.startswith("-"):
                continue
            near = difflib.get_close_matches(flag, options, n=1, cutoff=0.8)
            said.append(f"{flag}: did you mean {near[0]}?" if near else f"{flag}: no such option")
        if not said:
            said = [f"{' '.join(unknown)}: not an argument this command takes"]
        return f"unrecognized argument {'; '.join(said)} (`{self.prog} --help` lists the options)"


def _top_level_help() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [f"usage: hsmon COMMAND [options]   (hsmon {__version__})", "", "commands:"]
    lines += [f"  {name:<{width}}  {helptext}" for name, (_, helptext) in COMMANDS.items()]
    lines += ["", "Run 'hsmon COMMAND --help' for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `hsmon` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_top_level_help())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"hsmon {__version__}")
        return 0
    name = argv[0]
    if name not in COMMANDS:
        near = difflib.get_close_matches(name, list(COMMANDS), n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        print(f"hsmon: unknown command {name!r}; {hint}run 'hsmon --help' for the list", file=sys.stderr)
        return 2
    try:
        return _run_command(name, argv[1:])
    except (KeyboardInterrupt, stop_signals.Interrupted) as exc:
        # a stop signal before the command installed its own handlers (while Python imports torch,
        # a model loads), or in a command with nothing to save: one line, 128 + the signal
        signum = getattr(exc, "signum", signal.SIGINT)
        stop_signals.say(f"hsmon {name}: stopped by {stop_signals.described(signum)}")
        return stop_signals.exit_status(signum)


def _run_command(name: str, argv: list[str]) -> int:
    module_name, helptext = COMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            print(f"hsmon: the {name!r} command is not available in this build", file=sys.stderr)
            return 2
        raise
    parser = SuggestingParser(prog=f"hsmon {name}", description=helptext)
    module.add_arguments(parser)
    args = parser.parse_args(argv)
    return int(module.run(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
