"""The README's Layout block names what is there: every package of ``fedsim``, every module of
the runtime (listed file by file, the actors and the two runtimes being what a reader looks for
first), and every ``fedsim`` sub-command. A module or command added without its line fails
here (a stranger's review found the aggregation node's modules and command missing)."""

from __future__ import annotations

import re
from pathlib import Path

from fedsim.cli import COMMANDS

REPO = Path(__file__).resolve().parents[2]


def _layout() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Layout"):]
    start = section.index("```") + 3
    return section[start:section.index("```", start)]


def test_every_package_is_in_the_layout() -> None:
    layout = _layout()
    packages = [p.name for p in (REPO / "fedsim").iterdir()
                if p.is_dir() and (p / "__init__.py").exists()]
    assert packages
    missing = [name for name in packages if f"{name}/" not in layout]
    assert not missing, missing


def test_every_runtime_module_is_in_the_layout() -> None:
    named = set(re.findall(r"\b\w+\.py\b", _layout()))
    modules = [p for p in (REPO / "fedsim" / "runtime").rglob("*.py") if p.name != "__init__.py"]
    assert len(modules) > 20
    missing = [str(p.relative_to(REPO)) for p in modules if p.name not in named]
    assert not missing, missing


def test_every_command_is_on_the_cli_line() -> None:
    layout = _layout()
    line = layout[layout.index("cli.py"):]
    line = line[:line.index("examples/")]  # cli.py's entry, over its continuation line
    listed = {word.strip() for word in line.removeprefix("cli.py").replace("fedsim", "").split("|")}
    assert set(COMMANDS) <= listed, set(COMMANDS) - listed
