"""A client's durable privacy ledger: every release is written to disk before it happens.

File format (JSON lines, UTF-8):

* line 1, the header: ``{"format": "fedsim-ledger/1", "client_id": ..., "sampling": ...,
  "accountant": ..., "budget": {"epsilon": ..., "delta": ...} | null}``;
* one line per released step: ``{"time": t, "round": r, "step": {"sampling", "q", "sigma",
  "count"}}``.

Durability rule. :meth:`PrivacyLedger.spend` writes its lines with one ``write`` call, then
``flush`` + ``os.fsync``, and only then returns (and the caller releases the update). A spend
is *acknowledged* when it returns. On :meth:`PrivacyLedger.open`:

* a final line without its terminating newline is a write that was cut by a crash before the
  fsync returned, so it was never acknowledged and the update was never released: it is
  ignored and cut off the file (later lines append cleanly);
* every newline-terminated line must parse; anything else (a damaged complete line, a bad
  header, a header that disagrees with the arguments) raises :class:`LedgerError`. A ledger is
  never reset. Complete lines are always counted, even if the process died before ``spend``
  returned: counting a release that may not have happened is the safe direction.

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
how many of the planned rounds fit: doubling and bisection over the number k of planned rounds
(O(log T) accountant evaluations), with the predicate "recorded steps + the first k planned
rounds are within budget". While the client spends exactly the planned rounds in order,
:meth:`can_spend` for the next planned round is answered by counting; the answer is the one
the full check gives, because the accountant's state is a function of the multiset of steps
(:func:`group_steps` sorts) and "recorded + next round" is then exactly "recorded at plan time
+ the first k planned rounds". Anything off the plan drops it and falls back to the full check.
Like the headroom cache this relies on eps growing with every composed step.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from fedsim.errors import BudgetExhausted, ConfigError, LedgerError
from fedsim.privacy.accountant import Accountant, make_accountant, make_accountant_class
from fedsim.privacy.calibration import bisect_fitting, doubling_bracket, largest_fitting
from fedsim.privacy.events import SAMPLING_SCHEMES, GaussianStep, Sampling, group_steps
from fedsim.privacy.handles import LEDGER_HANDLES

LEDGER_FORMAT = "fedsim-ledger/1"
ENFORCEMENT_FALLBACK = "pld"
_MAX_HEADROOM = 10**9
_HANDLE_KEYS = itertools.count()


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


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    """One released step: when (virtual or wall time), in which round, and what."""

    time: float
    round: int
    step: GaussianStep

    def to_json(self) -> dict[str, Any]:
        return {"time": self.time, "round": self.round, "step": self.step.to_json()}


class PrivacyLedger:
    """Append-only, fsync'ed record of one client's releases, with budget enforcement."""

    def __init__(self, path: Path, client_id: str, sampling: Sampling, budget: Budget | None,
                 accountant: str, records: list[LedgerRecord], *, read_only: bool = False) -> None:
        self._path = path
        self._client_id = client_id
        self._sampling = sampling
        self._budget = budget
        enforcing = accountant if make_accountant_class(accountant).is_guarantee \
            else ENFORCEMENT_FALLBACK
        self._records = list(records)
        self._accountant = make_accountant(enforcing, [r.step for r in records])
        self._headroom: dict[tuple[Sampling, float, float], int] = {}
        # Kinds whose headroom is only a lower bound map to the first count known not to fit.
        self._headroom_above: dict[tuple[Sampling, float, float], int] = {}
        self._plan: list[tuple[GaussianStep, ...]] | None = None
        self._plan_cursor = 0  # planned rounds spent since plan()
        self._plan_fit = 0  # planned rounds that fit in the budget, counted from plan()
        # A read-only ledger (reports) never writes; the others append through the process's
        # bounded pool of open files (opened on the first spend: 10^5 ledgers fit one process).
        self._read_only = read_only
        self._handle = next(_HANDLE_KEYS)  # its key in the pool (ids may be reused, these not)

    # -- opening -------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, *, client_id: str, sampling: str, budget: Budget | None,
             accountant: str = "pld", read_only: bool = False) -> Self:
        """Create the ledger file, or resume it (never reset; see the module docstring).

        ``read_only=True`` reads an existing ledger without changing its file (for reports on a
        copied or read-only run directory): an unterminated final line is skipped, not cut off,
        and :meth:`spend` raises :class:`LedgerError`.
        """
        path = Path(path)
        if sampling not in SAMPLING_SCHEMES:
            raise ConfigError(f"sampling must be one of {SAMPLING_SCHEMES}, got {sampling!r}")
        make_accountant_class(accountant)  # unknown names fail here, before any file I/O
        header = {"format": LEDGER_FORMAT, "client_id": client_id, "sampling": sampling,
                  "accountant": accountant, "budget": budget.to_json() if budget else None}
        if read_only:
            if not path.exists():
                raise LedgerError(f"{path}: no such ledger")
            records = _read(path, header, repair=False)
            return cls(path, client_id, sampling, budget, accountant, records, read_only=True)
        if not path.exists() or path.stat().st_size == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_durably(path, (json.dumps(header) + "\n").encode(), create=True)
            return cls(path, client_id, sampling, budget, accountant, [])
        records = _read(path, header)
        return cls(path, client_id, sampling, budget, accountant, records)

    def close(self) -> None:
        LEDGER_HANDLES.release(self._handle)

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
    def records(self) -> tuple[LedgerRecord, ...]:
        return tuple(self._records)

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

        def fits(count: int) -> bool:
            if count == 0:
                return True
            planned = [step for r in rounds[:count] for step in r]
            return self._accountant.preview(planned).epsilon(budget.delta) <= budget.epsilon

        # Start at the whole plan: a schedule calibrated to the budget usually fits entirely,
        # which costs a single evaluation.
        self._plan_fit = largest_fitting(fits, start=len(rounds), limit=len(rounds)) \
            if rounds else 0
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
        if len(kinds) == 1:
            kind = kinds[0]
            return kind.count <= self._headroom_for(kind) or (
                kind.key in self._headroom_above
                and kind.count <= self._headroom_for(kind, exact=True)
            )
        return self._accountant.preview(steps).epsilon(self._budget.delta) <= self._budget.epsilon

    def spend(self, steps: Sequence[GaussianStep] | GaussianStep, *, time: float,
              round: int) -> None:  # noqa: A002 - the ledger's field is called round
        """Record ``steps`` durably, or raise :class:`BudgetExhausted` and write nothing."""
        steps = self._validated(steps)
        if not steps:
            return
        if self._read_only:
            raise LedgerError(f"ledger of client {self._client_id} was opened read-only")
        if not (isinstance(time, int | float) and math.isfinite(time)):
            raise ConfigError(f"time must be a finite number, got {time!r}")
        if isinstance(round, bool) or not isinstance(round, int):
            raise ConfigError(f"round must be an integer, got {round!r}")
        if not self.can_spend(steps):
            raise BudgetExhausted(
                f"client {self._client_id}: releasing {len(steps)} more step(s) would exceed "
                f"eps={self._budget.epsilon:g} at delta={self._budget.delta:g} "  # type: ignore[union-attr]
                f"(spent {self.epsilon():.4g})")
        records = [LedgerRecord(float(time), round, s) for s in steps]
        payload = "".join(json.dumps(r.to_json()) + "\n" for r in records).encode()
        LEDGER_HANDLES.write_durably(self._handle, self._path, payload)
        # Committed on disk: now in memory.
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


def _write_durably(path: Path, payload: bytes, *, create: bool) -> None:
    flags = os.O_WRONLY | os.O_APPEND | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = os.open(path, flags, 0o644)
    try:
        os.write(fd, payload)
        os.fsync(fd)
    finally:
        os.close(fd)
    if create:  # make the new directory entry durable too
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _read(path: Path, expected: dict[str, Any], *, repair: bool = True) -> list[LedgerRecord]:  # noqa: C901 - one check per way a record can be damaged
    data = path.read_bytes()
    complete_end = data.rfind(b"\n") + 1
    if complete_end < len(data) and not repair:
        data = data[:complete_end]  # skip the crash-cut final line; the file is left as it is
    elif complete_end < len(data):
        # An unterminated final line: a write cut by a crash, never acknowledged. Drop it.
        with open(path, "r+b") as handle:
            handle.truncate(complete_end)
            handle.flush()
            os.fsync(handle.fileno())
        data = data[:complete_end]
    lines = data.decode("utf-8", errors="strict").splitlines()
    if not lines:
        raise LedgerError(f"{path}: no header line")
    try:
        header = json.loads(lines[0])
    except json.JSONDecodeError as exc:
        raise LedgerError(f"{path}: line 1: header is not JSON ({exc})") from None
    if not isinstance(header, dict) or header.get("format") != LEDGER_FORMAT:
        raise LedgerError(f"{path}: line 1: not a {LEDGER_FORMAT} header")
    for field in ("client_id", "sampling", "accountant", "budget"):
        if header.get(field) != expected[field]:
            raise LedgerError(f"{path}: header {field}={header.get(field)!r} but the ledger was "
                              f"opened with {expected[field]!r} (a ledger is never reset)")
    records = []
    for number, line in enumerate(lines[1:], start=2):
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict) or set(obj) != {"time", "round", "step"}:
                raise ValueError("expected keys time, round, step")
            step = GaussianStep.from_json(obj["step"])
            if step.sampling != header["sampling"]:
                raise ValueError(f"a {step.sampling} step in a {header['sampling']} ledger")
            time, round_ = obj["time"], obj["round"]
            if not isinstance(time, int | float) or isinstance(round_, bool) \
                    or not isinstance(round_, int):
                raise ValueError("time must be a number and round an integer")
            records.append(LedgerRecord(float(time), round_, step))
        except (ValueError, ConfigError) as exc:
            raise LedgerError(f"{path}: line {number}: damaged record ({exc})") from None
    return records

