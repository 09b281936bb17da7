"""A client's durable privacy ledger: every release is written to disk before it happens.

File format, hash chain, high-water mark and lock: see :mod:`fedsim.privacy.ledger_file`.

Durability rule. :meth:`PrivacyLedger.spend` writes its lines with one ``write`` call, then
``flush`` + ``os.fsync``, then moves the high-water mark (fsynced), and only then returns (and
the caller releases the update). A spend is *acknowledged* when it returns. On
:meth:`PrivacyLedger.open`:

* a final line without its terminating newline is a write that was cut by a crash before the
  fsync returned, so it was never acknowledged and the update was never released: it is
  ignored and cut off the file (later lines append cleanly);
* every newline-terminated line must parse and continue the hash chain, and the file must
  reach the high-water mark; anything else (a damaged line, a bad header, a header that
  disagrees with the arguments, a cut or edited file) raises :class:`LedgerError`. A ledger is
  never reset (``fedsim ledger repair`` may only add spending). Complete lines are always
  counted, even if the process died before ``spend`` returned: counting a release that may
  not have happened is the safe direction.

Time. Records' times never go back: :meth:`PrivacyLedger.spend` refuses a time before the
last record's, and :attr:`PrivacyLedger.last_time` is where a restarted client's clock starts.

Enforcement uses a guarantee: the ledger's accountant if it is one (``pld``, ``rdp``),
otherwise ``pld`` (``gdp-clt`` is an approximation and never enforces a budget).

Speed. The runtime asks :meth:`can_spend` every round for hundreds of clients. For a kind of
step (sampling, q, sigma) the ledger computes once, by doubling and bisection, how many more
such steps fit in the budget (the *headroom*); eps grows with the count of a kind for every
accountant, so later checks of the same kind are answered exactly by counting. The headroom is
recomputed only when a different kind is spent or checked. The first answer is a lower bound,
the last success of the doubling (about half the evaluations of the exact count, and a fresh
client far from its budget needs no more); the bisection to the exact count runs only when a
check asks for more steps than the bound.

Changing schedules (growing mu_t: every round is a new kind) defeat that cache, so a client
that knows its future rounds registers them with :meth:`plan`. The ledger then finds, once,
how many of the planned rounds fit: the whole plan first (one evaluation), otherwise a
galloping search that extends one dry-run accountant along the plan (k = 1, 2, 4, ... rounds)
and bisects the last bracket from a copy, so each planned step is composed O(1) times and the
accountant is evaluated O(log T) times. The PLD accountant composes incrementally (see
:mod:`fedsim.privacy.pld_state`) and its eps is a function of the multiset of steps, bit for
bit, however they were fed; a kind checked for the first time is answered by one dry run,
the headroom is computed when it comes again. While the client spends exactly the planned rounds in order,
:meth:`can_spend` for the next planned round is answered by counting; the answer is the one
the full check gives, because the accountant's state is a function of the multiset of steps
(:func:`group_steps` sorts) and "recorded + next round" is then exactly "recorded at plan time
+ the first k planned rounds". Anything off the plan drops it and falls back to the full check.
Like the headroom cache this relies on eps growing with every composed step.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Self

from fedsim.errors import BudgetExhausted, ConfigError, LedgerError
from fedsim.privacy.accountant import Accountant, make_accountant, make_accountant_class
from fedsim.privacy.calibration import bisect_fitting, doubling_bracket
from fedsim.privacy.events import SAMPLING_SCHEMES, GaussianStep, Sampling, group_steps
from fedsim.privacy.ledger_file import (
    LEDGER_FORMAT,
    DirectoryLock,
    LedgerRecord,
    Mark,
    MarkFile,
    append_durably,
    check_mark,
    cut_partial_line,
    encode_record,
    header_of,
    line_hash,
    mark_path,
    parse_header,
    read_mark,
    read_verified,
    write_mark_at,
    write_new,
)

__all__ = ["LEDGER_FORMAT", "NORMALISATION_ROUND", "Budget", "LedgerRecord", "PrivacyLedger",
           "read_ledger_steps"]

ENFORCEMENT_FALLBACK = "pld"
NORMALISATION_ROUND = -1
"""The ``round`` of a release before the first training round (DP data normalisation): its
own privacy event, composed with the rounds' steps, but not a round (:attr:`PrivacyLedger.rounds`)."""
_MAX_HEADROOM = 10**9


