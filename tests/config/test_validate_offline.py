"""``fedsim validate`` reads the file, never the network: offline, with empty data places, a
shipped scenario whose data set is not here is valid (the checks that read the data are
skipped, saying so), and ``--check-data`` is the named check that needs the data."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedsim.cli import main
from fedsim.data import datasets

REPO = Path(__file__).resolve().parents[2]
CIFAR = REPO / "scenarios" / "cifar10-groupnorm.yaml"


@pytest.fixture(params=["offline", "online"])
def empty_data_places(request: pytest.FixtureRequest, tmp_path: Path,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    """No data set anywhere it is looked for; FEDSIM_OFFLINE=1, or not (then a fetch would be
    tried, and fails the test)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "cache").mkdir()
    monkeypatch.setenv("FEDSIM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    if request.param == "offline":
        monkeypatch.setenv("FEDSIM_OFFLINE", "1")
    else:
        monkeypatch.delenv("FEDSIM_OFFLINE", raising=False)
    monkeypatch.chdir(tmp_path)

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("validate tried to fetch a data set")

    monkeypatch.setattr(datasets, "fetch", no_network)


def test_a_scenario_whose_data_is_not_here_is_valid(
        empty_data_places: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(CIFAR)]) == 0
    out = capsys.readouterr().out
    assert "cifar10-groupnorm.yaml: valid (" in out
    assert "not checked:" in out and "cifar10 is not on this machine" in out
    assert "--check-data" in out


def test_schema_only_skips_without_a_note(
        empty_data_places: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--schema-only", str(CIFAR)]) == 0
    assert "not checked" not in capsys.readouterr().out


def test_check_data_offline_is_an_error_naming_the_fix(
        empty_data_places: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--check-data", "--offline", str(CIFAR)]) == 2
    err = capsys.readouterr().err
    assert "not found" in err and "fedsim data fetch cifar10" in err
    assert "Traceback" not in err


def test_check_data_and_schema_only_exclude_each_other(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["validate", "--check-data", "--schema-only", str(CIFAR)])
    assert exit_.value.code == 2


def test_a_bad_file_is_still_refused_offline(
        empty_data_places: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(CIFAR.read_text(encoding="utf-8").replace("batch_size:", "batchsize:", 1),
                   encoding="utf-8")
    assert main(["validate", str(bad)]) == 2
    assert "batchsize" in capsys.readouterr().err


def test_a_misspelt_model_or_option_is_an_error_without_the_data(
        empty_data_places: None, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's review (session 56): with the data nowhere, ``model: {name: resnet}`` and
    ``options: {hiden: [64]}`` were "valid", and ``fedsim run`` then failed on them. The name is
    the schema's now (with its line, beside the file's other errors, also under
    ``--schema-only``); a built-in model's option names need no data."""
    text = CIFAR.read_text()
    assert "name: groupnorm_cnn" in text
    misspelt = Path("resnet.yaml")
    misspelt.write_text(text.replace("name: groupnorm_cnn", "name: resnet", 1))
    for extra in ([], ["--schema-only"]):
        assert main(["validate", *extra, str(misspelt)]) == 2
        err = capsys.readouterr().err
        assert "model.name (line" in err and "unknown model 'resnet'" in err
        assert "groupnorm_cnn" in err  # the names it could be
    option = Path("option.yaml")
    assert "options: {width: 16, groups: 4}" in text
    option.write_text(text.replace("{width: 16, groups: 4}", "{widht: 16, groups: 4}", 1))
    assert main(["validate", str(option)]) == 2
    err = capsys.readouterr().err
    assert "model.options" in err and "'widht'" in err and "width" in err


def test_the_schema_names_every_built_in_model_and_no_other() -> None:
    from fedsim.config.model import BUILTIN_MODELS
    from fedsim.training.models import MODELS

    assert set(BUILTIN_MODELS) == set(MODELS)
