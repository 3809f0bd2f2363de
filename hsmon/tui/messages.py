"""Messages that status sources post to the app (from their own threads: post_message is thread-safe)."""

from __future__ import annotations

from textual.message import Message

from hsmon.status_doc import StatusDocument


class StatusUpdate(Message):
    """A fresh status document from one source; ``skipped``: documents read since the previous one
    that differed from it only in their clocks (not sent: hsmon/tui/clocks.py)."""

    def __init__(self, source_id: int, document: StatusDocument, skipped: int = 0) -> None:
        super().__init__()
        self.source_id = source_id
        self.document = document
        self.skipped = skipped


class SourceDown(Message):
    """A source could not be read; it retries by itself after ``retry_in`` seconds."""

    def __init__(self, source_id: int, error: str, retry_in: float) -> None:
        super().__init__()
        self.source_id = source_id
        self.error = error
        self.retry_in = retry_in
