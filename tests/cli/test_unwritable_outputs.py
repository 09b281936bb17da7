"""An output that cannot be written is one line and exit 2, found before any work: ``run
--out`` (and its default ``runs/``), ``sweep --out``, ``compare --plots``, ``launch --out``, ``report`` on a run
whose plots cannot be redrawn, and ``simulate(out=...)``.

Three ways to make a place unwritable: a regular file in the way (works for everyone), a
directory without write permission (chmod 0o500; skipped as root, whom permission bits do not
stop), and a read-only file system (a read-only tmpfs and a read-only bind mount in a private
mount namespace, ``unshare --map-root-user --mount``; skipped where that is not allowed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import fedsim
from fedsim.cli import main
from fedsim.errors import ConfigError
from fedsim.runtime import population
from fedsim.runtime.run_outputs import require_writable_dir
from tests.api.conftest import TINY

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("scenario") / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def a_run(scenario: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "tiny"
    fedsim.simulate(scenario, out=out, progress=False, plots=False)
    return out


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a population (data, model, clients) is the first work: it must not start."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("work started before the output was checked")

    monkeypatch.setattr(population, "build_population", refuse)


def _one_line_error(capsys: pytest.CaptureFixture[str], *expected: str) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(text in lines[0] for text in expected), lines[0]
    return lines[0]


def _commands(scenario: Path, a_run: Path, place: Path) -> dict[str, list[str]]:
    return {
        "run": ["run", str(scenario), "--out", str(place / "run")],
        "run --tensorboard": ["run", str(scenario), "--out", str(place.parent / "fine"),
                              "--tensorboard", str(place / "tb")],
        "sweep": ["sweep", str(scenario), "--grid", "seed=1,2", "--out", str(place / "sweep")],
        "compare": ["compare", str(a_run), "--plots", str(place / "compare")],
        # (a stranger's launch into a file's path raised NotADirectoryError, a traceback,
        # after loading the scenario and building the launcher)
        "launch": ["launch", str(scenario), "--out", str(place / "launch"), "--no-plots"],
    }


# ----------------------------------------------------------------------------- a file in the way
@pytest.mark.parametrize("command", ["run", "run --tensorboard", "sweep", "compare", "launch"])
def test_a_file_in_the_way(command: str, scenario: Path, a_run: Path, tmp_path: Path,
                           no_work: None, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory", encoding="utf-8")
    assert main(_commands(scenario, a_run, blocker)[command]) == 2
    _one_line_error(capsys, str(blocker), "is a file, not a directory")
    assert not (tmp_path / "fine").exists()  # nothing created for the run either


def test_an_executor_that_is_not_installed_is_refused_before_any_work(
        scenario: Path, tmp_path: Path, no_work: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's review (session 56): ``--executor ray`` without ray built the population,
    wrote ten ledgers and an empty metrics.jsonl, then failed; the same ``--out`` was then
    refused as holding a run's ledgers. Now it is refused first, and nothing is made."""
    monkeypatch.setitem(sys.modules, "ray", None)  # (import ray: ImportError)
    out = tmp_path / "ray-run"
    assert main(["run", str(scenario), "--executor", "ray", "--out", str(out)]) == 2
    _one_line_error(capsys, "--executor ray needs the ray package", "fedsim[ray]")
    assert not out.exists()


