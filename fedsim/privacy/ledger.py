"""A client's durable privacy ledger: every release is written to disk before it happens.

File format, hash chain, high-water mark and lock: see :mod:`fedsim.privacy.ledger_file`.

Durability rule. :meth:`PrivacyLedger.spend` writes its lines with ``os.write`` on a descriptor
held open (continued after a short write), then ``os.fsync``, then moves the high-water mark
(fsynced), and only then returns (and
the caller releases the update). A spend is *acknowledged* when it returns. A new ledger is created without an
fsync (header and a mark of 0 records, written): its first spend makes them durable, the mark
and the directory's entries (one directory fsync covers every ledger created before it)
before its own records, so a run of 10^3 clients on a disk does not start with 3,000 fsyncs
(2.5-16 ms a ledger on this project's machine, docs/SCALE.md) and nothing that was acknowledged
depends on an entry that is not on disk.

A simulated run's ledgers are opened with ``fsync=False`` (on Linux, which has ``syncfs(2)``):
each spend is written through with ``os.write`` before it returns (records, then mark), so it
survives the process being killed as a deployed client's does, and the run makes all its
ledgers durable with one file-system sync (:class:`fedsim.atomic.FileSystemSync`) before it
writes its summary. What that gives up is a power failure's mid-run only, which loses the run
in any case: its releases are virtual (the server that received them is in the same process
and dies with it), a simulated run is never resumed (its directory is not reused), and its
ledgers may then read short or damaged. Two fsyncs a round cost a quarter of a 1,000-client
run's CPU and wall time on this project's disk (docs/SCALE.md, "Ledger sync"). What
:meth:`PrivacyLedger.open` finds in a file, and does about it: :mod:`fedsim.privacy.ledger_open`.

Time. Records' times never go back: :meth:`PrivacyLedger.spend` refuses a time before the
last record's, and :attr:`PrivacyLedger.last_time` is where a restarted client's clock starts.

Enforcement uses a guarantee: the ledger's accountant if it is one (``pld``, ``rdp``),
otherwise ``pld`` (``gdp-clt`` is an approximation and never enforces a budget). Where that
accountant has no finite answer (the PLD grid cannot resolve some long histories of tiny
per-step loss), the other guarantee's is used: the reported eps and every budget test are the
smallest valid bound (:func:`~fedsim.privacy.budget.within`, :func:`fedsim.privacy.accountant.smallest_epsilon`).

Speed. The runtime asks :meth:`can_spend` every round for hundreds of clients. The ledger keeps
an *allowance*: a step kind E (sampling, q, sigma) and how many more E-steps surely fit in the
budget from the current state, found once by doubling (from the previous allowance's count)
and, only when a check asks for more than that lower bound, bisection to the exact count. A
round whose steps all have q <= E's and sigma >= E's is dominated by as many E-steps (see
:func:`~fedsim.privacy.budget.envelope`), so it fits if its count is within the allowance, and spending it uses that
much of the allowance: a round of an unchanged posture is answered in O(1) by counting, with
no accountant evaluation. Only a posture the allowance does not cover (a schedule step, a new
sigma) computes a new one. A posture that moves past the last one gets an envelope widened
by 1/16 in the direction it moved, so a schedule that changes sigma every round (growing mu_t)
computes a new allowance only every few percent of drift, not every round: 10^4 such rounds
cost O(100) evaluations instead of 10^4 (each of which costs more as the history grows).
A round of several kinds of step that its envelope cannot answer for (one kind's q and
another's sigma together price every step at the worst) gets, once it repeats, an allowance
of whole rounds of exactly its kinds (:class:`~fedsim.privacy.budget.RoundAllowance`): an
unchanged round of a q = 0.01 step and a q = 1 step was an allowance search and a dry run each
round (1,036 rounds in 150 s), and is counted now (0.13 s).

The answers are the accountant's own, for an unchanged posture exactly: "fits" means that
eps of the history with each round replaced by E-steps is within the budget (a valid upper
bound: a dominated step is a garbling of its envelope), and "does not fit" is only ever
answered by the exact count of the round's own kind, or by a dry run of the round. When a
widened envelope runs out, the allowance is recomputed for the round's own kind, so the
boundary step is decided by the accountant exactly as a fresh one would. Like the plan below,
this relies on eps growing with every composed step (and shrinking with q and 1/sigma).

Changing schedules can also be registered ahead with :meth:`plan`. The ledger then finds, once,
how many of the planned rounds fit: the whole plan first (one evaluation), otherwise a
galloping search that extends one dry-run accountant along the plan (k = 1, 2, 4, ... rounds)
and bisects the last bracket from a copy, so each planned step is composed O(1) times and the
accountant is evaluated O(log T) times. The PLD accountant composes incrementally (see
:mod:`fedsim.privacy.pld_state`) and its eps is a function of the multiset of steps, bit for
bit, however they were fed. While the client spends exactly the planned rounds in order,
:meth:`can_spend` for the next planned round is answered by counting; the answer is the one
the full check gives, because the accountant's state is a function of the multiset of steps
(:func:`group_steps` sorts) and "recorded + next round" is then exactly "recorded at plan time
+ the first k planned rounds". Anything off the plan drops it and falls back to the allowance.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Self

from fedsim.atomic import uninterrupted
from fedsim.errors import BudgetExhausted, ConfigError, LedgerError, UnsupportedEventError
from fedsim.privacy.accountant import (
    Accountant,
    make_accountant,
    make_accountant_class,
    smallest_epsilon,
)
from fedsim.privacy.affordability import Affordability
from fedsim.privacy.budget import (
    Budget,
    within,
)
from fedsim.privacy.epsilon_text import epsilon_text
from fedsim.privacy.events import (
    SAMPLING_SCHEMES,
    GaussianStep,
    Sampling,
    TunedSelection,
    group_steps,
)
from fedsim.privacy.ledger_directory_lock import DirectoryLock
from fedsim.privacy.ledger_file import (
    LEDGER_FORMAT,
    LedgerRecord,
    MarkFile,
    append_durably,
    encode_record,
    entry_created,
    header_of,
    line_hash,
    open_append,
    read_ledger_bytes,
    read_verified,
    sync_entries,
    sync_file,
)
from fedsim.privacy.ledger_mark import (
    NO_STEPS,
    Mark,
    StepCeiling,
    mark_path,
    next_slot,
    write_mark_at,
)
from fedsim.privacy.ledger_open import drop_lock, open_file, read_ledger_steps, read_view
from fedsim.privacy.ledger_tally import LedgerTally, RoundSet

__all__ = ["LEDGER_FORMAT", "NORMALISATION_ROUND", "Budget", "LedgerRecord", "PrivacyLedger",
           "read_ledger_steps"]

ENFORCEMENT_FALLBACK = "pld"
NORMALISATION_ROUND = -1
"""The ``round`` of a release before the first training round (DP data normalisation): its
own privacy event, composed with the rounds' steps, but not a round (:attr:`PrivacyLedger.rounds`)."""


