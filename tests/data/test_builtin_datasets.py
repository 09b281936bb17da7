"""The built-in data sets beside MNIST, each on a small fixture made here in its real format
(gzipped IDX for Fashion-MNIST, a python-pickle batch tar.gz for CIFAR-10, a LEAF JSON tree
for FEMNIST), through the registry's resolution, download verification and cache; and the
natural (per-writer) partition."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import os
import pickle
import pickletools
import struct
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedsim.config import LoadedScenario, load_scenario, parse_scenario
from fedsim.data import datasets
from fedsim.data.datasets import content_digest, fetch, resolve
from fedsim.data.formats import read_cifar_tar
from fedsim.data.load import image_tensors
from fedsim.data.partition import group_members, partition
from fedsim.data.sources import IdxMirror, OpenUrl, TarGzSource
from fedsim.errors import ConfigError, DataError

REPO = Path(__file__).resolve().parents[2]
TINY = {"x_train": (8, 28, 28), "y_train": (8,), "x_test": (2, 28, 28), "y_test": (2,)}
TINY_CIFAR = {"x_train": (10, 32, 32, 3), "y_train": (10,), "x_test": (2, 32, 32, 3),
              "y_test": (2,)}


def _served(files: dict[str, bytes]) -> OpenUrl:
    def open_url(url: str) -> Iterator[bytes]:
        if url not in files:
            raise OSError(f"unreachable: {url}")
        yield files[url]

    return open_url


def _arrays(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.integers(0, 10 if n.startswith("y") else 256, s).astype(np.uint8)
            for n, s in shapes.items()}


# ----------------------------------------------------------------------------- Fashion-MNIST
def _idx_gz(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return gzip.compress(header + array.tobytes())


def test_fashion_mnist_downloads_from_md5_pinned_idx_mirrors(_isolated: Path) -> None:
    arrays = _arrays(TINY)
    files = {stem: _idx_gz(arrays[name]) for name, stem in datasets.MNIST_IDX_FILES.items()}
    md5 = {stem: "md5:" + hashlib.md5(body).hexdigest() for stem, body in files.items()}
    bad, good = "https://bad.example/f", "https://good.example/f"
    served = {f"{good}/{s}.gz": b for s, b in files.items()}
    # The first mirror serves other (well-formed) files: refused by their md5 before decoding.
    served |= {f"{bad}/{s}.gz": _idx_gz(np.zeros_like(arrays[n]))
               for n, s in datasets.MNIST_IDX_FILES.items()}
    spec = dataclasses.replace(datasets.FASHION_MNIST, shapes=TINY, sources=tuple(
        IdxMirror(base, datasets.MNIST_IDX_FILES, TINY, digests=md5) for base in (bad, good)))
    target = fetch(spec, open_url=_served(served))
    assert target == _isolated / "fashion_mnist.npz"
    found = resolve(spec, download=False)
    assert found.origin == "cache"
    for name in arrays:
        np.testing.assert_array_equal(found.arrays[name], arrays[name])
    assert image_tensors(found.arrays)[0].shape == (8, 1, 28, 28)
    with pytest.raises(DataError, match="md5 .* does not match"):
        fetch(dataclasses.replace(spec, sources=spec.sources[:1]), _isolated / "other",
              open_url=_served(served))


def test_fashion_mnist_from_a_local_directory_is_checked_by_the_published_md5(
    tmp_path: Path,
) -> None:
    """`fedsim data fetch fashion_mnist --from DIR`: the .gz files as the publisher gives them,
    checked against the pinned md5 (a directory of other files is refused)."""
    arrays = _arrays(TINY)
    local = tmp_path / "fashion"
    local.mkdir()
    for name, stem in datasets.MNIST_IDX_FILES.items():
        (local / f"{stem}.gz").write_bytes(_idx_gz(arrays[name]))
    (source,) = datasets.local_file_sources(datasets.FASHION_MNIST, local)
    assert isinstance(source, IdxMirror) and source.base_url == str(local)
    assert source.digests == datasets.FASHION_MNIST_MD5
    with pytest.raises(DataError, match="md5 .* does not match the pinned 8d4fb7e6"):
        source.fetch(datasets.urllib_open)


def test_the_registered_fashion_mnist_pins_the_published_md5_on_every_mirror() -> None:
    spec = datasets.get("fashion_mnist")
    assert spec.shapes == datasets.MNIST_SHAPES and spec.num_classes == 10
    assert len(spec.sources) == 3
    for source in spec.sources:
        assert isinstance(source, IdxMirror)
        assert set(source.digests) == set(datasets.MNIST_IDX_FILES.values())
        assert source.digests["train-images-idx3-ubyte"] == "md5:8d4fb7e6c68d591d4c3dfef9ec88bf0d"


# ----------------------------------------------------------------------------- CIFAR-10
class _Python2Pickler(pickle._Pickler):  # type: ignore[name-defined]  # the pure-Python one
    """Writes bytes as Python 2 ``str`` (BINSTRING) opcodes, as the published batches (pickled
    by Python 2's cPickle) hold their keys, names and array data."""

    dispatch = dict(pickle._Pickler.dispatch)  # type: ignore[attr-defined]

    def save_str2(self, obj: bytes) -> None:
        size = len(obj)
        self.write(pickle.SHORT_BINSTRING + bytes([size]) + obj if size < 256
                   else pickle.BINSTRING + struct.pack("<i", size) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_str2


def _cifar_batch(images: np.ndarray, labels: np.ndarray, name: str, python2: bool = True
                 ) -> bytes:
    """A batch pickle as the published one holds it (a dict; data as R, G, B planes), with
    Python 2 strings or (``python2=False``) as Python 3 pickles bytes."""
    data = images.transpose(0, 3, 1, 2).reshape(len(images), 3072)
    batch = {b"batch_label": name.encode(), b"labels": [int(y) for y in labels], b"data": data,
             b"filenames": [b"img.png"] * len(images)}
    if not python2:
        return pickle.dumps(batch, protocol=2)
    buffer = io.BytesIO()
    _Python2Pickler(buffer, protocol=2).dump(batch)
    assert "BINSTRING" in {op.name for op, _, _ in pickletools.genops(buffer.getvalue())}
    return buffer.getvalue()


def _cifar_tar(arrays: dict[str, np.ndarray], replace: dict[str, bytes] | None = None) -> bytes:
    members = {}
    for i in range(5):
        sl = slice(2 * i, 2 * i + 2)
        members[f"data_batch_{i + 1}"] = _cifar_batch(
            arrays["x_train"][sl], arrays["y_train"][sl], f"training batch {i + 1} of 5")
    members["test_batch"] = _cifar_batch(arrays["x_test"], arrays["y_test"], "testing batch 1",
                                         python2=False)
    members |= replace or {}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, body in {"batches.meta": b"meta", **members}.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return buffer.getvalue()


def _tiny_cifar_spec(archive: bytes, url: str) -> datasets.DatasetSpec:
    digest = "sha256:" + hashlib.sha256(archive).hexdigest()
    return dataclasses.replace(datasets.CIFAR10, shapes=TINY_CIFAR, sources=(
        TarGzSource(url, digest, max_bytes=len(archive)),))


def test_cifar10_downloads_its_pinned_tar_gz_and_keeps_pixel_order(_isolated: Path) -> None:
    arrays = _arrays(TINY_CIFAR)
    archive = _cifar_tar(arrays)
    url = "https://cifar.example/cifar-10-python.tar.gz"
    spec = _tiny_cifar_spec(archive, url)
    fetch(spec, open_url=_served({url: archive}))
    found = resolve(spec, download=False)
    assert found.origin == "cache" and found.path == _isolated / "cifar10.npz"
    for name in arrays:
        np.testing.assert_array_equal(found.arrays[name], arrays[name])
    train_x = image_tensors(found.arrays)[0]
    assert train_x.shape == (10, 3, 32, 32)  # channels first for the model
    # channel c of pixel (i, j) of image k is plane c of the published row, at 32 i + j
    assert train_x[3, 2, 5, 7] == arrays["x_train"][3, 5, 7, 2] / 255.0


def test_cifar10_refuses_another_archive_and_never_unpickles_objects(tmp_path: Path) -> None:
    arrays = _arrays(TINY_CIFAR)
    url = "https://cifar.example/cifar-10-python.tar.gz"
    spec = _tiny_cifar_spec(_cifar_tar(arrays), url)
    ran = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {ran}",))

    hostile = _cifar_tar(arrays, {"test_batch": pickle.dumps({b"data": Payload()}, protocol=2)})
    with pytest.raises(DataError, match="sha256 .* does not match"):
        fetch(spec, tmp_path / "a", open_url=_served({url: hostile}))
    # Even with its own digest pinned (a compromised pin), the pickle is not run.
    with pytest.raises(DataError, match="refusing to unpickle"):
        fetch(_tiny_cifar_spec(hostile, url), tmp_path / "b", open_url=_served({url: hostile}))
    assert not ran.exists()
    with pytest.raises(DataError, match="more than 100"):
        read_cifar_tar(_cifar_tar(arrays), "x", max_member=100)  # members capped before reading
    with pytest.raises(DataError, match="missing CIFAR-10 batches"):
        read_cifar_tar(_tar_without_test(arrays), "x", 2**20)


def _tar_without_test(arrays: dict[str, np.ndarray]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        body = _cifar_batch(arrays["x_test"], arrays["y_test"], "b")
        info = tarfile.TarInfo("cifar-10-batches-py/data_batch_1")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    return buffer.getvalue()


def test_cifar10_reads_the_archive_or_its_unpacked_batches_at_a_path(tmp_path: Path) -> None:
    arrays = _arrays(TINY_CIFAR)
    archive = _cifar_tar(arrays)
    spec = _tiny_cifar_spec(archive, "unused")
    local = tmp_path / "dl" / "cifar-10-python.tar.gz"
    local.parent.mkdir()
    local.write_bytes(archive)
    with tarfile.open(local) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    for place in (local, local.parent, tmp_path / "unpacked"):
        found = resolve(spec, place, download=False)
        assert found.origin == "dataset.path"
        assert content_digest(found.arrays) == content_digest(arrays)
    # `fedsim data fetch cifar10 --from FILE` verifies a local archive by the pinned sha256
    (source,) = datasets.local_file_sources(datasets.CIFAR10, local)
    assert isinstance(source, TarGzSource) and source.digest.endswith(datasets.CIFAR10_SHA256)
    with pytest.raises(DataError, match="does not match the pinned"):
        source.fetch(datasets.urllib_open)


# ----------------------------------------------------------------------------- FEMNIST
def _leaf_tree(root: Path, writers: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """LEAF's layout: train/ and test/ JSON files of per-writer records (pixels value/255);
    returns, per writer, the uint8 images written (train then test)."""
    rng = np.random.default_rng(seed)
    written = {}
    for split in ("train", "test"):
        (root / split).mkdir(parents=True)
        names = sorted(writers)
        for part, chunk in enumerate((names[: len(names) // 2], names[len(names) // 2:])):
            blob: dict[str, object] = {"users": [], "num_samples": [], "user_data": {}}
            for writer in chunk:
                count = writers[writer] if split == "train" else 1
                images = rng.integers(0, 256, (count, 28, 28)).astype(np.uint8)
                labels = rng.integers(0, 62, count)
                written[f"{split}/{writer}"] = images
                blob["users"].append(writer)  # type: ignore[attr-defined]
                blob["num_samples"].append(count)  # type: ignore[attr-defined]
                blob["user_data"][writer] = {  # type: ignore[index]
                    "x": (images.reshape(count, 784) / 255.0).tolist(), "y": labels.tolist()}
            (root / split / f"all_data_{part}_niid_1_keep_0_{split}_9.json").write_text(
                json.dumps(blob))
    return written


WRITERS = {"f0000_14": 3, "f0001_41": 2, "f0002_03": 4, "f0003_22": 1, "f0004_30": 2}


def test_femnist_reads_leaf_json_with_each_records_writer(tmp_path: Path, _isolated: Path) -> None:
    written = _leaf_tree(tmp_path / "leaf" / "data", WRITERS)
    found = resolve("femnist", tmp_path / "leaf", download=False)
    a = found.arrays
    assert list(a["writers"]) == sorted(WRITERS)
    assert len(a["y_train"]) == sum(WRITERS.values()) and len(a["y_test"]) == len(WRITERS)
    for index, writer in enumerate(a["writers"]):
        np.testing.assert_array_equal(a["x_train"][a["w_train"] == index], written[f"train/{writer}"])
        np.testing.assert_array_equal(a["x_test"][a["w_test"] == index], written[f"test/{writer}"])
    # cached as an .npz (no pickle) by `fedsim data fetch femnist --from DIR`, found there after
    target = fetch("femnist", sources=datasets.local_file_sources(
        datasets.FEMNIST, tmp_path / "leaf" / "data"))
    cached = resolve("femnist", download=False)
    assert cached.origin == "cache" and target == _isolated / "femnist.npz"
    assert content_digest(cached.arrays) == content_digest(a)
    with pytest.raises(DataError, match="no download source.*LEAF"):
        fetch("femnist", tmp_path / "elsewhere")


@pytest.mark.parametrize("corrupt, message", [
    (lambda b: b["user_data"][b["users"][0]]["x"][0].__setitem__(0, 0.5), "value/255"),
    (lambda b: b["num_samples"].__setitem__(0, 99), "num_samples 99"),
    (lambda b: b["user_data"][b["users"][0]]["y"].__setitem__(0, 62), "0..61"),
    (lambda b: b.pop("user_data"), "not a LEAF JSON file"),
])
def test_femnist_refuses_malformed_leaf_files(tmp_path: Path, corrupt: object, message: str
                                              ) -> None:
    _leaf_tree(tmp_path, WRITERS)
    file = sorted((tmp_path / "train").glob("*.json"))[0]
    blob = json.loads(file.read_text())
    corrupt(blob)  # type: ignore[operator]
    file.write_text(json.dumps(blob))
    with pytest.raises(DataError, match=message):
        resolve("femnist", tmp_path, download=False)


def test_natural_partition_gives_each_client_whole_writers() -> None:
    rng = np.random.default_rng(0)
    writers = rng.integers(0, 40, 1000)
    parts = partition(np.zeros(1000), 7, "natural", rng=np.random.default_rng(1), writers=writers)
    assert sorted(np.concatenate(parts).tolist()) == list(range(1000))  # disjoint, covering
    owners = [set(writers[p].tolist()) for p in parts]
    assert all(owners) and sum(len(o) for o in owners) == len(set(writers.tolist()))
    assert {len(o) for o in owners} <= {5, 6}  # 40 writers into 7 near-equal runs
    for p, o in zip(parts, owners, strict=True):  # every record of each owned writer
        assert set(np.flatnonzero(np.isin(writers, list(o))).tolist()) == set(p.tolist())
    with pytest.raises(ConfigError, match="a writer per client: 40 writers for 41"):
        partition(np.zeros(1000), 41, "natural", rng=rng, writers=writers)
    with pytest.raises(ConfigError, match="needs a data set with writers"):
        partition(np.zeros(1000), 7, "natural", rng=rng)


def test_group_shares_keep_writers_whole_and_are_unchanged_without_writers() -> None:
    labels_n, shares = 500, [0.3, 0.5]
    plain = group_members(labels_n, shares, np.random.default_rng(3))
    order = np.random.default_rng(3).permutation(labels_n)  # the former cut, by hand
    np.testing.assert_array_equal(plain[0], np.sort(order[:150]))
    np.testing.assert_array_equal(plain[1], np.sort(order[150:400]))
    writers = np.random.default_rng(4).integers(0, 30, labels_n)
    groups = group_members(labels_n, shares, np.random.default_rng(3), writers)
    seen = [set(writers[g].tolist()) for g in groups]
    assert not seen[0] & seen[1]
    for g, s in zip(groups, seen, strict=True):  # whole writers, at least the share
        assert len(g) == np.isin(writers, list(s)).sum()
    assert len(groups[0]) >= 150 and len(groups[0]) + len(groups[1]) >= 400


def test_a_femnist_scenario_with_natural_partition_builds_writer_clients(tmp_path: Path) -> None:
    _leaf_tree(tmp_path / "leaf", WRITERS)
    scenario = {
        "seed": 0, "stop": {"windows": 2}, "dataset": {"name": "femnist", "path": "leaf"},
        "model": {"name": "logreg"}, "server": {"window": 1.0},
        "clients": {"groups": [{"name": "w", "count": 3, "data_share": 1.0, "batch_size": 1,
                                "clip": 1.0, "noise": 1.0, "partition": {"scheme": "natural"},
                                "speed": 0.01}]},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario), encoding="utf-8")
    from fedsim.runtime.population import build_population

    population = build_population(load_scenario(tmp_path / "s.yaml"))
    found = resolve("femnist", tmp_path / "leaf", download=False)
    w = found.arrays["w_train"]
    owners = [set(w[plan.indices].tolist()) for plan in population.plans]
    assert len(owners) == 3 and all(owners)
    assert sum(len(o) for o in owners) == len(WRITERS)  # each writer with exactly one client
    for plan, o in zip(population.plans, owners, strict=True):
        assert sorted(plan.indices.tolist()) == np.flatnonzero(np.isin(w, list(o))).tolist()


# ----------------------------------------------------------------------------- scenario
def test_the_cifar10_groupnorm_scenario_runs_on_a_fixture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedsim.runtime.simulated.simulation import run_scenario

    raw = yaml.safe_load((REPO / "scenarios" / "cifar10-groupnorm.yaml").read_text())
    parse_scenario(raw)  # the shipped file validates as it is
    shapes = {"x_train": (160, 32, 32, 3), "y_train": (160,), "x_test": (20, 32, 32, 3),
              "y_test": (20,)}
    arrays = _arrays(shapes)
    np.savez(tmp_path / "cifar10.npz", **arrays)
    monkeypatch.setitem(datasets._REGISTRY, "cifar10",
                        dataclasses.replace(datasets.CIFAR10, shapes=shapes))
    monkeypatch.setenv("FEDSIM_DATA_DIR", str(tmp_path))
    raw["stop"] = {"virtual_seconds": 3}
    raw["dataset"]["test_subset"] = 20
    for group in raw["clients"]["groups"]:
        group["batch_size"] = 8
    result = run_scenario(LoadedScenario(parse_scenario(raw), None), tmp_path / "run")
    assert result.summary["updates"]["applied"] > 0
    assert result.final_params.shape == (sum(p.numel() for p in _groupnorm(raw).parameters()),)


def _groupnorm(raw: dict[str, object]) -> object:
    from fedsim.training.models import GroupNormCNN

    return GroupNormCNN(**raw["model"]["options"])  # type: ignore[index]


def test_a_missing_femnist_is_not_told_to_download(tmp_path: Path, _isolated: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's femnist scenario without its LEAF files said "download: femnist has no
    download source; build it with LEAF ..." and then "Fix: run `fedsim data fetch femnist`
    (downloads and verifies it ...)", a command that refuses at once. The fix it gives now
    is the one that works; a data set with sources still names its download."""
    from fedsim.cli import main

    scenario = tmp_path / "femnist.yaml"
    scenario.write_text(
        "name: f\nstop: {windows: 2}\ndataset: {name: femnist}\nmodel: {name: logreg}\n"
        "clients: {groups: [{name: g, count: 2, batch_size: 2, noise: 1.0, clip: 1.0,\n"
        "  speed: 0.01}]}\nserver: {window: 1.0}\n", encoding="utf-8")
    assert main(["run", str(scenario), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    said = capsys.readouterr().err
    assert "femnist has no download source" in said and "Traceback" not in said
    assert "fedsim data fetch femnist`" not in said and "downloads and verifies" not in said
    assert said.splitlines()[-1].startswith("Fix: build it with LEAF")
    assert "fedsim data fetch femnist --from data/femnist/data" in said
    with pytest.raises(DataError, match=r"(?s)Fix: run `fedsim data fetch mnist` \(downloads"):
        resolve("mnist", download=False)
