"""Hostile and mistaken scenario input: a clear error naming the place, exit 2, no traceback,
bounded time and memory; through ``fedsim validate`` and ``fedsim run`` alike."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedsim.cli import main
from fedsim.config import limits, load_scenario, parse_scenario, scenario_json_schema
from fedsim.config import loading as loading_module
from fedsim.errors import ModelError

MINIMAL: dict[str, Any] = {
    "stop": {"windows": 2},
    "dataset": {"name": "synthetic", "num_samples": 400, "num_test_samples": 100},
    "model": {"name": "mlp", "options": {"hidden": [8]}},
    "clients": {"groups": [{"name": "a", "count": 2, "data_share": 0.5, "batch_size": 8,
                            "clip": 1.0, "noise": 1.0, "speed": 0.01}]},
    "server": {"window": 1.0},
}


@pytest.fixture(autouse=True)
def _only_scenario_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fedsim.cli.COMMANDS", ("run", "validate", "schema"))


def _scenario(**changes: Any) -> dict[str, Any]:
    data = json.loads(json.dumps(MINIMAL))
    for path, value in changes.items():
        node = data
        *parents, last = path.split("__")
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        node[last] = value
    return data


def _write(tmp_path: Path, content: str | bytes | dict[str, Any], name: str = "s.yaml") -> Path:
    file = tmp_path / name
    if isinstance(content, dict):
        content = yaml.safe_dump(content, sort_keys=False)
    if isinstance(content, bytes):
        file.write_bytes(content)
    else:
        file.write_text(content, encoding="utf-8")
    return file


def _both_commands(file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                   *extra: str) -> list[str]:
    """stderr of ``validate`` and of ``run``, each asserted to exit 2 without a traceback."""
    errors = []
    for argv in (["validate", str(file), *extra],
                 ["run", str(file), "--out", str(tmp_path / "run"), "--no-plots", *extra]):
        status = main(argv)
        captured = capsys.readouterr()
        assert status == 2, (argv, captured)
        assert "Traceback" not in captured.err + captured.out
        errors.append(captured.err)
    return errors


# ---------------------------------------------------------------------------------------------
# the file itself


def test_deep_nesting_is_refused_with_its_line(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    deep = "model:\n  options:\n    hidden: " + "[" * 650 + "]" * 650 + "\n"
    file = _write(tmp_path, deep)
    for err in _both_commands(file, tmp_path, capsys):
        assert f"nested deeper than {limits.MAX_YAML_DEPTH} levels" in err
        assert "(line 3, column" in err
    block = "".join("  " * i + f"k{i}:\n" for i in range(700))  # block mappings, too
    for err in _both_commands(_write(tmp_path, block), tmp_path, capsys):
        assert "nested deeper than" in err


def test_a_deep_override_value_is_refused(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    file = _write(tmp_path, MINIMAL)
    for err in _both_commands(file, tmp_path, capsys, "--set", "name=" + "[" * 700 + "]" * 700):
        assert "--set name: not valid YAML" in err and "nested deeper than" in err


def test_alias_expansion_is_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # "Billion laughs": 10^9 values from 10 lines; each line repeats the previous one 10 times.
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    file = _write(tmp_path, "\n".join(lines) + "\n")
    size, line = 11, 1  # a list of n items is n + 1 values
    while size <= limits.MAX_YAML_VALUES:
        size, line = 1 + 10 * size, line + 1
    for err in _both_commands(file, tmp_path, capsys):
        assert f"more than {limits.MAX_YAML_VALUES} values" in err and f"(line {line}," in err
    for err in _both_commands(_write(tmp_path, "a: &a [1, *a]\n"), tmp_path, capsys):
        assert "recursive" in err and "(line 1" in err


def test_files_over_the_size_limit_are_refused_before_parsing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    text = yaml.safe_dump(MINIMAL)
    small = _write(tmp_path, text, "small.yaml")
    monkeypatch.setattr(limits, "MAX_SCENARIO_BYTES", len(text.encode()))
    assert load_scenario(small).scenario.name == "scenario"  # exactly at the limit: read
    big = _write(tmp_path, text + "#", "big.yaml")

    def no_parsing(text: str) -> Any:
        raise AssertionError("a file over the limit must not be parsed")

    monkeypatch.setattr(loading_module, "_load_yaml", no_parsing)
    for err in _both_commands(big, tmp_path, capsys):
        assert "larger than" in err and "the limit for scenario files" in err


def test_the_documented_limit_is_one_mebibyte(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert limits.MAX_SCENARIO_BYTES == 2**20
    file = tmp_path / "huge.yaml"
    with open(file, "w", encoding="utf-8") as handle:  # 3 MiB of comments after a scenario
        handle.write(yaml.safe_dump(MINIMAL))
        handle.write(("#" + "x" * 1023 + "\n") * 3 * 1024)
    err = _both_commands(file, tmp_path, capsys)[0]
    assert "larger than 1 MiB" in err


@pytest.mark.slow
def test_composition_stops_at_the_value_limit(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    file = _write(tmp_path, "a: [" + ", ".join(["1"] * (limits.MAX_YAML_VALUES + 10)) + "]\n")
    for err in _both_commands(file, tmp_path, capsys):
        assert f"holds more than {limits.MAX_YAML_VALUES} values" in err


def test_non_utf8_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = yaml.safe_dump(MINIMAL).encode().replace(b"name: a", b"name: caf\xe9")
    line = raw[: raw.index(b"\xe9")].count(b"\n") + 1
    file = _write(tmp_path, raw)
    for err in _both_commands(file, tmp_path, capsys):
        assert f"not UTF-8 text (line {line}, column" in err and "0xe9" in err


def test_control_characters_name_the_line(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    file = _write(tmp_path, "seed: 1\nname: a\x07b\n")
    for err in _both_commands(file, tmp_path, capsys):
        assert "(line 2, column 8)" in err and "U+0007" in err


def test_merge_keys_may_be_overridden_but_written_duplicates_are_refused(tmp_path: Path) -> None:
    text = """
