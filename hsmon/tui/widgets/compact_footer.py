"""The screens' footer: Textual's, compact (one row of keys without padding, so that 80 columns
hold the keys that matter)."""

from __future__ import annotations

from textual.widgets import Footer


def compact_footer() -> Footer:
    """Textual's Footer in its compact style. ``compact`` is set as the reactive it is: the
    constructor takes it only from Textual 6, and the declared floor (pyproject) is 5.0.1."""
    footer = Footer()
    footer.compact = True
    return footer
