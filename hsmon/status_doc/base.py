"""What every section type shares: a number that may be an int or a float, and the Struct base."""

from __future__ import annotations

from typing import Union

import msgspec

# A figure as measured: an int stays an int, a float a float (the JSON keeps today's text).
Num = Union[int, float]  # noqa: UP007 (msgspec reads the annotation at runtime)


class Section(msgspec.Struct, kw_only=True):
    """A section of the status document. Fields left ``UNSET`` are omitted from the JSON."""