stop: {windows: 2}
dataset: {name: synthetic}
model: {name: logreg}
clients:
  groups:
    - &base {name: a, count: 2, data_share: 0.4, batch_size: 8, clip: 1.0, noise: 1.0, speed: 0.01}
    - <<: *base
      name: b
      batch_size: 4
server: {window: 1.0}
"""
    groups = load_scenario(_write(tmp_path, text)).scenario.clients.groups
    assert [(g.name, g.batch_size, g.count) for g in groups] == [("a", 8, 2), ("b", 4, 2)]
    duplicated = text.replace("      batch_size: 4\n", "      batch_size: 4\n      name: c\n")
    with pytest.raises(loading_module.ScenarioError, match=r"line 11, column 7\): duplicate key 'name'"):
        load_scenario(_write(tmp_path, duplicated))


# ---------------------------------------------------------------------------------------------
# what needs the data set: each bad group listed, at its line, as the schema's problems are

_TWO_GROUPS = """stop: {windows: 2}
dataset: {name: synthetic, num_samples: 400, num_test_samples: 100}
model: {name: mlp, options: {hidden: [8]}}
clients:
  groups:
    - name: a
      count: 2
      data_share: 0.5
      batch_size: 8
      clip: 1.0
      noise: 1.0
      speed: 0.01
    - &b {name: b, count: 2, data_share: 0.25, batch_size: 8, clip: 1.0, noise: 1.0, speed: 0.01}
    - <<: *b
      name: c

      batch_size: 8
server: {window: 1.0}
"""
_TOO_LARGE = ("exceeds the records of 2 of the group's 2 clients (the smallest holds 50; "
              "q = m/N would be > 1, so they could never train); use batch_size <= 50, raise "
              "data_share or lower count")


def test_every_group_whose_batch_exceeds_its_records_is_listed_at_its_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Found with the data set, and once reported without the file, its line, or any group but
    the first (a stranger)."""
    text = _TWO_GROUPS.replace("data_share: 0.25, batch_size: 8", "data_share: 0.25, "
                               "batch_size: 5000").replace("      batch_size: 8\nserver",
                                                           "      batch_size: 6000\nserver")
    file = _write(tmp_path, text)
    for err in _both_commands(file, tmp_path, capsys):
        assert f"{file}: 2 problems\n" in err
        assert f"  clients.groups[1].batch_size (line 13): 5000 {_TOO_LARGE}\n" in err
        # the key written beside a merge, on its own line (after a blank one)
        assert f"  clients.groups[2].batch_size (line 17): 6000 {_TOO_LARGE}\n" in err
        assert "groups[0]" not in err


