"""`hsmon run`: any command (your own extraction script) run with a log, progress events and a known
ending.

    cli.py           the flags and the run: the child, its output, its ending as an event
    rotating_log.py  the command's log, rotated by size
"""

from hsmon.runner.cli import add_arguments, job_name, run

__all__ = ["add_arguments", "job_name", "run"]
