"""A ledger's high-water mark rewritten in the format before the step ceiling
(``fedsim-hwm/1``: two 128-byte slots of count and last hash), as a ledger made by an earlier
fedsim holds it; from the format's definition, not from fedsim's encoder."""

from __future__ import annotations

import zlib
from pathlib import Path

from fedsim.privacy.ledger_mark import mark_path, read_mark


def old_slot(count: int, last_hash: str) -> bytes:
    body = f"fedsim-hwm/1 {count} {last_hash}"
    return f"{body} {zlib.crc32(body.encode()):08x}".encode().ljust(127) + b"\n"


def rewrite_as_old_mark(ledger: Path) -> None:
    """Replace ``ledger``'s mark by the old format's, with the same count and hash (the
    ledger must be closed)."""
    mark = read_mark(ledger)
    assert mark is not None
    mark_path(ledger).write_bytes(old_slot(mark.count, mark.last_hash) * 2)
    again = read_mark(ledger)
    assert again is not None and again.ceiling is None and again.count == mark.count
