"""``dataset: {name: arrays, path: file.npz}``: a scenario file trains on the user's arrays, and
arrays that do not fit are refused with the array and the problem named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from fedsim.cli import main
from fedsim.data.arrays import check_arrays, load_arrays_file
from fedsim.errors import DataError


def good() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    y_train, y_test = rng.integers(0, 4, 400), rng.integers(0, 4, 100)
    x_train = rng.integers(0, 256, (400, 6, 6), dtype=np.uint8)
    x_test = rng.integers(0, 256, (100, 6, 6), dtype=np.uint8)
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}


def test_a_scenario_file_runs_on_arrays_beside_it(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    np.savez(tmp_path / "mine.npz", **good())
    scenario = {
        "name": "arrays-file", "stop": {"windows": 4},
        "dataset": {"name": "arrays", "path": "mine.npz"},
        "model": {"name": "mlp", "options": {"hidden": [8]}},
        "clients": {"groups": [{"name": "a", "count": 2, "data_share": 1.0, "batch_size": 20,
                                "clip": 1.0, "noise": 1.0, "speed": 0.01, "rounds": 3,
                                "partition": {"scheme": "shards", "shards_per_client": 2}}]},
        "server": {"window": 1.0},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario))
    out = tmp_path / "run"
    assert main(["run", str(tmp_path / "s.yaml"), "--out", str(out), "--no-plots"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_accuracy"] is not None
    assert summary["client_states"] == {"done": 2}  # 3 rounds each, on the arrays
    resolved = yaml.safe_load((out / "scenario.resolved.yaml").read_text())
    assert resolved["dataset"]["name"] == "arrays"
    # the synthetic problem's sizes are not written for another data set (a stranger's)
    assert not set(resolved["dataset"]) & {"num_samples", "num_features", "num_classes"}


def test_uint8_is_scaled_and_other_dtypes_kept() -> None:
    data = good()
    x_train, y_train, _, _ = check_arrays(data)
    assert x_train.dtype == torch.float32 and y_train.dtype == torch.int64
    assert torch.equal(x_train, torch.from_numpy(data["x_train"].astype(np.float32) / 255.0))
    data["x_train"] = data["x_train"].astype(np.int16)
    data["x_test"] = data["x_test"].astype(np.float64)
    x_train, _, x_test, _ = check_arrays(data)
    assert float(x_train.max()) == float(data["x_train"].max())  # not scaled
    assert torch.equal(x_test, torch.from_numpy(data["x_test"].astype(np.float32)))
    # a 4-tuple in the documented order is the same data set
    as_tuple = check_arrays(tuple(data[k] for k in ("x_train", "y_train", "x_test", "y_test")))
    assert all(torch.equal(a, b) for a, b in zip(as_tuple, check_arrays(data), strict=True))


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.pop("y_test"), r"missing \['y_test'\]"),
    (lambda d: d.update(X_train=d["x_train"]), r"unexpected \['X_train'\]"),
    (lambda d: d.update(y_train=d["y_train"].astype(np.float32)), "y_train has dtype float32"),
    (lambda d: d.update(y_train=d["y_train"].astype(str)), "y_train has dtype <U"),
    (lambda d: d.update(x_test=d["x_test"][:, :5]), r"x_train examples have shape \(6, 6\) but "
                                                    r"x_test examples \(5, 6\)"),
    (lambda d: d.update(x_train=np.full((400, 3), np.nan)), "x_train holds 1200 NaN"),
    (lambda d: d.update(y_test=-d["y_test"] - 1), "y_test has negative label"),
    (lambda d: d.update(y_train=np.zeros(400, dtype=int)), "single class"),
    (lambda d: d.update(y_train=d["y_train"].reshape(200, 2)), r"shape \(200, 2\)"),
    (lambda d: d.update(x_train=d["x_train"][:, 0, 0]), r"x_train has shape \(400,\)"),
    (lambda d: d.update(y_train=d["y_train"] * 10**6), "below 100000"),
])
def test_bad_arrays_are_named(tmp_path: Path, change, message: str) -> None:
    data = good()
    change(data)
    np.savez(tmp_path / "bad.npz", **data)
    with pytest.raises(DataError, match=message):
        load_arrays_file(tmp_path / "bad.npz")


def test_a_file_that_is_not_an_npz(tmp_path: Path) -> None:
    np.save(tmp_path / "one.npy", np.zeros(3))
    with pytest.raises(DataError, match="not a readable .npz"):
        load_arrays_file(tmp_path / "one.npy")
    (tmp_path / "text.npz").write_text("hello")
    with pytest.raises(DataError, match="not a readable .npz"):
        load_arrays_file(tmp_path / "text.npz")


def test_a_missing_arrays_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = {"stop": {"windows": 2}, "dataset": {"name": "arrays", "path": "absent.npz"},
                "model": {"name": "logreg"},
                "clients": {"groups": [{"name": "a", "count": 2, "data_share": 1.0,
                                        "batch_size": 4, "clip": 1.0, "noise": 1.0,
                                        "speed": 0.01}]},
                "server": {"window": 1.0}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario))
    assert main(["run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "run")]) == 2
    assert f"no such file: {tmp_path / 'absent.npz'}" in capsys.readouterr().err
