"""fedsim's C kernels: built on first use with the system's C compiler, cached per machine.

Five kernels ship as C source: beside this module the Gaussian sampler (``_gaussian.c``,
:mod:`fedsim.training.gaussian`), a client's local step (``_local_step.c``,
:mod:`fedsim.training.local_step`), the per-example convolution weight gradients
(``_conv_grad.c``, :mod:`fedsim.training.persample.direct`), an update's sum of squares
(``fedsim/protocol/_sum_squares.c``, :mod:`fedsim.protocol.norms`) and the server's scaled
addition into its window mix (``fedsim/aggregation/_scaled_add.c``,
:mod:`fedsim.aggregation.scaled_add`). :func:`load_library` compiles one
with ``$CC`` (else ``cc``, else ``gcc``) for this CPU (``-march=native``) into the user cache,
once per source, recipe, compiler and CPU, and loads it through ctypes. Every caller checks the
loaded kernel against its torch or numpy definition before use and keeps that implementation for
when there is no compiler, a build fails, or the user opts out (each kernel's own environment
variable): a kernel is a speed-up, never a requirement.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedsim.atomic import move_into_place
from fedsim.data.locate import user_cache_dir
from fedsim.logging import get_logger

__all__ = ["RECIPES", "load_function", "load_library", "misaligned", "recipes"]

_log = get_logger("fedsim.training.native")

# Build recipes, best first: (compile flags, link flags). -ffast-math lets the kernels' loops
# vectorise (no errno from sqrtf, reassociation); the link step leaves it out so that gcc does
# not add crtfastmath (which would flush denormals process-wide). Compilers without OpenMP
# (Apple's clang) get the later recipes: the same code, serial, or not vectorised.
_BASE_FLAGS = ("-O3", "-march=native", "-ffast-math", "-fPIC")
RECIPES: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    ((*_BASE_FLAGS, "-fopenmp"), ("-shared", "-fopenmp", "-lm")),
    (_BASE_FLAGS, ("-shared", "-lm")),
    (("-O3", "-fPIC"), ("-shared", "-lm")),
)


def _cpu_tag() -> str:
    """The CPU a library is built for (-march=native): part of the cached library's name."""
    flags = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            flags = next((line for line in info if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return f"{platform.machine()}|{platform.processor()}|{flags}"


def recipes(*, fast_math: bool = True) -> tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]:
    """:data:`RECIPES`, or for a kernel whose results must be numpy's to the bit (each product
    rounded, then each sum) without ``-ffast-math`` (under which clang fuses a multiply and an
    add whatever the source asks) and with ``-ffp-contract=off`` (GCC fuses them by default in
    GNU C; clang accepts the flag too)."""
    if fast_math:
        return RECIPES
    return tuple((tuple(f for f in flags if f != "-ffast-math") + ("-ffp-contract=off",), link)
                 for flags, link in RECIPES)


def _compile(compiler: str, source: Path, target: Path,
             chosen: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = RECIPES) -> None:
    """Build the shared library at ``target`` (atomically: concurrent processes may race)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    errors = []
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        obj, library = Path(scratch) / "kernel.o", Path(scratch) / "kernel.so"
        for compile_flags, link_flags in chosen:
            for command in ([compiler, *compile_flags, "-c", str(source), "-o", str(obj)],
                            [compiler, str(obj), "-o", str(library), *link_flags]):
                result = subprocess.run(command, capture_output=True, timeout=120, check=False)
                if result.returncode != 0:
                    errors.append(result.stderr.decode(errors="replace").strip()[-300:])
                    break
            else:
                # Durability "file": a torn library would crash the loader after a power
                # failure; losing the rename only means compiling again.
                move_into_place(library, target, durability="file")
                return
    raise RuntimeError("every build recipe failed: " + " | ".join(errors))


def load_library(source: Path, *, what: str, opt_out: str,
                 fast_math: bool = True) -> ctypes.CDLL | None:
    """The compiled ``source``, built into the user cache if needed; None (with a warning
    naming ``what``) when there is no compiler or no recipe builds it, and silently when the
    environment variable ``opt_out`` is set to anything but ``0``, ``false``, ``no`` or
    ``off`` (any case) or the empty string. ``fast_math=False`` builds without
    ``-ffast-math`` (:func:`recipes`)."""
    if os.environ.get(opt_out, "").strip().lower() not in ("", "0", "false", "no", "off"):
        return None
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        _log.warning(f"no C compiler found: {what} uses its Python implementation (slower)")
        return None
    chosen = recipes(fast_math=fast_math)
    tag = hashlib.sha256(
        source.read_bytes() + repr((chosen, compiler, _cpu_tag())).encode()
    ).hexdigest()[:16]
    target = user_cache_dir() / "native" / f"{source.stem.lstrip('_')}-{tag}.so"
    try:
        if not target.is_file():
            _compile(compiler, source, target, chosen)
        return ctypes.CDLL(str(target))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        _log.warning(f"could not build the {what} kernel; using its Python implementation",
                     error=str(exc)[-1000:])
        return None


def load_function(source: Path, symbol: str, *, argtypes: Sequence[Any], restype: Any,
                  agrees: Callable[[Any], bool], what: str, opt_out: str,
                  fast_math: bool = True) -> Any | None:
    """The C function ``symbol`` of the compiled ``source`` (:func:`load_library`) with its
    ctypes signature, once ``agrees(function)`` has checked it against its definition; None
    without a compiler, after a failed build, when opted out, or (with a warning) when the
    check fails."""
    library = load_library(source, what=what, opt_out=opt_out, fast_math=fast_math)
    if library is None:
        return None
    function = getattr(library, symbol)
    function.argtypes = list(argtypes)
    function.restype = restype
    if not agrees(function):
        _log.warning(f"the compiled {what} disagrees with its definition; using its Python "
                     "implementation")
        return None
    return function


def misaligned(array: np.ndarray, offset: int = 1) -> np.ndarray:
    """A read-only copy of the 1-D ``array`` whose data starts ``offset`` bytes into a bytes
    object, so off its dtype's alignment (for 0 < ``offset`` < itemsize), as a decoded update
    is a view into its frame at any byte offset: what the kernels' probes (``agrees``) feed a
    kernel that must read any alignment."""
    return np.frombuffer(b"\0" * offset + array.tobytes(), dtype=array.dtype, offset=offset)
