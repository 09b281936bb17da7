"""Where a data file is: the one resolver every data set, the ``data`` command and the run
use.

The places, in order:

1. a scenario's ``dataset.path`` (a file or a directory), relative to the scenario file's
   directory first, then to the working directory (:func:`path_candidates`; an absolute path
   is itself);
2. ``$FEDSIM_DATA_DIR`` (a directory);
3. the user cache, ``$XDG_CACHE_HOME/fedsim`` (default ``~/.cache/fedsim``).

A registered data set is looked for in all three (:func:`search_path`) and downloaded into
the cache when it is in none, unless offline (``FEDSIM_OFFLINE=1``, set by ``--offline``:
:func:`offline`); the user's own ``arrays`` file only at its path (:func:`resolve_path`).
The scenario's loader keeps ``dataset.path`` as the string written; it is resolved here,
when the run or a command needs the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fedsim.errors import DataError

__all__ = [
    "DATA_DIR_ENV",
    "OFFLINE_ENV",
    "Place",
    "offline",
    "path_candidates",
    "resolve_path",
    "search_path",
    "user_cache_dir",
]

DATA_DIR_ENV = "FEDSIM_DATA_DIR"
OFFLINE_ENV = "FEDSIM_OFFLINE"


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/fedsim`` (default ``~/.cache/fedsim``). A relative
    ``$XDG_CACHE_HOME`` is ignored, as the XDG Base Directory specification says (a
    stranger's ``XDG_CACHE_HOME=cache`` put a fresh MNIST download and compiled kernels in
    every working directory fedsim ran in)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fedsim"


def offline() -> bool:
    """Whether downloads are off (``FEDSIM_OFFLINE`` set to 1/true/yes/on)."""
    return os.environ.get(OFFLINE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def path_candidates(path: str | os.PathLike[str], base_dir: Path | None) -> list[Path]:
    """Where a scenario's relative path may be, in order: beside the scenario file
    (``base_dir``), then in the working directory. An absolute path is itself."""
    try:
        candidate = Path(path).expanduser()
    except RuntimeError:  # "~nouser/x": no such home (an attacker's review: a traceback)
        raise DataError(f"{path}: its ~user has no home directory here") from None
    if candidate.is_absolute():
        return [candidate]
    places = [(base_dir / candidate).resolve()] if base_dir is not None else []
    in_cwd = candidate.resolve()
    return places if in_cwd in places else [*places, in_cwd]


def resolve_path(path: str | os.PathLike[str], base_dir: Path | None) -> Path:
    """The first of :func:`path_candidates` that exists (the first of all when none does)."""
    places = path_candidates(path, base_dir)
    return next((p for p in places if _exists(p)), places[0])


def _exists(path: Path) -> bool:
    """``path.exists()``, false for a name the OS refuses (too long, NUL byte)."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


@dataclass(frozen=True)
class Place:
    """One place a data set is looked for: which step (``"dataset.path"``,
    ``"$FEDSIM_DATA_DIR"``, ``"user cache"``) and where (None: ``$FEDSIM_DATA_DIR`` unset)."""

    what: str
    where: Path | None

    @property
    def origin(self) -> str:
        """The step's name as a found data set records it (``"dataset.path"``,
        ``"FEDSIM_DATA_DIR"`` or ``"cache"``)."""
        return "cache" if self.what == "user cache" else self.what.lstrip("$")


def search_path(file_name: str, path: str | os.PathLike[str] | None = None,
                base_dir: Path | None = None) -> list[Place]:
    """The places a data set cached as ``file_name`` is looked for, in order (see the module
    docstring); ``path`` is the scenario's ``dataset.path`` and ``base_dir`` the scenario
    file's directory."""
    places = [Place("dataset.path", p) for p in (path_candidates(path, base_dir) if path else [])]
    data_dir = os.environ.get(DATA_DIR_ENV)
    places.append(Place(f"${DATA_DIR_ENV}", Path(data_dir).expanduser() if data_dir else None))
    places.append(Place("user cache", user_cache_dir() / file_name))
    return places
