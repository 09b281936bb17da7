"""A run's metrics as TensorBoard scalars (``fedsim run --tensorboard DIR``,
``fedsim.simulate(..., tensorboard=DIR)``; needs the ``fedsim[tensorboard]`` extra).

Written as the run goes (:class:`LiveExport`: each ``metrics.jsonl`` line when its window
closes, flushed at once, so a long run can be watched in TensorBoard), and completed from the
finished run directory (so the scalars are exactly the files' numbers):

* ``window/<field>`` for every numeric field of each ``metrics.jsonl`` line (``accuracy`` on
  the windows that were evaluated, ``loss``, the update counts ``received``, ``applied``,
  ``stale``, ``duplicate``, ``rejected``, ``dropped_in_flight``, ``active_clients``,
  ``step_size``, ``min_remaining_epsilon``, ``time``), at step = the window number, per window;
* at the end, ``epsilon/<client id>``: each client's epsilon at the scenario's delta, from its
  ledger under its enforcing accountant (the numbers of ``fedsim report``'s epsilon plot), on
  :data:`~fedsim.reporting.epsilon_history.TIME_GRID_POINTS` virtual times, at step = the
  window in progress at that time (one point a step: its latest time); and ``epsilon_summary/{min,median,max}`` over the clients
  (while the run goes, ``window/min_remaining_epsilon`` follows the budgets);
* at the end, ``final/accuracy`` and ``final/loss``: the final model's evaluation at the run's
  end (none for an interrupted run), at step = the last window.

Every event's wall time is its virtual time (seconds), so TensorBoard's "relative" horizontal
axis reads virtual seconds, and two exports of one run directory write the same scalars.
:func:`export_run` writes a finished run directory the same way after the fact.
"""

from __future__ import annotations

import bisect
import importlib.util
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from os import PathLike
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fedsim.errors import ConfigError
from fedsim.reporting.rundir import RunDirectory
from fedsim.reporting.values import finite_number
from fedsim.runtime.run_outputs import SUMMARY_FILE

SKIPPED_FIELDS = frozenset({"window", "version"})
INSTALL_HINT = "pip install 'fedsim[tensorboard]' (or: pip install tensorboard)"


