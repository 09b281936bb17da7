"""A run directory's metrics as TensorBoard scalars (``fedsim run --tensorboard DIR``,
``fedsim.simulate(..., tensorboard=DIR)``; needs the ``fedsim[tensorboard]`` extra).

Written from the finished run directory (so the scalars are exactly the files' numbers):

* ``window/<field>`` for every numeric field of each ``metrics.jsonl`` line (``accuracy`` on
  the windows that were evaluated, ``loss``, the update counts ``received``, ``applied``,
  ``stale``, ``duplicate``, ``rejected``, ``dropped_in_flight``, ``active_clients``,
  ``step_size``, ``min_remaining_epsilon``, ``time``), at step = the window number;
* ``epsilon/<client id>``: each client's epsilon at the scenario's delta, from its ledger
  under its enforcing accountant (the numbers of ``fedsim report``'s epsilon plot), on
  :data:`~fedsim.reporting.plots.TIME_GRID_POINTS` virtual times, at step = the window in
  progress at that time; and ``epsilon_summary/{min,median,max}`` over the clients.

Every event's wall time is its virtual time (seconds), so TensorBoard's "relative" horizontal
axis reads virtual seconds, and two exports of one run directory write the same scalars.
"""

from __future__ import annotations

import bisect
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.errors import ConfigError
from fedsim.reporting.rundir import RunDirectory

SKIPPED_FIELDS = frozenset({"window", "version"})
INSTALL_HINT = "pip install 'fedsim[tensorboard]' (or: pip install tensorboard)"


def require_tensorboard() -> None:
    """Raise :class:`ConfigError` (before a run starts) if the extra is not installed."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(f"--tensorboard needs the tensorboard package: {INSTALL_HINT}")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if np.isfinite(value) else None


def export_run(run_dir: str | Path, log_dir: str | Path) -> Path:
    """Write the scalars of ``run_dir`` (see the module docstring) as one TensorBoard event
    file under ``log_dir`` and return ``log_dir``."""
    require_tensorboard()
    from torch.utils.tensorboard import SummaryWriter

    from fedsim.reporting.ledgers import read_ledgers
    from fedsim.reporting.plots import TIME_GRID_POINTS, epsilon_history, time_grid

    run = RunDirectory.load(run_dir)
    target = Path(log_dir)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--tensorboard {target}: cannot create it ({exc.strerror})") from None
    writer = SummaryWriter(log_dir=str(target))
    try:
        for row in run.metrics:
            step = int(row.get("window") or 0)
            for key, value in row.items():
                number = _number(value)
                if key not in SKIPPED_FIELDS and number is not None:
                    writer.add_scalar(f"window/{key}", number, step, walltime=float(row["time"]))
        ledgers = read_ledgers(run)
        if ledgers:
            last_release = max((lg.steps[-1][0] for lg in ledgers if lg.steps), default=0.0)
            grid = time_grid(max(run.virtual_time, last_release), TIME_GRID_POINTS)
            history = epsilon_history(ledgers, grid, run.delta)
            times = [float(m["time"]) for m in run.metrics]
            windows = [int(m.get("window") or 0) for m in run.metrics]
            for column, moment in enumerate(history.times):
                at = bisect.bisect_left(times, float(moment))
                step = windows[min(at, len(windows) - 1)] if windows else column
                values = history.epsilon[:, column]
                for client_id, value in zip(history.client_ids, values, strict=True):
                    writer.add_scalar(f"epsilon/{client_id}", float(value), step,
                                      walltime=float(moment))
                for name, value in (("min", values.min()), ("median", np.median(values)),
                                    ("max", values.max())):
                    writer.add_scalar(f"epsilon_summary/{name}", float(value), step,
                                      walltime=float(moment))
    finally:
        writer.close()
    return target
