"""Where the simulator trains and evaluates: ``device: cpu | cuda | mps | auto``.

The scenario's model, each client's training records and the batched rounds' buffers live on
the device; so does the noise of each DP step, drawn there by the torch implementation of the
sampler of :mod:`fedsim.training.gaussian` from the same per-step key (so the distribution and
the independence between steps are those of the CPU kernel, the values equal up to float32
rounding of log/cos). Batch selection, noise keys, privacy ledgers and accounting stay on the
CPU: the generators are CPU generators whatever the device, so a run draws the same batches
on any device.

``auto`` picks ``cuda``, then ``mps``, then ``cpu``, and logs the choice; a requested device
that this machine (or this torch build) lacks is a :class:`~fedsim.errors.ConfigError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from fedsim.errors import ConfigError
from fedsim.logging import get_logger

DeviceName = Literal["cpu", "cuda", "mps", "auto"]
DEVICE_NAMES: tuple[str, ...] = get_args(DeviceName)

_log = get_logger("fedsim.device")


@dataclass(frozen=True)
class Accelerators:
    """Which accelerators this process can use."""

    cuda: bool
    mps: bool

    @classmethod
    def detect(cls) -> Accelerators:
        mps = getattr(torch.backends, "mps", None)
        return cls(cuda=torch.cuda.is_available(),
                   mps=bool(mps is not None and mps.is_available()))


def _missing(name: str) -> ConfigError:
    if name == "cuda":
        why = ("this torch build has no CUDA support" if torch.version.cuda is None
               else f"torch (CUDA {torch.version.cuda}) finds no usable GPU")
    else:
        why = "torch finds no Apple-silicon GPU (MPS) here"
    return ConfigError(f"device: {name} was requested but {why} (torch {torch.__version__}); "
                       "use device: cpu, or device: auto to take the best one present")


def resolve_device(requested: str, *, present: Accelerators | None = None) -> torch.device:
    """The ``torch.device`` for the scenario's ``device`` (``present``: detected if None)."""
    if requested not in DEVICE_NAMES:
        raise ConfigError(f"device: {requested!r} is not one of {list(DEVICE_NAMES)}")
    if requested == "cpu":
        return torch.device("cpu")
    have = Accelerators.detect() if present is None else present
    if requested == "auto":
        chosen = "cuda" if have.cuda else "mps" if have.mps else "cpu"
        _log.info("device chosen", requested="auto", device=chosen, cuda=have.cuda, mps=have.mps)
        return torch.device(chosen)
    if not getattr(have, requested):
        raise _missing(requested)
    return torch.device(requested)