def require_tensorboard() -> None:
    """Raise :class:`ConfigError` (before a run starts) if the extra is not installed."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(f"--tensorboard needs the tensorboard package: {INSTALL_HINT}")



class ScalarWriter(Protocol):
    """What :class:`LiveExport` needs of ``torch.utils.tensorboard.SummaryWriter``."""

    def add_scalar(self, tag: str, scalar_value: float, global_step: int | None = None,
                   walltime: float | None = None) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def _summary_writer(log_dir: Path) -> ScalarWriter:
    from torch.utils.tensorboard import SummaryWriter

    writer: ScalarWriter = SummaryWriter(log_dir=str(log_dir))
    return writer


class LiveExport:
    """TensorBoard scalars written while a run goes (see the module docstring): call
    :meth:`window` with each ``metrics.jsonl`` line as its window closes, then :meth:`finish`
    with the run directory (or :meth:`close` if there is none). ``make_writer(log_dir)``
    builds the writer (default: torch's ``SummaryWriter``, which needs the extra)."""

    def __init__(self, log_dir: str | PathLike[str],
                 make_writer: Callable[[Path], ScalarWriter] | None = None) -> None:
        if make_writer is None:
            require_tensorboard()
        self.log_dir = Path(log_dir)
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--tensorboard {self.log_dir}: cannot create it "
                              f"({exc.strerror})") from None
        self.writer = (make_writer or _summary_writer)(self.log_dir)
        self.windows = 0

    def window(self, line: Mapping[str, Any], *, flush: bool = True) -> None:
        """One window's ``metrics.jsonl`` line as ``window/<field>`` scalars, flushed to disk
        (``flush``) so that TensorBoard shows it now."""
        step = int(line.get("window") or 0)
        walltime = float(line["time"])
        for key, value in line.items():
            number = finite_number(value)
            if key not in SKIPPED_FIELDS and number is not None:
                self.writer.add_scalar(f"window/{key}", number, step, walltime=walltime)
        self.windows += 1
        if flush:
            self.writer.flush()

    def finish(self, run_dir: str | Path) -> Path:
        """Add the per-client epsilon curves of the run directory and close; the log dir."""
        try:
            run = RunDirectory.load(run_dir)
            self._final(run)
            self._epsilon(run)
        finally:
            self.close()
        return self.log_dir

    def close(self) -> None:
        self.writer.close()

    def _final(self, run: RunDirectory) -> None:
        """``final/accuracy`` and ``final/loss``: the final model's evaluation at the run's end
        (a stranger's run shorter than eval_every had no accuracy scalar at all)."""
        from fedsim.reporting.plots import final_point

        final = final_point(run)
        if final is None:
            return
        time, accuracy, _ = final
        step = int(run.metrics[-1].get("window") or 0) if run.metrics else 0
        self.writer.add_scalar("final/accuracy", accuracy, step, walltime=time)
        loss = finite_number(run.summary.get("final_loss"))
        if loss is not None:
            self.writer.add_scalar("final/loss", loss, step, walltime=time)

    def _epsilon(self, run: RunDirectory) -> None:
        from fedsim.reporting.epsilon_history import TIME_GRID_POINTS, epsilon_history, time_grid
        from fedsim.reporting.ledgers import read_ledgers

        ledgers = read_ledgers(run)
        if not ledgers:
            return
        last_release = max((lg.steps[-1][0] for lg in ledgers if lg.steps), default=0.0)
        grid = time_grid(max(run.virtual_time, last_release), TIME_GRID_POINTS)
        history = epsilon_history(ledgers, grid, run.delta)
        times = [float(m["time"]) for m in run.metrics]
        windows = [int(m.get("window") or 0) for m in run.metrics]
        # One point a step: the grid is dense early (several times in one window) and times
        # past the last window all fall in it; a step's point is its latest time (a stranger
        # saw two values at one step).
        latest: dict[int, int] = {}
        for column, moment in enumerate(history.times):
            at = bisect.bisect_left(times, float(moment))
            latest[windows[min(at, len(windows) - 1)] if windows else column] = column
        for step, column in latest.items():
            moment = history.times[column]
            values = history.epsilon[:, column]
            for client_id, value in zip(history.client_ids, values, strict=True):
                self.writer.add_scalar(f"epsilon/{client_id}", float(value), step,
                                       walltime=float(moment))
            for name, value in (("min", values.min()), ("median", np.median(values)),
                                ("max", values.max())):
                self.writer.add_scalar(f"epsilon_summary/{name}", float(value), step,
                                       walltime=float(moment))


@contextmanager
def tensorboard_during(log_dir: str | PathLike[str] | None, run_dir: str | Path
                       ) -> Iterator[Callable[[Mapping[str, Any]], None]]:
    """Within the block, the callable writes a window's metrics line to ``log_dir`` as the run
    goes (:class:`LiveExport`); at its end, the per-client epsilon curves are added from
    ``run_dir`` if the run wrote its directory (also an interrupted one). ``log_dir`` None:
    the callable does nothing."""
    if log_dir is None:
        yield lambda line: None
        return
    live = LiveExport(log_dir)
    try:
        yield live.window
    finally:
        if (Path(run_dir) / SUMMARY_FILE).exists():
            live.finish(run_dir)
        else:
            live.close()  # the run never wrote its directory: nothing more to add


def export_run(run_dir: str | Path, log_dir: str | Path) -> Path:
    """Write the scalars of the finished ``run_dir`` (see the module docstring) as one
    TensorBoard event file under ``log_dir`` and return ``log_dir``."""
    run = RunDirectory.load(run_dir)
    export = LiveExport(log_dir)
    try:
        for row in run.metrics:
            export.window(row, flush=False)
    except BaseException:
        export.close()
        raise
    return export.finish(run_dir)