class PrivacyLedger:
    """Append-only, fsynced record of one client's releases, with budget enforcement."""

    def __init__(self, path: Path, client_id: str, sampling: Sampling, budget: Budget | None,
                 accountant: str, records: list[LedgerRecord], last_hash: str, *,
                 mark: MarkFile | None = None, directory: DirectoryLock | None = None,
                 fsync: bool = True, resume_at: int = 0,
                 ceiling: StepCeiling | None = NO_STEPS) -> None:
        """``ceiling``: the step ceiling of ``records`` as the ledger's mark carries it
        (:class:`~fedsim.privacy.ledger_mark.StepCeiling`, :func:`_ceiling_of`); None: the
        mark has the old format, without one, and keeps it."""
        self._path = path
        self._fsync = fsync
        self._resume_at = resume_at  # the file's next round when opened (next_round)
        self._client_id = client_id
        self._sampling = sampling
        self._budget = budget
        enforcing = accountant if make_accountant_class(accountant).is_guarantee \
            else ENFORCEMENT_FALLBACK
        self._tally = LedgerTally(records)  # the records are on disk (ledger_tally)
        self._viewed: tuple[LedgerRecord, ...] | None = None  # a read-only view's (open)
        self._last_hash = last_hash
        # The mark's step ceiling, raised at each spend (None: an old mark, written without).
        self._ceiling = ceiling
        try:
            self._composed = make_accountant(enforcing, [r.step for r in records])
        except UnsupportedEventError as exc:  # a tuned selection under pld / gdp-clt
            raise LedgerError(f"{path}: {exc}; a tuning ledger is opened with accountant "
                              f"rdp") from None
        self._uncomposed: list[GaussianStep] = []  # spent, not yet in _composed (see spend)
        self._created: int | None = None  # a new ledger's entry, not yet durable (see open)
        # Whether a round fits, mostly without an evaluation (the module docstring's "Speed").
        self._affordability = (None if budget is None else
                               Affordability(budget, lambda: self._accountant))
        # Held for the ledger's lifetime (with the lock); a read-only ledger never writes.
        # Under a directory lock neither is kept open (ledger_file's module docstring).
        self._directory = directory
        # Under a directory lock the mark is not held open: the slot of its newest (the next
        # write goes to the other) is kept here (else the held MarkFile keeps it).
        self._mark_slot = mark.slot if directory is not None and mark is not None else None
        if directory is not None and mark is not None:
            mark.close()
            mark = None
        self._mark = mark
        self._mark_path = mark_path(path)
        self._fd = -1 if mark is None else open_append(path)  # the records' descriptor
        self._failed: str | None = None  # why a write failed midway (see _write)

    # -- opening -------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, *, client_id: str, sampling: str, budget: Budget | None,
             accountant: str = "pld", read_only: bool = False,
             directory: DirectoryLock | None = None, fsync: bool = True) -> Self:
        """Create the ledger file, or resume it (never reset; what an open finds and does:
        :mod:`fedsim.privacy.ledger_open`).

        Takes the ledger's exclusive lock: a second writer, in this or another process, gets
        a :class:`LedgerError` until :meth:`close`. ``read_only=True`` reads an existing
        ledger without locking or changing it (for reports on a copied or read-only run
        directory): an unterminated final line (a crash's, at most a record long; a longer one
        is refused as damage: :func:`~fedsim.privacy.ledger_file.complete_lines`) is skipped,
        not cut off, the chain and (if present) the high-water mark are checked, and
        :meth:`spend` raises. ``directory``: the
        :class:`~fedsim.privacy.ledger_directory_lock.DirectoryLock` of the ledger's directory, held by
        this process; the ledger then keeps no file open between spends.

        ``fsync=False``: a spend is written through to the operating system before it returns
        (it survives the process being killed), not fsynced; the caller makes its ledgers
        durable together (:class:`fedsim.atomic.FileSystemSync`) before it writes anything
        that depends on them. For a simulated run only (module docstring, "Durability rule"):
        a deployed client's releases are real and each is fsynced first.
        """
        path = Path(path)
        if sampling not in SAMPLING_SCHEMES:
            raise ConfigError(f"sampling must be one of {SAMPLING_SCHEMES}, got {sampling!r}")
        make_accountant_class(accountant)  # unknown names fail here, before any file I/O
        header = header_of(client_id, sampling, accountant,
                           budget.to_json() if budget else None)
        if read_only:
            view = read_view(path, header)
            viewed = cls(path, client_id, sampling, budget, accountant, view.records,
                         view.last_hash, resume_at=view.resume_at, ceiling=view.ceiling)
            viewed._viewed = tuple(view.records)  # a view never grows: kept, not read again
            return viewed
        found = open_file(path, header, directory, fsync=fsync)
        try:
            ledger = cls(path, client_id, sampling, budget, accountant, found.records,
                         found.last_hash, mark=found.mark, directory=directory, fsync=fsync,
                         resume_at=found.resume_at, ceiling=found.ceiling)
        except BaseException:
            assert found.mark is not None
            drop_lock(found.mark, path, directory)
            raise
        if not found.records:  # created now or by an earlier open, maybe never made durable
            ledger._created = entry_created()
        return ledger

    def close(self) -> None:
        """Close the file and release the lock (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._mark is not None:
            self._mark.close()
            self._mark = None
        if self._directory is not None:
            self._directory.release(self._path)
            self._directory = None

    @property
    def _writable(self) -> bool:
        if self._directory is not None:
            return self._directory.held
        return self._fd >= 0 and self._mark is not None

    def _write(self, payload: bytes, mark: Mark) -> None:
        """The records durably, then the mark that counts them (after a new ledger's first
        mark and directory entries: :meth:`_make_creation_durable`).

        Five system calls a spend: the mark's ``stat`` (:meth:`MarkFile.verify`, before the
        records: a replaced mark lets a second writer in), one ``write`` and one ``fsync`` of
        the records on a descriptor held open, one ``pwrite`` and one ``fsync`` of the mark.
        Under ``fsync=False`` the same without the fsyncs (the module docstring's rule).
        If a write or fsync fails, the file may hold a prefix of the records (a torn line) or
        all of them without the mark, while memory holds neither: the ledger writes nothing
        more (its next record would continue the chain from the wrong line) and opening it
        again reads what the file holds (a torn line cut off, complete lines counted).
        """
        if self._directory is None:
            assert self._mark is not None
            self._mark.verify()
        if self._created is not None and self._fsync:
            self._make_creation_durable()
        try:
            if self._directory is not None:
                fd = open_append(self._path)
                try:
                    append_durably(fd, payload, fsync=self._fsync)
                finally:
                    os.close(fd)
                slot = next_slot(self._mark_slot)
                write_mark_at(self._mark_path, mark, slot, sync=self._fsync)
                self._mark_slot = slot
            else:
                assert self._mark is not None
                append_durably(self._fd, payload, fsync=self._fsync)
                self._mark.write(mark, sync=self._fsync, verified=True)
        except BaseException as exc:
            self._failed = f"a write failed ({type(exc).__name__}: {exc})"
            raise

    def _make_creation_durable(self) -> None:
        """The durability :meth:`open` deferred for a new ledger, before its first records:
        its mark of 0 records, then the directory's entries of both files (one directory
        fsync for all the ledgers created before it). The header reaches the disk with the
        records' fsync. A crash anywhere before leaves a ledger that opens as new or as
        its header alone (nothing acknowledged); after, the crash cases of every spend."""
        if self._mark is not None:
            self._mark.sync()
        else:
            sync_file(self._mark_path)
        assert self._created is not None
        sync_entries(self._path.parent, self._created)
        self._created = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state -----------------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return self._path

    @property
    def client_id(self) -> str:
        return self._client_id

    @property
    def sampling(self) -> Sampling:
        return self._sampling

    @property
    def budget(self) -> Budget | None:
        return self._budget

    @property
    def accountant(self) -> Accountant:
        """The enforcing accountant (a guarantee) holding every recorded step."""
        return self._accountant

    @property
    def _accountant(self) -> Accountant:
        """The enforcing accountant with every recorded step composed: :meth:`spend` leaves
        its steps aside and they are composed here, when something reads the accountant."""
        if self._uncomposed:
            steps = tuple(self._uncomposed)
            self._uncomposed.clear()
            self._composed.compose(steps)
        return self._composed

    @property
    def records(self) -> tuple[LedgerRecord, ...]:
        """Every record, read back from the ledger's file and verified: memory holds only
        their tally (:mod:`fedsim.privacy.ledger_tally`). It reads the whole file, for
        reports and checks, not for a round's path. Raises :class:`LedgerError` if the file no
        longer holds what this ledger recorded (cut, or replaced: its chain must end where
        this ledger's did). A read-only view returns the records its open verified."""
        if self._viewed is not None:
            return self._viewed
        parsed = read_verified(self._path, read_ledger_bytes(self._path))
        count = self._tally.count
        if len(parsed.records) < count:
            raise LedgerError(f"{self._path}: holds {len(parsed.records)} records, but "
                              f"{count} were recorded (the file was cut)")
        if parsed.hashes[count] != self._last_hash:  # the chain's end this ledger wrote
            raise LedgerError(f"{self._path}: its first {count} records are not the ones "
                              f"this ledger recorded (the file was replaced or edited)")
        return tuple(parsed.records[:count])

    @property
    def record_count(self) -> int:
        return self._tally.count

    @property
    def rounds(self) -> RoundSet:
        """The training rounds recorded (not :data:`NORMALISATION_ROUND`), as a set (a copy)."""
        return self._tally.rounds.copy()

    def recorded(self, round: int) -> bool:  # noqa: A002 - the ledger's field is called round
        """Whether any record is of ``round`` (:data:`NORMALISATION_ROUND` too)."""
        return self._tally.recorded(round)

    @property
    def step_ceiling(self) -> StepCeiling | None:
        """The most expensive step the records hold, as the high-water mark carries it (None:
        a mark of the old format, which has no room for it: :class:`StepCeiling`)."""
        return self._ceiling

    @property
    def next_round(self) -> int:
        """The round a client resuming this ledger starts at: after every round recorded, and
        one further for each substitute a repair wrote after them (``fedsim ledger repair``;
        at round :data:`NORMALISATION_ROUND`). A lost record may have been a round the server
        received, so numbering past it keeps ``(client, round)`` unique, and the server that
        knows those rounds neither drops the new ones as duplicates nor takes the client for
        one on a lost ledger (:class:`fedsim.transports.mqtt.MqttClientEndpoint`). Rounds
        skipped are only gaps in the numbering."""
        highest = self._tally.rounds.highest
        return max(self._resume_at, 0 if highest is None else highest + 1)

    @property
    def last_time(self) -> float:
        """The time of the last record (0.0 for an empty ledger): where a restarted client's
        clock starts, so that its records never go back in time."""
        return self._tally.last_time

    @property
    def steps(self) -> tuple[GaussianStep, ...]:
        """Recorded steps, identical ones merged."""
        return self._accountant.steps

    def epsilon(self, delta: float | None = None) -> float:
        """eps spent so far at ``delta`` (default: the budget's delta): the enforcing
        accountant's, or the smallest other guarantee's where it has no finite answer
        (:func:`fedsim.privacy.accountant.smallest_epsilon`)."""
        return self.epsilon_bound(delta)[0]

    def epsilon_bound(self, delta: float | None = None) -> tuple[float, str]:
        """(eps, the accountant that gave it); see :meth:`epsilon`."""
        return smallest_epsilon(self._accountant, self._delta(delta), only_if_infinite=True)

    @property
    def remaining_epsilon(self) -> float | None:
        if self._budget is None:
            return None
        return max(0.0, self._budget.epsilon - self.epsilon())

    # -- planning ----------------------------------------------------------------------------------
    def plan(self, future_rounds: Sequence[Sequence[GaussianStep]]) -> int:
        """Register the rounds this client plans to release next, in order; return how many of
        them fit in the budget from the current state (all of them without a budget).

        Checks and spends of exactly these rounds, in this order, then cost no accountant
        evaluation (see the module docstring); a later :meth:`plan` replaces this one.
        """
        rounds = [group_steps(self._validated(r)) for r in future_rounds]
        if self._affordability is None:
            return len(rounds)
        return self._affordability.plan(rounds)

    # -- spending ----------------------------------------------------------------------------------
    def can_spend(self, steps: Sequence[GaussianStep] | GaussianStep) -> bool:
        """Would releasing ``steps`` keep the ledger within budget? Changes nothing."""
        steps = self._validated(steps)
        if self._budget is None or not steps:
            return True
        return self._can_spend(steps, group_steps(steps))

    def _can_spend(self, steps: tuple[GaussianStep, ...], kinds: tuple[GaussianStep, ...]) -> bool:
        """:meth:`can_spend` of validated, non-empty ``steps`` (``kinds``: grouped)."""
        if self._affordability is None:
            return True
        return self._affordability.fits(steps, kinds, self._tally.count)

    def spend(self, steps: Sequence[GaussianStep] | GaussianStep, *, time: float,
              round: int) -> None:  # noqa: A002 - the ledger's field is called round
        """Record ``steps`` durably, or raise :class:`BudgetExhausted` and write nothing."""
        steps = self._validated(steps)
        if not steps:
            return
        self._check_record(time, round)
        kinds = group_steps(steps)
        if not self._can_spend(steps, kinds):
            budget = self._budget
            assert budget is not None
            raise BudgetExhausted(
                f"client {self._client_id}: releasing {len(steps)} more step(s) would exceed "
                f"eps={budget.epsilon:g} at delta={budget.delta:g} "
                f"(spent {epsilon_text(self.epsilon())})")
        # The steps wait to be composed until the accountant is next read (or a batch is
        # due): a round that the allowance answers reads nothing, and steps of one kind
        # composed together cost one update of the accountant's state, the same state step
        # by step (its answers are a function of the counts of each kind: accountant.compose).
        self._append([LedgerRecord(float(time), round, s) for s in steps],
                     counted=lambda: self._count_spent(kinds))
        if len(self._uncomposed) >= _COMPOSE_BATCH:
            self._accountant  # noqa: B018 - composes them

    def _count_spent(self, kinds: tuple[GaussianStep, ...]) -> None:
        """A spend's side in the affordability's counts (inside the spend's commit)."""
        if self._affordability is not None:
            self._affordability.spent(kinds)

    def spend_selection(self, selection: TunedSelection, *, time: float,
                        round: int) -> None:  # noqa: A002 - the ledger's field is called round
        """Record a tuned selection (:class:`TunedSelection`: all its trials and the release
        of the best) durably, or raise :class:`BudgetExhausted` and write nothing.

        Only an ``rdp`` ledger holds one (the bound is an RDP curve; any other accountant
        raises :class:`LedgerError`); it composes with the recorded steps and any later ones.
        """
        if not isinstance(selection, TunedSelection):
            raise ConfigError(f"expected TunedSelection, got {type(selection).__name__}")
        if selection.sampling not in (self._sampling, None):
            raise ConfigError(f"ledger of client {self._client_id} records {self._sampling} "
                              f"steps, got a {selection.sampling} selection")
        self._check_record(time, round)
        held = self._accountant
        try:
            trial = make_accountant(held.name, [*held.steps, *held.selections, selection],
                                    **held.settings())
        except UnsupportedEventError as exc:
            raise LedgerError(f"ledger of client {self._client_id}: {exc}") from None
        if self._budget is not None and not within(trial, self._budget):
            raise BudgetExhausted(
                f"client {self._client_id}: the tuned selection would exceed "
                f"eps={self._budget.epsilon:g} at delta={self._budget.delta:g} "
                f"(spent {epsilon_text(self.epsilon())})")
        # ``trial`` holds every step (``held`` composed the waiting ones) and the selection
        affordability = self._affordability
        self._append([LedgerRecord(float(time), round, selection)], accountant=trial,
                     counted=affordability.forget if affordability is not None else _nothing)

    # -- internals -----------------------------------------------------------------------------------
    def _check_record(self, time: float, round: int) -> None:  # noqa: A002
        """Refuse a record the ledger cannot write now (closed, bad or backward time)."""
        if self._failed is not None:
            raise LedgerError(f"ledger of client {self._client_id}: {self._failed}; nothing "
                              f"more is written through this handle (close it and open the "
                              f"ledger again)")
        if not self._writable:
            raise LedgerError(f"ledger of client {self._client_id} was opened read-only "
                              f"or is closed")
        if not (isinstance(time, int | float) and math.isfinite(time)):
            raise ConfigError(f"time must be a finite number, got {time!r}")
        if time < self.last_time:
            raise LedgerError(
                f"client {self._client_id}: time {time!r} is before the last record's "
                f"({self.last_time!r}); a restarted client's clock starts at "
                f"PrivacyLedger.last_time")
        if isinstance(round, bool) or not isinstance(round, int):
            raise ConfigError(f"round must be an integer, got {round!r}")

    def _append(self, records: list[LedgerRecord], *, accountant: Accountant | None = None,
                counted: Callable[[], None]) -> None:
        """Write ``records`` durably (then the mark), then hold them in memory: their steps
        waiting to be composed, or ``accountant`` (already holding them) as the ledger's, and
        ``counted()`` updates the budget's counters - all with no Ctrl-C between."""
        lines, last = [], self._last_hash
        for index, record in enumerate(records):
            # (the records still to follow: a cut inside a spend shows; one-record spends,
            # every round's, are written as before)
            line = encode_record(record, last, rest=len(records) - 1 - index)
            lines.append(line)
            last = line_hash(line)
        # Committed on disk (records, then the mark), then in memory, with no Ctrl-C between:
        # an interrupted run reports from memory what its ledger file holds.
        ceiling = None if self._ceiling is None else self._ceiling.including(records)
        with uninterrupted():
            self._write(b"\n".join(lines) + b"\n",
                        Mark(self._tally.count + len(records), last, ceiling))
            self._last_hash = last
            self._ceiling = ceiling
            self._tally.add(records)
            if accountant is None:
                self._uncomposed.extend(r.step for r in records
                                        if isinstance(r.step, GaussianStep))
            else:
                self._composed = accountant
            counted()

    def _delta(self, delta: float | None) -> float:
        if delta is None:
            if self._budget is None:
                raise ConfigError("this ledger has no budget: pass delta explicitly")
            return self._budget.delta
        return delta

    def _validated(self, steps: Sequence[GaussianStep] | GaussianStep) -> tuple[GaussianStep, ...]:
        steps = (steps,) if isinstance(steps, GaussianStep) else tuple(steps)
        for step in steps:
            if not isinstance(step, GaussianStep):
                raise ConfigError(f"expected GaussianStep, got {type(step).__name__}")
            if step.sampling != self._sampling:
                raise ConfigError(
                    f"ledger of client {self._client_id} records {self._sampling} steps, "
                    f"got a {step.sampling} step")
        return steps


_COMPOSE_BATCH = 64
"""At most this many spent steps wait to be composed (the ledger's memory stays bounded)."""


def _nothing() -> None:
    """A spend's side in a ledger without a budget: no counts to keep."""
