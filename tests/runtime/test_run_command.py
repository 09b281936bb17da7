"""`fedsim run` end to end on a tiny scenario file: outputs, --seed/--set, plots, reruns."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from fedsim.cli import main

TINY = {
    "name": "tiny-cli",
    "seed": 1,
    "stop": {"windows": 8},
    "dataset": {"name": "synthetic", "num_samples": 400, "num_test_samples": 100,
                "num_features": 6, "num_classes": 3},
    "model": {"name": "logreg"},
    "clients": {"groups": [{"name": "a", "count": 3, "data_share": 1.0, "batch_size": 16,
                            "clip": 1.0, "noise": 1.0, "speed": 0.01,
                            "budget": {"epsilon": 5.0, "delta": 1e-5}}]},
    "server": {"window": 1.0},
    "network": {"uplink": {"latency": 0.2, "drop": 0.1}},
}


def test_run_writes_the_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(yaml.safe_dump(TINY), encoding="utf-8")
    out = tmp_path / "run"
    assert main(["run", str(scenario), "--out", str(out), "--seed", "9",
                 "--set", "clients.groups[0].count=2", "--json-logs"]) == 0
    for name in ("metrics.jsonl", "clients.csv", "summary.json", "scenario.resolved.yaml",
                 "timing.json", "ledgers/a-000.jsonl", "ledgers/a-001.jsonl"):
        assert (out / name).is_file(), name
    resolved = yaml.safe_load((out / "scenario.resolved.yaml").read_text(encoding="utf-8"))
    assert resolved["seed"] == 9 and resolved["clients"]["groups"][0]["count"] == 2
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["seed"] == 9 and summary["windows"] == 8
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["window"] for m in metrics] == list(range(1, 9))
    assert set(metrics[0]) == {"window", "time", "version", "accuracy", "loss", "received",
                               "applied", "stale", "duplicate", "rejected", "dropped_in_flight",
                               "step_size", "active_clients", "min_remaining_epsilon",
                               "rejections"}
    assert sorted(p.name for p in (out / "plots").glob("*.png")) == [
        "accuracy.png", "epsilon.png", "tradeoff.png"]
    captured = capsys.readouterr()
    assert "final accuracy" in captured.out
    # eps with four significant digits, trailing zeros kept ("2.5..3" beside a budget of 3
    # read as spent to the budget), its range written as the explanation writes it (the
    # headline's "0.4790..1.997" beside its "0.479 to 1.997": a new user)
    low, high = summary["privacy"]["epsilon_min"], summary["privacy"]["epsilon_max"]
    # (one value where both ends read alike: "4.160", not "4.160 to 4.160")
    written = (f"{low:#.4g}" if f"{low:#.4g}" == f"{high:#.4g}"
               else f"{low:#.4g} to {high:#.4g}")
    assert f"eps (delta=1e-05) {written}, " in captured.out
    assert f"{written}." in summary["explanation"]
    # seconds to two decimals wherever they are written (the headline's and the explanation's)
    assert f"{summary['virtual_time']:.2f} virtual s, " in captured.out
    assert f"virtual time {summary['virtual_time']:.2f} s after" in summary["explanation"]
    # The set-up is said, not hidden behind the run's wall seconds (a stranger waited 31 s
    # for a run that said 3.5): printed and logged with its seconds.
    built = re.search(r"wall s \(after (\d+\.\d\d) s to build the population", captured.out)
    assert built is not None, captured.out
    logged = [json.loads(line) for line in captured.err.splitlines() if line.startswith("{")]
    [event] = [e for e in logged if e["event"] == "population built"]
    assert event["clients"] == 2 and float(built.group(1)) == pytest.approx(event["seconds"],
                                                                            abs=0.0051)
    # A run directory is never reused: its ledgers would keep spending.
    assert main(["run", str(scenario), "--out", str(out), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err
    assert "run starting" not in err  # refused before any work (a stranger's run: after it)


def test_report_keeps_the_relations_apart(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Clients of both sampling schemes: one eps spread a neighbouring relation (a stranger
    read one spread over add/remove and replace-one guarantees)."""
    tree = json.loads(json.dumps(TINY))
    group = tree["clients"]["groups"][0]
    group["data_share"] = 0.5
    tree["clients"]["groups"].append({**group, "name": "b", "sampling": "fixed"})
    scenario = tmp_path / "mixed.yaml"
    scenario.write_text(yaml.safe_dump(tree), encoding="utf-8")
    out = tmp_path / "run"
    assert main(["run", str(scenario), "--out", str(out), "--no-plots", "-q"]) == 0
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines()
             if line.startswith("privacy (pld")]
    rows = list(csv.DictReader((out / "clients.csv").open(encoding="utf-8")))
    for line, sampling in zip(lines, ("poisson", "fixed"), strict=True):
        eps = sorted(float(r["epsilon"]) for r in rows if r["sampling"] == sampling)
        relation = "add/remove" if sampling == "poisson" else "replace-one"
        assert line.startswith(f"privacy (pld, delta = 1e-05), {relation} neighbours: eps "
                               f"min {eps[0]:#.4g} / median")
        assert line.endswith(f"/ max {eps[-1]:#.4g} over {len(eps)} clients")
    # compare's table spans both: said under it
    assert main(["compare", str(out), str(out.with_name("other")), "--no-plots"]) == 2
    capsys.readouterr()
    shutil.copytree(out, out.with_name("other"))
    assert main(["compare", str(out), str(out.with_name("other")), "--no-plots"]) == 0
    assert "note: every run's eps columns span add/remove and replace-one clients" in (
        capsys.readouterr().out)
