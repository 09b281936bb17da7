"""The one resolver for where a data file is: a scenario's path, $FEDSIM_DATA_DIR, the cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedsim.data.locate import (
    Place,
    offline,
    path_candidates,
    resolve_path,
    search_path,
    user_cache_dir,
)


def test_relative_paths_try_the_scenario_directory_then_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    beside = tmp_path / "scenarios"
    beside.mkdir()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.npz").write_bytes(b"y")
    assert resolve_path("data.npz", beside) == (tmp_path / "data.npz").resolve()
    (beside / "data.npz").write_bytes(b"x")  # beside the scenario file wins over the cwd
    assert resolve_path("data.npz", beside) == (beside / "data.npz").resolve()
    assert resolve_path("none.npz", beside) == (beside / "none.npz").resolve()
    long = "x" * 5000  # a name the OS refuses counts as absent
    assert resolve_path(long, beside) == (beside / long).resolve()


def test_an_absolute_path_is_itself_and_the_cwd_is_not_listed_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert path_candidates(tmp_path / "x.npz", tmp_path / "elsewhere") == [tmp_path / "x.npz"]
    monkeypatch.chdir(tmp_path)
    assert path_candidates("x.npz", tmp_path) == [(tmp_path / "x.npz").resolve()]
    assert path_candidates("x.npz", None) == [(tmp_path / "x.npz").resolve()]


def test_search_path_is_the_path_then_the_data_dir_then_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("FEDSIM_DATA_DIR", raising=False)
    beside = tmp_path / "scenarios"
    assert search_path("mnist.npz", "d", beside) == [
        Place("dataset.path", (beside / "d").resolve()),
        Place("dataset.path", (tmp_path / "d").resolve()),
        Place("$FEDSIM_DATA_DIR", None),
        Place("user cache", tmp_path / "cache" / "fedsim" / "mnist.npz"),
    ]
    monkeypatch.setenv("FEDSIM_DATA_DIR", str(tmp_path / "data"))
    steps = search_path("mnist.npz")
    assert steps[0] == Place("$FEDSIM_DATA_DIR", tmp_path / "data")
    assert [s.origin for s in steps] == ["FEDSIM_DATA_DIR", "cache"]
    assert user_cache_dir() == tmp_path / "cache" / "fedsim"


@pytest.mark.parametrize(("value", "expected"), [
    ("1", True), ("yes", True), (" TRUE ", True), ("on", True), ("0", False), ("", False)])
def test_offline_follows_fedsim_offline(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: bool
) -> None:
    monkeypatch.setenv("FEDSIM_OFFLINE", value)
    assert offline() is expected


@pytest.mark.parametrize("xdg", ["cache", "./cache", ""])
def test_a_relative_or_empty_xdg_cache_home_is_ignored(
    xdg: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stranger's ``XDG_CACHE_HOME=cache`` made ``fedsim data where mnist`` list
    ``cache/fedsim/mnist.npz``: every working directory got its own download (and kernels).
    The XDG Base Directory specification says a relative path is to be ignored: the cache is
    then ``~/.cache/fedsim``, as without the variable."""
    from fedsim.cli import main

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    monkeypatch.delenv("FEDSIM_DATA_DIR", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert user_cache_dir() == home / ".cache" / "fedsim"
    assert main(["data", "where", "mnist"]) == 0
    listed = capsys.readouterr().out
    assert f"user cache\t{home / '.cache' / 'fedsim' / 'mnist.npz'}\tabsent" in listed
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "abs"))  # an absolute one is taken
    assert user_cache_dir() == tmp_path / "abs" / "fedsim"
