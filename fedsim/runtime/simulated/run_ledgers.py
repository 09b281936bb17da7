"""A simulated run's ledgers: one durable file a client under the run's ``ledgers/`` folder.

Durability (:mod:`fedsim.privacy.ledger`'s "Durability rule"): every spend is written through
to its file, and the run makes all its ledgers durable together, in one file-system sync
(``syncfs(2)``), before the outputs that report them; where ``syncfs`` is missing (not Linux)
each spend is fsynced instead. A run of more clients than this process may keep files open for
(``RLIMIT_NOFILE``, :func:`~fedsim.runtime.simulated.memory.ledger_handles_fit`) writes them
under one :class:`~fedsim.privacy.ledger_directory_lock.DirectoryLock`, keeping no file open
between spends: the same files, byte for byte.
"""

from __future__ import annotations

from pathlib import Path

from fedsim.atomic import FileSystemSync
from fedsim.errors import LedgerError
from fedsim.logging import get_logger
from fedsim.privacy.ledger import PrivacyLedger
from fedsim.privacy.ledger_directory_lock import DirectoryLock
from fedsim.runtime.assembly import open_ledger
from fedsim.runtime.population import ClientPlan
from fedsim.runtime.run_outputs import LEDGER_DIR, ledger_file
from fedsim.runtime.simulated.memory import ledger_handles_fit

__all__ = ["RunLedgers"]

_log = get_logger("fedsim.runtime.simulated.run_ledgers")


class RunLedgers:
    """Where a run's clients' ledgers are opened (again, after a crash), how their spends
    reach the disk, and the lock they are written under."""

    def __init__(self, out_dir: Path, clients: int) -> None:
        self.out_dir = out_dir
        self.directory = out_dir / LEDGER_DIR
        self.directory.mkdir(parents=True, exist_ok=True)
        self.lock = None if ledger_handles_fit(clients) else DirectoryLock(self.directory)
        self.fsync_each_spend = not FileSystemSync.AVAILABLE  # else written through, synced once
        try:
            self._sync = None if self.fsync_each_spend else FileSystemSync(self.directory)
        except BaseException:
            self.close()
            raise

    def open(self, plan: ClientPlan) -> PrivacyLedger:
        """``plan``'s client's ledger (resumed from its file if it has one: a rejoining
        client's spending is never forgotten)."""
        return open_ledger(plan, ledger_file(self.out_dir, plan.client_id), self.lock,
                           fsync=self.fsync_each_spend)

    def make_durable(self) -> None:
        """Make every ledger's spends durable, in one file-system sync, before the outputs
        that report them (once; nothing to do where each spend was fsynced). Raises
        :class:`LedgerError` if the disk failed to take them."""
        sync, self._sync = self._sync, None
        if sync is None:
            return
        try:
            sync.sync()
        except OSError as exc:
            raise LedgerError(
                f"{sync.directory}: the run's ledgers could not be made durable ({exc}); "
                f"nothing more was written. Check the disk, then `fedsim ledger check` the "
                f"ledgers: what they hold now is what the run spent, unless the machine "
                f"stops before they reach the disk") from None
        finally:
            sync.close()

    def make_durable_or_log(self) -> None:
        """:meth:`make_durable` for a run that failed or was interrupted: a failure is
        logged, not raised (the run's own error, or its partial outputs, come first)."""
        try:
            self.make_durable()
        except LedgerError as exc:
            _log.error("ledgers not made durable", error=str(exc))

    def close(self) -> None:
        """Release the directory lock (after the ledgers are closed); idempotent."""
        if self.lock is not None:
            self.lock.close()