def test_report_on_a_run_whose_plots_cannot_be_drawn(
        a_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "copy"
    shutil.copytree(a_run, run)
    (run / "plots").write_text("a file where the plots go", encoding="utf-8")
    assert main(["report", str(run)]) == 2
    _one_line_error(capsys, "plots directory", "is a file, not a directory")


def test_simulate_refuses_before_running(scenario: Path, tmp_path: Path, no_work: None) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("", encoding="utf-8")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        fedsim.simulate(scenario, out=blocker / "run", progress=False)


def test_a_directory_that_can_be_made_is_not_made(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c"
    assert require_writable_dir(target, "--out") == target
    assert list(tmp_path.iterdir()) == []  # neither the directories nor the probe file


# --------------------------------------------------------------------- no write permission
@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="permission bits do not stop root (the read-only file system test "
                           "covers this case there)")
@pytest.mark.parametrize("command", ["run", "sweep", "compare", "launch"])
def test_a_directory_without_write_permission(
        command: str, scenario: Path, a_run: Path, tmp_path: Path, no_work: None,
        capsys: pytest.CaptureFixture[str]) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        assert main(_commands(scenario, a_run, locked)[command]) == 2
        _one_line_error(capsys, str(locked), "Permission denied")
    finally:
        locked.chmod(0o700)


# ------------------------------------------------------------------- a read-only file system
READ_ONLY_SCRIPT = """
import contextlib, io, json, os, sys
from fedsim.cli import main
import fedsim

scenario, run, ro = sys.argv[1:4]
results = {}
def attempt(name, argv, cwd=None):
    err = io.StringIO()
    here = os.getcwd()
    if cwd:
        os.chdir(cwd)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
    finally:
        os.chdir(here)
    results[name] = [code, err.getvalue()]

attempt("run --out", ["run", scenario, "--out", ro + "/run"])
attempt("run (default runs/)", ["run", scenario], cwd=ro)
attempt("sweep --out", ["sweep", scenario, "--grid", "seed=1,2", "--out", ro + "/sweep"])
attempt("compare --plots", ["compare", run, "--plots", ro + "/compare"])
attempt("launch --out", ["launch", scenario, "--out", ro + "/launch", "--no-plots"])
attempt("report", ["report", run])
try:
    fedsim.simulate(scenario, out=ro + "/api", progress=False)
    results["simulate(out=)"] = [0, ""]
except fedsim.errors.ConfigError as exc:
    results["simulate(out=)"] = [exc.exit_code, str(exc)]
print(json.dumps(results))
"""


def _private_read_only_mounts(ro: Path, run: Path) -> list[str] | None:
    """The shell prefix that runs a command with ``ro`` a read-only tmpfs and ``run`` bound
    read-only, in a mount namespace of its own (nothing outside sees them); None where this
    machine does not allow it."""
    unshare, mount = shutil.which("unshare"), shutil.which("mount")
    if os.name != "posix" or unshare is None or mount is None:
        return None
    setup = (f"mount -t tmpfs -o ro,size=1m tmpfs '{ro}' && mount --bind '{run}' '{run}' && "
             f"mount -o remount,ro,bind '{run}'")
    probe = subprocess.run([unshare, "--map-root-user", "--mount", "sh", "-c",
                            f"{setup} && ! touch '{ro}/x' 2>/dev/null && ! touch '{run}/x' "
                            "2>/dev/null"], capture_output=True, timeout=60, check=False)
    if probe.returncode != 0:
        return None
    return [unshare, "--map-root-user", "--mount", "sh", "-c", f'{setup} && exec "$@"', "sh"]


@pytest.mark.slow
def test_a_read_only_file_system(scenario: Path, a_run: Path, tmp_path: Path) -> None:
    ro, run = tmp_path / "ro", tmp_path / "run"
    ro.mkdir()
    shutil.copytree(a_run, run)
    prefix = _private_read_only_mounts(ro, run)
    if prefix is None:
        pytest.skip("no private read-only mounts here (unshare --map-root-user --mount)")
    done = subprocess.run(
        [*prefix, sys.executable, "-c", READ_ONLY_SCRIPT, str(scenario), str(run), str(ro)],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    results: dict[str, list[object]] = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(results) == {"run --out", "run (default runs/)", "sweep --out",
                            "compare --plots", "launch --out", "report", "simulate(out=)"}
    for name, (code, err) in results.items():
        assert code == 2, (name, err)
        assert isinstance(err, str)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Read-only file system" in lines[0], (name, err)
    assert not any(ro.iterdir())  # outside the namespace: an empty, writable directory
