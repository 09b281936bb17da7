"""Every error fedsim raises on purpose derives from :class:`FedsimError`.

The CLI turns a ``FedsimError`` into its message on stderr and exit status 2 (bad input) or 1
(a failure while running); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class FedsimError(Exception):
    """Root of all fedsim errors. ``exit_code`` is what the CLI exits with."""

    exit_code: int = 1


class ConfigError(FedsimError):
    """Bad user input: a scenario file, a CLI flag, a ledger file. Messages name the path."""

    exit_code = 2


class DataError(FedsimError):
    """A data set cannot be found, downloaded, verified or read."""

    exit_code = 2


class ModelError(ConfigError):
    """A model is unknown or cannot be trained with per-sample DP (e.g. it has BatchNorm)."""


class PrivacyError(FedsimError):
    """A privacy computation cannot be done as asked."""


class UnsupportedEventError(PrivacyError):
    """An accountant was given an event it cannot analyse (nothing was composed)."""

    exit_code = 2


class AccountantOutOfRange(PrivacyError):
    """An accountant cannot represent this history (the PLD's composed grid would be wider
    than it computes); another accountant may still bound it."""


class BudgetExhausted(PrivacyError):
    """Releasing the next update would push a client's ledger past its privacy budget."""


class LedgerError(PrivacyError):
    """A ledger file is unreadable or inconsistent (it is never silently reset)."""


class LedgerInUse(LedgerError):
    """Another process (or open file) holds a ledger's single-writer lock: nothing is wrong
    with the ledger, and it opens once that writer has stopped."""


class CodecError(FedsimError):
    """A wire message is malformed, truncated, oversized, of the wrong shape or not finite.

    ``kind`` names the defect for rejection counts (``malformed``, ``oversized``, ``shape``,
    ``non_finite``)."""

    def __init__(self, message: str, *, kind: str = "malformed") -> None:
        super().__init__(message)
        self.kind = kind


class TransportError(FedsimError):
    """Sending or receiving through a transport failed (broker down, auth refused, ...)."""


class AccessDenied(TransportError):
    """A peer tried to act as somebody it is not (wrong credentials, forged client id)."""