@dataclass(frozen=True, slots=True)
class Budget:
    """A per-client (eps, delta) budget."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, int | float) and math.isfinite(self.epsilon)
                and self.epsilon > 0):
            raise ConfigError(f"budget epsilon must be a finite number > 0, got {self.epsilon!r}")
        if not (isinstance(self.delta, int | float) and 0 < self.delta < 1):
            raise ConfigError(f"budget delta must be in (0, 1), got {self.delta!r}")

    def to_json(self) -> dict[str, float]:
        return {"epsilon": float(self.epsilon), "delta": float(self.delta)}

    @classmethod
    def from_json(cls, obj: Any) -> Budget | None:
        if obj is None:
            return None
        if not isinstance(obj, Mapping) or set(obj) != {"epsilon", "delta"}:
            raise LedgerError(f"budget must be {{epsilon, delta}} or null, got {obj!r}")
        return cls(obj["epsilon"], obj["delta"])


class PrivacyLedger:
    """Append-only, fsync'ed record of one client's releases, with budget enforcement."""

    def __init__(self, path: Path, client_id: str, sampling: Sampling, budget: Budget | None,
                 accountant: str, records: list[LedgerRecord], last_hash: str, *,
                 mark: MarkFile | None = None, directory: DirectoryLock | None = None) -> None:
        self._path = path
        self._client_id = client_id
        self._sampling = sampling
        self._budget = budget
        self._accountant_name = accountant
        enforcing = accountant if make_accountant_class(accountant).is_guarantee \
            else ENFORCEMENT_FALLBACK
        self._records = list(records)
        self._last_hash = last_hash
        self._accountant = make_accountant(enforcing, [r.step for r in records])
        self._headroom: dict[tuple[Sampling, float, float], int] = {}
        # Kinds whose headroom is only a lower bound map to the first count known not to fit.
        self._headroom_above: dict[tuple[Sampling, float, float], int] = {}
        self._checked_once: set[tuple[Sampling, float, float]] = set()
        self._last_check: tuple[tuple[tuple[GaussianStep, ...], int], bool] | None = None
        self._plan: list[tuple[GaussianStep, ...]] | None = None
        self._plan_cursor = 0  # planned rounds spent since plan()
        self._plan_fit = 0  # planned rounds that fit in the budget, counted from plan()
        # Held for the ledger's lifetime (with the lock); a read-only ledger never writes.
        # Under a directory lock neither is kept open (ledger_file's module docstring).
        self._directory = directory
        if directory is not None and mark is not None:
            mark.close()
            mark = None
        self._mark = mark
        self._file: IO[bytes] | None = None if mark is None else open(path, "ab")  # noqa: SIM115

    # -- opening -------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, *, client_id: str, sampling: str, budget: Budget | None,
             accountant: str = "pld", read_only: bool = False,
             directory: DirectoryLock | None = None) -> Self:
        """Create the ledger file, or resume it (never reset; see the module docstring).

        Takes the ledger's exclusive lock: a second writer, in this or another process, gets
        a :class:`LedgerError` until :meth:`close`. ``read_only=True`` reads an existing
        ledger without locking or changing it (for reports on a copied or read-only run
        directory): an unterminated final line is skipped, not cut off, the chain and (if
        present) the high-water mark are checked, and :meth:`spend` raises. ``directory``: the
        :class:`~fedsim.privacy.ledger_file.DirectoryLock` of the ledger's directory, held by
        this process; the ledger then keeps no file open between spends.
        """
        path = Path(path)
        if sampling not in SAMPLING_SCHEMES:
            raise ConfigError(f"sampling must be one of {SAMPLING_SCHEMES}, got {sampling!r}")
        make_accountant_class(accountant)  # unknown names fail here, before any file I/O
        header = header_of(client_id, sampling, accountant,
                           budget.to_json() if budget else None)
        if read_only:
            if not path.exists():
                raise LedgerError(f"{path}: no such ledger")
            mark = read_mark(path)  # before the records: a writer moves it after them
            records, last = _read(path, path.read_bytes(), header, mark)
            return cls(path, client_id, sampling, budget, accountant,
                       records, last)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = _take_lock(path, directory)
        try:
            mark = lock.read()
            data = path.read_bytes() if path.exists() else b""
            if not data and (mark is None or mark.count == 0):
                # New (or created up to its header only: the mark is written first).
                line = json.dumps(header).encode()
                lock.write(Mark(0, line_hash(line)))
                if path.exists():
                    path.unlink()
                write_new(path, line + b"\n")
                return cls(path, client_id, sampling, budget, accountant,
                           [], line_hash(line), mark=lock, directory=directory)
            if mark is None:
                parse_header(path, data.split(b"\n", 1)[0])  # an old format says so first
                raise LedgerError(
                    f"{path}: no high-water mark ({mark_path(path).name}), so a cut file "
                    f"cannot be detected; `fedsim ledger repair {path} --assume-lost N` "
                    f"adopts it")
            records, last = _read(path, cut_partial_line(path, data), header, mark)
            if len(records) > mark.count:  # a crash between the two writes: move it up
                lock.write(Mark(len(records), last))
            return cls(path, client_id, sampling, budget, accountant,
                       records, last, mark=lock, directory=directory)
        except BaseException:
            _drop_lock(lock, path, directory)
            raise

    def close(self) -> None:
        """Close the file and release the lock (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None
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
        return self._file is not None and self._mark is not None

    def _write(self, payload: bytes, mark: Mark) -> None:
        """The records durably, then the mark that counts them."""
        if self._directory is not None:
            with open(self._path, "ab") as handle:
                append_durably(handle, payload)
            write_mark_at(mark_path(self._path), mark)
            return
        assert self._file is not None and self._mark is not None
        self._mark.verify()  # before the records: a replaced mark lets a second writer in
        append_durably(self._file, payload)
        self._mark.write(mark)

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
    def accountant_name(self) -> str:
        """The accountant named in the header (may be ``gdp-clt``, which only reports)."""
        return self._accountant_name

    @property
    def accountant(self) -> Accountant:
        """The enforcing accountant (a guarantee) holding every recorded step."""
        return self._accountant

    @property
    def records(self) -> tuple[LedgerRecord, ...]:
        return tuple(self._records)

    @property
    def rounds(self) -> frozenset[int]:
        """The training rounds recorded (not :data:`NORMALISATION_ROUND`)."""
        return frozenset(r.round for r in self._records if r.round >= 0)

    @property
    def last_time(self) -> float:
        """The time of the last record (0.0 for an empty ledger): where a restarted client's
        clock starts, so that its records never go back in time."""
        return self._records[-1].time if self._records else 0.0

    @property
    def steps(self) -> tuple[GaussianStep, ...]:
        """Recorded steps, identical ones merged."""
        return self._accountant.steps

    def epsilon(self, delta: float | None = None) -> float:
        """eps spent so far at ``delta`` (default: the budget's delta)."""
        return self._accountant.epsilon(self._delta(delta))

    @property
    def remaining_epsilon(self) -> float | None:
        if self._budget is None:
            return None
        return max(0.0, self._budget.epsilon - self.epsilon())

    def epsilon_history(self, times: Sequence[float], delta: float | None = None) -> list[float]:
        """eps spent by the records with ``time <= t``, for each t in ``times``."""
        delta = self._delta(delta)
        ordered = sorted(self._records, key=lambda r: r.time)
        out = []
        for t in times:
            spent = [r.step for r in ordered if r.time <= t]
            out.append(make_accountant(self._accountant.name, spent).epsilon(delta))
        return out

    # -- planning ----------------------------------------------------------------------------------
    def plan(self, future_rounds: Sequence[Sequence[GaussianStep]]) -> int:
        """Register the rounds this client plans to release next, in order; return how many of
        them fit in the budget from the current state (all of them without a budget).

        Checks and spends of exactly these rounds, in this order, then cost no accountant
        evaluation (see the module docstring); a later :meth:`plan` replaces this one.
        """
        rounds = [group_steps(self._validated(r)) for r in future_rounds]
        self._plan, self._plan_cursor = rounds, 0
        budget = self._budget
        if budget is None:
            self._plan_fit = len(rounds)
            return self._plan_fit

        self._plan_fit = largest_fitting_prefix(self._accountant, rounds, budget)
        return self._plan_fit

    def _planned_answer(self, kinds: tuple[GaussianStep, ...]) -> bool | None:
        """Whether the next planned round fits, if ``kinds`` is that round; else None."""
        plan = self._plan
        if plan is None or self._plan_cursor >= len(plan) or plan[self._plan_cursor] != kinds:
            return None
        return self._plan_cursor < self._plan_fit

    # -- spending ----------------------------------------------------------------------------------
    def can_spend(self, steps: Sequence[GaussianStep] | GaussianStep) -> bool:
        """Would releasing ``steps`` keep the ledger within budget? Changes nothing."""
        steps = self._validated(steps)
        if self._budget is None or not steps:
            return True
        kinds = group_steps(steps)
        planned = self._planned_answer(kinds)
        if planned is not None:
            return planned
        memo = (kinds, len(self._records))
        if self._last_check is not None and self._last_check[0] == memo:
            return self._last_check[1]  # asked again before anything changed (spend asks)
        answer = self._check(kinds, steps)
        self._last_check = (memo, answer)
        return answer

    def _check(self, kinds: tuple[GaussianStep, ...], steps: tuple[GaussianStep, ...]) -> bool:
        budget = self._budget
        assert budget is not None
        if len(kinds) == 1 and kinds[0].key not in self._headroom \
                and kinds[0].key not in self._checked_once:
            # A kind seen for the first time (a changing schedule without a plan): one dry
            # run; its headroom is worth computing only if it comes again.
            self._checked_once.add(kinds[0].key)
        elif len(kinds) == 1:
            kind = kinds[0]
            return kind.count <= self._headroom_for(kind) or (
                kind.key in self._headroom_above
                and kind.count <= self._headroom_for(kind, exact=True)
            )
        return self._accountant.preview(steps).epsilon(budget.delta) <= budget.epsilon

    def spend(self, steps: Sequence[GaussianStep] | GaussianStep, *, time: float,
              round: int) -> None:  # noqa: A002 - the ledger's field is called round
        """Record ``steps`` durably, or raise :class:`BudgetExhausted` and write nothing."""
        steps = self._validated(steps)
        if not steps:
            return
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
        if not self.can_spend(steps):
            budget = self._budget
            assert budget is not None
            raise BudgetExhausted(
                f"client {self._client_id}: releasing {len(steps)} more step(s) would exceed "
                f"eps={budget.epsilon:g} at delta={budget.delta:g} "
                f"(spent {self.epsilon():.4g})")
        records = [LedgerRecord(float(time), round, s) for s in steps]
        lines, last = [], self._last_hash
        for record in records:
            line = encode_record(record, last)
            lines.append(line)
            last = line_hash(line)
        self._write(b"".join(line + b"\n" for line in lines),
                    Mark(len(self._records) + len(records), last))
        # Committed on disk (records, then the mark): now in memory.
        self._last_hash = last
        self._records.extend(records)
        self._accountant.compose(steps)
        kinds = group_steps(steps)
        if self._planned_answer(kinds) is None:
            self._plan = None  # off the plan: its counts no longer describe the state
        else:
            self._plan_cursor += 1
        kept = {}
        if len(kinds) == 1 and kinds[0].key in self._headroom:
            kept[kinds[0].key] = self._headroom[kinds[0].key] - kinds[0].count
        self._headroom = kept
        self._headroom_above = {key: above - kinds[0].count
                                for key, above in self._headroom_above.items() if key in kept}

    # -- internals -----------------------------------------------------------------------------------
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

    def _headroom_for(self, kind: GaussianStep, *, exact: bool = False) -> int:
        """How many more steps of this kind surely fit in the budget: the exact count when
        ``exact``, else possibly a lower bound (cached until the state moves)."""
        key = kind.key
        if key in self._headroom and not (exact and key in self._headroom_above):
            return self._headroom[key]
        budget = self._budget
        assert budget is not None
        unit = kind.times(1)

        def fits(count: int) -> bool:
            trial = self._accountant.preview([unit.times(count)])
            return trial.epsilon(budget.delta) <= budget.epsilon

        if key in self._headroom:  # a lower bound and a failing count: bisect between them
            low, high = self._headroom[key], self._headroom_above.pop(key)
        else:
            low, high = doubling_bracket(fits, start=64, limit=_MAX_HEADROOM)
            if low > 0 and high - low > 1 and not exact:
                self._headroom[key], self._headroom_above[key] = low, high
                return low
        self._headroom[key] = bisect_fitting(fits, low, high)
        return self._headroom[key]


def largest_fitting_prefix(accountant: Accountant, rounds: Sequence[Sequence[GaussianStep]],
                           budget: Budget) -> int:
    """How many of ``rounds``, taken in order after ``accountant``'s history, fit in ``budget``
    (eps non-decreasing in the steps composed). ``accountant`` is never changed.

    The whole plan is tried first (a schedule calibrated to the budget fits, one evaluation);
    otherwise a galloping search extends one dry-run copy by 1, 2, 4, ... rounds and bisects
    the failing bracket from copies of its lower end, so every planned round is composed a
    bounded number of times and eps is evaluated O(log len(rounds)) times.
    """
    def fits(trial: Accountant) -> bool:
        return trial.epsilon(budget.delta) <= budget.epsilon

    def flat(part: Sequence[Sequence[GaussianStep]]) -> list[GaussianStep]:
        return [step for r in part for step in r]

    if not rounds or fits(accountant.preview(flat(rounds))):
        return len(rounds)
    low, width, base = 0, 1, accountant.preview([])
    while True:  # fits(low) holds for base; the whole plan does not fit
        high = min(low + width, len(rounds))
        trial = base.preview(flat(rounds[low:high]))
        if high == len(rounds) or not fits(trial):
            break
        low, width, base = high, width * 2, trial
    if high == len(rounds) and fits(trial):  # pragma: no cover - excluded by the first try
        return high
    while high - low > 1:
        middle = (low + high) // 2
        trial = base.preview(flat(rounds[low:middle]))
        if fits(trial):
            low, base = middle, trial
        else:
            high = middle
    return low


def _read(path: Path, data: bytes, expected: dict[str, Any],
          mark: Mark | None) -> tuple[list[LedgerRecord], str]:
    """Records and last hash of a ledger's bytes, verified (chain, mark, header)."""
    if not data:
        raise LedgerError(f"{path}: empty, but its high-water mark counts "
                          f"{mark.count if mark else 0} records (the file was cut)")
    parsed = read_verified(path, data)
    for field in ("client_id", "sampling", "accountant", "budget"):
        if parsed.header.get(field) != expected[field]:
            raise LedgerError(f"{path}: header {field}={parsed.header.get(field)!r} but the "
                              f"ledger was opened with {expected[field]!r} (a ledger is never "
                              f"reset)")
    check_mark(path, parsed, mark)
    return parsed.records, parsed.hashes[-1]


def _take_lock(path: Path, directory: DirectoryLock | None) -> MarkFile:
    """The ledger's lock for opening it (under ``directory``: also claimed there)."""
    if directory is None:
        return MarkFile(mark_path(path), create=True)
    directory.claim(path)
    try:
        return MarkFile(mark_path(path), create=True, directory_held=True)
    except BaseException:
        directory.release(path)
        raise


def _drop_lock(lock: MarkFile, path: Path, directory: DirectoryLock | None) -> None:
    lock.close()
    if directory is not None:
        directory.release(path)


def read_ledger_steps(path: str | Path) -> Iterable[GaussianStep]:
    """The steps recorded in a ledger file (verified: chain and, if present, the mark),
    without opening it for writing."""
    path = Path(path)
    data = path.read_bytes()
    parsed = read_verified(path, data)
    check_mark(path, parsed, read_mark(path))
    return [record.step for record in parsed.records]
