"""The install instructions agree: the README, the Dockerfile and ``.ci/run`` pin the same torch,
inside the package's own range, and each names PyTorch's CPU wheel index (PyPI's Linux torch
is the CUDA build, several GB of nvidia-* packages)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH_PIN = re.compile(r"\btorch==([0-9][0-9.]*)")
FILES = ("README.md", "Dockerfile", ".ci/run")


def _torch_range() -> Requirement:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return next(Requirement(d) for d in project["dependencies"] if Requirement(d).name == "torch")


def test_each_file_pins_one_torch_inside_the_package_range() -> None:
    allowed = _torch_range().specifier
    pins = {name: set(TORCH_PIN.findall((REPO / name).read_text(encoding="utf-8")))
            for name in FILES}
    assert all(len(found) == 1 for found in pins.values()), pins
    versions = {found.pop() for found in pins.values()}
    assert len(versions) == 1, versions
    assert Version(versions.pop()) in allowed


def test_each_file_names_the_cpu_wheel_index() -> None:
    for name in FILES:
        assert CPU_INDEX in (REPO / name).read_text(encoding="utf-8"), name
    # The image installs torch from that index (the default one would bring CUDA's libraries).
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8")
    torch_lines = [line for line in dockerfile.splitlines()
                   if line.startswith("RUN") and TORCH_PIN.search(line)]
    assert torch_lines and all(f"--index-url {CPU_INDEX}" in line for line in torch_lines)


def test_the_readme_commands_and_the_cpu_only_alternative() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r"^pip install torch==\S+ (.*)$", readme, flags=re.MULTILINE)
    assert commands == ["-e . && fedsim run scenarios/quickstart.yaml",
                        "-e '.[test]' && python -m pytest -q",
                        f"--index-url {CPU_INDEX}"]
