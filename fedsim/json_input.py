"""JSON that someone else wrote (a run directory handed over, a ledger, a message, a file given
on the command line): one parse whose every failure is a :class:`json.JSONDecodeError`.

:func:`json.loads` fails three ways besides its own ``JSONDecodeError``: a document nested a
few thousand levels deep (4 KB of ``[``) raises :class:`RecursionError`, and an integer of more
than 4,300 digits a plain :class:`ValueError` (Python's limit on converting digits). Readers
that caught ``JSONDecodeError`` or ``ValueError`` printed a traceback for the first (an
attacker's review: ``fedsim report``, ``fedsim ledger check``, ``fedsim account --ledger``,
``fedsim launch --resume``). Here both become a ``JSONDecodeError`` (a ``ValueError``), so one
``except`` clause covers every damaged file. What a caller's ``parse_constant`` raises (its
refusal of ``NaN``) passes unchanged.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from fedsim.atomic import read_regular
from fedsim.errors import ConfigError

__all__ = ["json_problem", "parse_json", "read_json_model"]


class _Refused(Exception):
    """Carries what the caller's ``parse_constant`` raised through the parse, untouched."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error


def parse_json(text: str | bytes | bytearray,
               parse_constant: Callable[[str], Any] | None = None) -> Any:
    """``json.loads(text)``, raising :class:`json.JSONDecodeError` for deep nesting and
    oversized integers too (see the module docstring); what ``parse_constant`` raises is
    raised as it is."""
    guarded = None
    if parse_constant is not None:
        def guarded(name: str) -> Any:
            try:
                return parse_constant(name)
            except Exception as exc:  # noqa: BLE001 - handed back unchanged below
                raise _Refused(exc) from None

    try:
        return json.loads(text, parse_constant=guarded)
    except _Refused as refused:
        raise refused.error from None
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply to read", "", 0) from None
    except json.JSONDecodeError:
        raise
    except UnicodeDecodeError:  # (bytes given: json decodes them first)
        raise json.JSONDecodeError("not UTF-8 text", "", 0) from None
    except ValueError:  # Python's limit on an integer's digits (4,300)
        raise json.JSONDecodeError("a number of more digits than can be read", "", 0) from None


def json_problem(error: json.JSONDecodeError, *, line: bool = True) -> str:
    """What is wrong with a document :func:`parse_json` refused, and where: ``Invalid control
    character at line 1, column 6`` (``line=False``: the column alone, for a file read a line
    at a time). Python's own messages end in "at" or "starting at" (they are written to
    stand before its ": line 1 column 6"): a stranger's report said "Invalid control character
    at at line 1"."""
    what = error.msg.removesuffix(" at")
    if not error.doc:  # parse_json's own refusals (nesting, digits, UTF-8) have no place
        return what
    return f"{what} at line {error.lineno}, column {error.colno}" if line \
        else f"{what} at column {error.colno}"


_Model = TypeVar("_Model", bound=BaseModel)


def read_json_model(path: Path, model: type[_Model], *, most: int, shape: str) -> _Model | None:
    """The small JSON file at ``path`` (one fedsim writes, in place or atomically: a client's
    owner and followed runs, a server's high-water mark) as ``model`` says it, None where there
    is none. One that is there but cannot be read (a FIFO, a link, a directory, unreadable), is
    larger than ``most`` bytes, is not JSON or is not ``shape`` raises :class:`ConfigError`
    ``"<path> is damaged (<what is wrong>)"``, for the caller to say what the file keeps and
    what to do: damage never passes for absence."""
    if not os.path.lexists(path):
        return None
    try:
        return model.model_validate(parse_json(
            read_regular(path, refuse_over=most, no_link=True)))
    except OSError as exc:  # a FIFO, a link, a directory, unreadable, too large: named
        problem = str(exc) if exc.filename is None else exc.strerror
    except json.JSONDecodeError as exc:
        problem = f"not JSON ({json_problem(exc)})"
    except UnicodeDecodeError:
        problem = "not JSON (not UTF-8)"
    except ValidationError:
        problem = f"not {shape}"
    raise ConfigError(f"{path} is damaged ({problem})") from None