def test_a_batch_too_large_by_an_override_is_shown_as_an_override_s_problem(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = _write(tmp_path, _TWO_GROUPS)
    override = "clients.groups[c].batch_size=5000"
    for err in _both_commands(file, tmp_path, capsys, "--set", override):
        assert err.endswith(f"{file} with --set {override}: 1 problem\n"
                            f"  clients.groups[2].batch_size: 5000 {_TOO_LARGE}\n")


def test_a_scenario_from_python_lists_its_groups_problems_without_lines() -> None:
    from fedsim.runtime.population import build_population

    data = yaml.safe_load(_TWO_GROUPS.replace("batch_size: 8\n      clip", "batch_size: 150\n"
                                              "      clip"))
    loaded = loading_module.LoadedScenario(parse_scenario(data), None)
    with pytest.raises(loading_module.ScenarioError) as error:
        build_population(loaded)
    assert error.value.errors == [
        "clients.groups[0].batch_size: 150 exceeds the records of 2 of the group's 2 clients "
        "(the smallest holds 100; q = m/N would be > 1, so they could never train); use "
        "batch_size <= 100, raise data_share or lower count"]
    assert str(error.value).startswith("<scenario>: 1 problem\n")


# ---------------------------------------------------------------------------------------------
# the model


@pytest.mark.parametrize(("hidden", "expected"), [
    ([-5], "negative dimension -5"),
    ([0], "empty parameter net.0.weight of shape (0, 8)"),
    ([2_000_000_000], f"more than the {limits.MAX_MODEL_PARAMETERS:,} fedsim trains"),
])
def test_model_widths_are_bounded(hidden: list[int], expected: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    # [2e9] would allocate 2e9 x 8 + 2e9 x 4 floats (~96 GB) if it were built for real.
    file = _write(tmp_path, _scenario(model__options__hidden=hidden, dataset__num_features=8,
                                      dataset__name="synthetic"))
    for err in _both_commands(file, tmp_path, capsys):
        assert "model.options: mlp" in err and expected in err
    assert not (tmp_path / "run" / "ledgers").exists()


@pytest.mark.parametrize(("options", "expected"), [
    ({"groups": 0}, "ZeroDivisionError"),
    ({"width": 10**5}, "parameters, more than"),
    ({"width": 10**12}, "overflow"),
    ({"in_channels": -1}, "negative dimension"),
])
def test_cnn_options_are_checked_too(options: dict[str, int], expected: str) -> None:
    from fedsim.training.preflight import check_model_size

    with pytest.raises(ModelError, match=expected):
        check_model_size("groupnorm_cnn", options, max_message_bytes=2**30)


def test_the_number_of_layers_is_bounded(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    data = _scenario(model__options__hidden=[1] * (limits.MAX_MODEL_LAYERS + 1))
    for err in _both_commands(_write(tmp_path, data), tmp_path, capsys):
        assert f"model.options.hidden: {limits.MAX_MODEL_LAYERS + 1} items" in err


def test_a_model_must_fit_in_one_message(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    # 20 features -> 50,000 hidden -> 4 classes: 1,250,004 parameters, 5 MB as float32.
    data = _scenario(model__options__hidden=[50_000], network__max_message_bytes=4_000_000)
    parameters = 20 * 50_000 + 50_000 + 50_000 * 4 + 4
    for err in _both_commands(_write(tmp_path, data), tmp_path, capsys):
        assert f"{parameters:,} parameters" in err and "network.max_message_bytes" in err


def test_aggregators_need_room_for_one_partial(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A model fits a message but an aggregation node's partial (one sum and a manifest of up
    to 4 MiB) does not: refused before anything runs, not every partial refused at the server."""
    from fedsim.protocol import codec

    data = _scenario(aggregators={"count": 2}, network__max_message_bytes=2_000_000)
    for err in _both_commands(_write(tmp_path, data), tmp_path, capsys):
        assert "aggregators.count = 2" in err and "network.max_message_bytes = 2,000,000" in err
        assert f"{codec.MAX_PARTIAL_HEADER_BYTES:,}" in err
    data["network"]["max_message_bytes"] = 5_000_000  # one sum fits: the run is valid
    assert main(["validate", str(_write(tmp_path, data))]) == 0


# ---------------------------------------------------------------------------------------------
# numbers


@pytest.mark.parametrize(("path", "value", "where"), [
    ("server__window", math.nan, "server.window"),
    ("server__window", math.inf, "server.window"),
    ("clients__groups__0__clip", math.inf, "clients.groups[0].clip"),
    ("network__uplink__drop", math.nan, "network.uplink.drop"),
    ("network__uplink__drop", True, "network.uplink.drop"),
    ("clients__groups__0__local_lr", True, "clients.groups[0].local_lr"),
    ("clients__groups__0__noise", {"kind": "growing_mu", "growth": math.inf, "mu_total": 1.0},
     "clients.groups[0].noise.growth"),
    ("clients__groups__0__count", 10**9, "clients.groups[0].count"),
    ("clients__groups__0__count", True, "clients.groups[0].count"),
    ("clients__groups__0__rounds", 10**12, "clients.groups[0].rounds"),
    ("clients__groups__0__local_steps", 10**9, "clients.groups[0].local_steps"),
    ("clients__groups__0__budget", {"epsilon": 1e300, "delta": 1e-5},
     "clients.groups[0].budget.epsilon"),
    ("clients__groups__0__budget", {"epsilon": 1.0, "delta": 1e-300},
     "clients.groups[0].budget.delta"),
    ("clients__groups__0__speed", {"kind": "lognormal", "median": 1.0, "sigma": 1000.0},
     "clients.groups[0].speed.sigma"),
    ("clients__groups__0__speed", 1e300, "clients.groups[0].speed"),
    ("dataset__num_samples", 10**12, "dataset.num_samples"),
    ("dataset__num_features", 10**9, "dataset.num_features"),
    ("stop__windows", 10**15, "stop.windows"),
    ("network__max_message_bytes", 2**40, "network.max_message_bytes"),
    ("seed", 2**70, "seed"),
    ("torch_threads", 10**6, "torch_threads"),
    ("name", "../../elsewhere", "name"),
    ("clients__groups__0__availability", {"crashes": {"every": 0.0, "rejoin_after": 0.0}},
     "clients.groups[0].availability.crashes"),
    ("clients__groups__0__availability", {"online": {"kind": "uniform", "low": 0, "high": 0},
                                          "offline": 1.0}, "clients.groups[0].availability"),
])
def test_numbers_without_sense_are_refused(path: str, value: Any, where: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    file = _write(tmp_path, _scenario(**{path: value}))
    for err in _both_commands(file, tmp_path, capsys):
        assert f"  {where} (line " in err, err


def test_the_product_of_synthetic_sizes_is_bounded() -> None:
    data = _scenario(dataset__num_samples=10**6, dataset__num_features=10**4)
    with pytest.raises(loading_module.ScenarioError, match="num_samples x num_features"):
        parse_scenario(data)


def test_too_many_clients_in_all_groups_together() -> None:
    group = MINIMAL["clients"]["groups"][0]
    groups = [dict(group, name=f"g{i}", count=limits.MAX_CLIENTS // 2, data_share=0.3)
              for i in range(3)]
    with pytest.raises(loading_module.ScenarioError, match="clients together"):
        parse_scenario(_scenario(clients__groups=groups))


# ---------------------------------------------------------------------------------------------
# the schema describes every field


def _properties(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = [("Scenario." + k, v) for k, v in schema["properties"].items()]
    for name, definition in schema.get("$defs", {}).items():
        found += [(f"{name}.{k}", v) for k, v in definition.get("properties", {}).items()]
    return found


def test_every_schema_field_has_a_description() -> None:
    schema = scenario_json_schema()
    found = _properties(schema)
    assert len(found) > 90  # every section of the schema was walked
    missing = [name for name, prop in found if not prop.get("description")]
    assert missing == []
    for name, prop in found:
        text = prop["description"]
        assert text.endswith(".") and len(text.split()) >= 3, f"{name}: not a sentence: {text!r}"
        assert "paper 00" not in text, f"{name}: cite papers by authors and title"


def test_windows_too_short_for_the_run_are_refused() -> None:
    with pytest.raises(loading_module.ScenarioError, match="server.window: must be >= 0.001"):
        parse_scenario(_scenario(server__window=1e-300))
    data = _scenario(stop={"virtual_seconds": 1e8}, server__window=1e-3)
    with pytest.raises(loading_module.ScenarioError, match="1e\\+11 windows, more than 10000000"):
        parse_scenario(data)


@pytest.mark.parametrize("path", ["a" * 5000, "dir/" + "b" * 300 + ".npz", "a\x00b"])
def test_dataset_paths_the_os_refuses_are_no_crash(path: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # The path is refused by the schema (NUL, over 4096 characters) or simply not found, after
    # which the data set is looked for elsewhere: never an OSError from the operating system.
    data = _scenario(dataset={"name": "mnist", "path": path})
    status = main(["validate", str(_write(tmp_path, data)), "--offline"])
    captured = capsys.readouterr()
    assert status in (0, 2) and "Traceback" not in captured.err
    if status == 2:
        assert "dataset" in captured.err


def test_a_repeated_name_among_many_groups_is_found() -> None:
    group = MINIMAL["clients"]["groups"][0]
    groups = [dict(group, name=f"g{i}", count=1, data_share=1e-5) for i in range(20_000)]
    groups.append(dict(group, name="g7", count=1, data_share=1e-5))
    with pytest.raises(loading_module.ScenarioError, match=r"repeated: \['g7'\]"):
        parse_scenario(_scenario(clients__groups=groups))


def test_every_limit_is_documented_with_its_value() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "LIMITS.md").read_text("utf-8")
    names = [n for n in dir(limits) if n.isupper()]
    assert len(names) >= 20
    for name in names:
        value = getattr(limits, name)
        shown = (f"{value:,}" if isinstance(value, int) and value >= 10000
                 else f"{value:.0e}".replace("e+0", "e").replace("e+", "e")
                 if isinstance(value, float) and value >= 1e3 else repr(value))
        assert f"| `{name}` | {shown} |" in text, name


def test_the_smallest_delta_still_gives_a_finite_epsilon() -> None:
    from fedsim.privacy.accountant import make_accountant
    from fedsim.privacy.events import GaussianStep

    for accountant in ("pld", "rdp"):
        long_run = make_accountant(accountant, [GaussianStep("poisson", 0.01, 1.0, 10_000)])
        assert math.isfinite(long_run.epsilon(limits.MIN_DELTA)), accountant


def test_thousands_of_problems_are_listed_briefly() -> None:
    group = MINIMAL["clients"]["groups"][0]
    groups = [dict(group, name=f"g{i}", count=-1, data_share=1e-4) for i in range(2000)]
    with pytest.raises(loading_module.ScenarioError) as caught:
        parse_scenario(_scenario(clients__groups=groups))
    assert len(caught.value.errors) == 2000
    text = str(caught.value)
    assert "2000 problems" in text and "... and 1950 more" in text
    assert len(text.splitlines()) == 52


def test_invitations_beyond_the_bitmap_are_refused_up_front() -> None:
    """With participation < 1 each window's invitation travels as a bitmap of one bit a client
    (at most limits.MAX_INVITED_CLIENTS): a larger population is refused when the scenario is
    read, not at the first broadcast; with everyone invited the bitmap is not sent."""
    from fedsim.protocol import headers

    assert headers.MAX_INVITED_HEX * 4 == limits.MAX_INVITED_CLIENTS
    group = MINIMAL["clients"]["groups"][0]
    groups = [dict(group, name=f"g{i}", count=limits.MAX_INVITED_CLIENTS // 2 + 1, data_share=0.3)
              for i in range(2)]
    with pytest.raises(loading_module.ScenarioError, match="bitmap"):
        parse_scenario(_scenario(clients__groups=groups, server__participation=0.5))
    assert parse_scenario(_scenario(clients__groups=groups)).clients.total == \
        limits.MAX_INVITED_CLIENTS + 2


@pytest.mark.parametrize(("extra", "refused"), [
    ({}, True),  # a stranger's: no speed, nothing to bound or pace the rounds
    ({"speed": {"kind": "uniform", "low": 0.0, "high": 0.0}}, True),
    # a review's: rounds of next to no time; a budget that affords millions of rounds; a
    # distance rule that may never fire
    ({"speed": {"kind": "uniform", "low": 0.0, "high": 1e-300}}, True),
    ({"budget": {"epsilon": 100.0, "delta": 1e-5}, "noise": 50.0}, True),
    ({"staleness": {"max_distance": 1e6}}, True),
    ({"speed": 1e-8}, True),  # 1.25e-7 s a round of 8: 8 million rounds a 1 s window
    ({"rounds": 5}, False),
    ({"staleness": {"max_versions_behind": 1}}, False),  # synchronous: waits for each model
    ({"speed": 0.001}, False),
    ({"speed": {"kind": "exponential", "mean": 0.001}}, False),
])
def test_rounds_of_no_virtual_time_that_nothing_paces_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: dict[str, Any],
        refused: bool) -> None:
    """A stranger left out ``speed`` (default 0): `validate` accepted the file and the run
    never ended (168,393 rounds a client at virtual time 0 after ten minutes, no window
    closed). Rounds of no time are refused unless rounds, a budget or a staleness rule bound
    or pace them."""
    group = {k: v for k, v in MINIMAL["clients"]["groups"][0].items() if k != "speed"}
    data = _scenario(clients__groups=[{**group, **extra}])
    status = main(["validate", str(_write(tmp_path, data))])
    err = capsys.readouterr().err
    assert status == (2 if refused else 0), err
    assert ("virtual time would stand still and the run would never end" in err) == refused


@pytest.mark.parametrize(("text", "expected"), [
    # a key whose value is a block mapping: its value starts a line below it
    ("name: x\nstop:\n  windows: 3\nnetwrok:\n  uplink: {}\n", "netwrok (line 4)"),
    # blank lines between a key and its block value
    ("name: x\nstop:\n  windows: 3\nfoo:\n\n\n  bar: 1\n", "foo (line 4)"),
    ("name: x\nstop:\n  windows: 3\n  windowz: 4\n", "stop.windowz (line 4)"),
])
def test_an_unknown_key_is_reported_at_its_own_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str) -> None:
    """A stranger's mistyped ``netwrok:`` (its value a block mapping) was reported at its
    value's line, one below, and further with blank lines between."""
    assert main(["validate", str(_write(tmp_path, text))]) == 2
    assert expected in capsys.readouterr().err


def test_a_bare_number_for_a_budget_says_how_to_write_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's `budget: 2.5` read pydantic's "Input should be a valid dictionary or
    instance of Budget"."""
    group = {**MINIMAL["clients"]["groups"][0], "budget": 2.5}
    assert main(["validate", str(_write(tmp_path, _scenario(clients__groups=[group])))]) == 2
    assert "a budget is a pair: write {epsilon: 2.5, delta: 1e-5} (got 2.5)" in \
        capsys.readouterr().err


@pytest.mark.parametrize(("text", "expected"), [
    # `stop:` left with nothing under it (its one key deleted)
    ("name: x\nstop:\ndataset: {name: synthetic}\n",
     "stop (line 2): is empty: write its keys indented under it, or {key: value} (got null)"),
    ("name: x\nstop: 5\n", "stop (line 2): must be a mapping: its keys indented under it, or "
                            "{key: value} (got 5)"),
    ("name: x\nstop: {windows: 2}\nserver:\n  step_size:\n",
     "server.step_size (line 4): is empty: write its keys indented under it"),
])
def test_a_section_that_is_not_a_mapping_says_so_without_class_names(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str) -> None:
    """A stranger who deleted the one key under `stop:` read pydantic's "Input should be a
    valid dictionary or instance of Stop (got null)" (and "object to extract fields from" for
    `server.step_size:`): the names of fedsim's classes, not what to write."""
    assert main(["validate", str(_write(tmp_path, text))]) == 2
    err = capsys.readouterr().err
    assert expected in err
    assert "instance of" not in err and "extract fields" not in err


def test_validate_counts_one_client_in_one_group(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    group = {**MINIMAL["clients"]["groups"][0], "count": 1, "data_share": 1.0}
    path = _write(tmp_path, _scenario(clients__groups=[group]))
    assert main(["validate", str(path), "--schema-only"]) == 0
    assert "valid (1 client in 1 group, seed" in capsys.readouterr().out


def test_a_scenario_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A run directory handed over may hold a FIFO as scenario.resolved.yaml (fedsim report
    reads it): opening it for reading blocked until a writer came."""
    import os

    from fedsim.config import load_scenario
    from fedsim.errors import ConfigError

    fifo = tmp_path / "scenario.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_scenario(fifo)
