"""Plots of a run directory and ``fedsim report``: files, determinism, numbers, exit codes."""

from __future__ import annotations

import csv
import glob
import json
import math
import shutil
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedsim.cli import main as cli_main
from fedsim.privacy.accountant import make_accountant
from fedsim.privacy.events import group_steps
from fedsim.privacy.fdp import eps_delta_tradeoff
from fedsim.reporting import figures as figure_files
from fedsim.reporting import plots
from fedsim.reporting.epsilon_history import epsilon_history, representative_clients, time_grid
from fedsim.reporting.ledgers import read_ledgers
from fedsim.reporting.plots import draw_all
from fedsim.reporting.rundir import RunDirectory

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


DELTA = 1e-5  # the synthetic runs' delta (conftest.DELTA; checked where it matters)
# The fixtures return conftest.SyntheticRun (path, histories, duration, delta, final_epsilon());
# conftest is not importable under --import-mode=importlib, hence the alias.
SyntheticRun = Any


def test_draw_all_writes_the_three_plots(small_run: SyntheticRun,
                                         copy_run: Callable[..., SyntheticRun]) -> None:
    run = copy_run(small_run)
    paths = draw_all(run.path)
    assert [p.name for p in paths] == ["accuracy.png", "epsilon.png", "tradeoff.png"]
    for path in paths:
        data = path.read_bytes()
        assert path.parent == run.path / "plots"
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000
        assert b"matplotlib" not in data.lower()  # no software stamp in the metadata


@pytest.mark.slow
def test_same_inputs_give_byte_identical_plots(small_run: SyntheticRun,
                                               copy_run: Callable[..., SyntheticRun]) -> None:
    first, second = copy_run(small_run), copy_run(small_run)
    drawn_first = [p.read_bytes() for p in draw_all(first.path)]
    assert [p.read_bytes() for p in draw_all(second.path)] == drawn_first
    # Different inputs, different pictures: one accuracy changed in the metrics.
    metrics = (second.path / "metrics.jsonl").read_text().splitlines()
    row = json.loads(metrics[1])
    row["accuracy"] = 0.05
    metrics[1] = json.dumps(row)
    (second.path / "metrics.jsonl").write_text("\n".join(metrics) + "\n")
    redrawn = [p.read_bytes() for p in draw_all(second.path)]
    assert redrawn[0] != drawn_first[0] and redrawn[1:] == drawn_first[1:]


def test_epsilon_history_is_the_accountant_on_each_prefix(many_clients_run: SyntheticRun) -> None:
    many = many_clients_run
    assert many.delta == DELTA
    ledgers = read_ledgers(RunDirectory.load(many.path))
    times = time_grid(many.duration, points=7)
    history = epsilon_history(ledgers, times, DELTA)
    assert history.client_ids == tuple(sorted(many.histories))
    assert np.all(np.diff(history.epsilon, axis=1) >= 0)  # spending never goes back
    for row, client_id in enumerate(history.client_ids[:4]):
        released = many.histories[client_id]
        for column, moment in enumerate(times):
            prefix = [step for t, step in released if t <= moment]
            expected = make_accountant("pld", prefix).epsilon(DELTA) if prefix else 0.0
            assert history.epsilon[row, column] == pytest.approx(expected, rel=1e-9)


def test_representatives_are_min_median_max() -> None:
    final = {"a": 3.0, "b": 1.0, "c": 2.0, "d": 5.0, "e": 4.0}
    assert representative_clients(final) == ["b", "a", "d"]
    assert representative_clients({"x": 1.0, "y": 1.0}) == ["x", "y"]


def test_eps_delta_tradeoff_curve() -> None:
    """f(alpha) = max(0, 1 - delta - e^eps alpha, e^-eps (1 - delta - alpha)) (DRS Prop. 2.5)."""
    alpha = np.array([0.0, 0.01, 0.5, 1.0])
    beta = eps_delta_tradeoff(alpha, 1.0, 1e-5)
    assert beta[0] == pytest.approx(1 - 1e-5)
    assert beta[1] == pytest.approx(1 - 1e-5 - math.e * 0.01)
    assert beta[2] == pytest.approx((1 - 1e-5 - 0.5) / math.e)
    assert beta[3] == 0.0


def test_report_prints_the_summary_and_redraws(many_clients_run: SyntheticRun,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    many = many_clients_run
    assert many.delta == DELTA
    plots = many.path / "plots"
    shutil.rmtree(plots, ignore_errors=True)
    assert cli_main(["report", str(many.path)]) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in plots.iterdir()) == ["accuracy.png", "epsilon.png",
                                                       "tradeoff.png"]
    finals = sorted(many.final_epsilon(cid) for cid in many.histories)
    expected = (f"privacy (pld, delta = 1e-05): eps min {finals[0]:#.4g} / median "
                f"{statistics.median(finals):#.4g} / max {finals[-1]:#.4g} over 12 clients")
    assert expected in out
    summary = json.loads((many.path / "summary.json").read_text())
    assert f"accuracy: final {summary['final_accuracy']:.4f}, best {summary['best_accuracy']:.4f}" in out
    stopped = len(summary["stopped"])
    assert stopped > 0
    assert f"clients: 12; stopped {stopped} ({stopped} budget)" in out
    assert "CLT mu (approximation; not the trade-off plot's GDP-fit mu" in out
    assert "warning: CLT mu values are approximations" in out
    assert "clients.csv says" not in out  # the csv agrees with the ledgers


def test_report_says_when_the_final_model_was_not_evaluated(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun],
        edit_summary: Callable[..., dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's run stopped by SIGTERM at window 70 reported "accuracy: final 0.7298": the
    evaluation of version 40 (summary.json's final_evaluated_version), not of the final
    model, version 70, which an interrupted run never evaluates."""
    run = copy_run(small_run)
    edit_summary(run, final_accuracy=0.7298, best_accuracy=0.7298, final_evaluated_version=40,
                 final_version=70, interrupted={"signal": "SIGTERM", "partial": True})
    assert cli_main(["report", str(run.path)]) == 0
    out = capsys.readouterr().out
    assert ("accuracy: last evaluated 0.7298 (model version 40; the final model, version 70, "
            "was not evaluated), best 0.7298") in out
    assert "accuracy: final" not in out
    assert cli_main(["compare", str(run.path), "--no-plots"]) == 0  # compare's table says it too
    assert (f"note: {run.path.name}: its final acc is the last evaluation's, of model version "
            "40; the final model, version 70, was not evaluated") in capsys.readouterr().out
    edit_summary(run, final_evaluated_version=70, interrupted=None)
    assert cli_main(["report", str(run.path)]) == 0
    assert "accuracy: final 0.7298, best 0.7298" in capsys.readouterr().out
    assert cli_main(["compare", str(run.path), "--no-plots"]) == 0
    assert "was not evaluated" not in capsys.readouterr().out


def test_report_warns_when_clients_csv_disagrees_with_a_ledger(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun],
        edit_clients_csv: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_run(small_run)
    edit_clients_csv(run, 0, epsilon="0.001")
    assert cli_main(["report", str(run.path)]) == 0
    assert "warning: client c000: clients.csv says eps 0.001" in capsys.readouterr().out


def test_report_and_compare_say_what_their_eps_cannot_see(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun],
        edit_summary: Callable[..., dict[str, Any]],
        capsys: pytest.CaptureFixture[str]) -> None:
    """An attacker's review: with a ledger deleted, report's eps left the client out with no
    word; compare took eps from summary.json, an edited one unchecked; a ledger without its
    mark (a cut undetectable) passed silently."""
    run = copy_run(small_run)
    (run.path / "ledgers" / "c001.jsonl").unlink()
    (run.path / "ledgers" / "c002.jsonl.hwm").unlink()
    edit_summary(run, privacy={"epsilon_max": 0.001})
    assert cli_main(["report", str(run.path)]) == 0
    out = capsys.readouterr().out
    assert "1 client(s) of clients.csv have no ledger" in out and "c001" in out
    assert "1 ledger(s) have no high-water mark (c002)" in out
    assert cli_main(["compare", str(run.path), "--no-plots", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["runs"]
    kept = sorted(run.final_epsilon(c) for c in run.histories if c != "c001")
    assert row["eps_max"] == pytest.approx(kept[-1])  # the ledgers', not summary.json's
    assert any("summary.json says eps_max 0.001" in w for w in row["warnings"])
    assert any("have no ledger" in w for w in row["warnings"])
    assert cli_main(["compare", str(run.path), "--no-plots"]) == 0
    assert "summary.json says eps_max 0.001" in capsys.readouterr().out


def _damaged(target: Path, damage: str, tmp_path: Path) -> Path:  # noqa: C901 - one per kind
    """``target`` (a copied run directory) with ``damage`` done; the path to report on."""
    if damage == "missing":
        return tmp_path / "nowhere"
    if damage == "not-a-dir":
        return target / "summary.json"
    if damage == "no-metrics":
        (target / "metrics.jsonl").unlink()
    elif damage == "bad-metrics":
        (target / "metrics.jsonl").write_text('{"window": 1, "time": 1.0}\nnot json\n')
    elif damage == "bad-summary":
        (target / "summary.json").write_text("[1, 2")
    elif damage == "no-delta":
        summary = json.loads((target / "summary.json").read_text())
        summary["privacy"] = {"delta": 2.0}
        (target / "summary.json").write_text(json.dumps(summary))
    elif damage == "bad-ledger":
        (target / "ledgers" / "c000.jsonl").write_text("garbage\n")
    elif damage.endswith("-not-utf8"):
        name = {"metrics": "metrics.jsonl", "summary": "summary.json",
                "clients": "clients.csv"}[damage.split("-")[0]]
        (target / name).write_bytes((target / name).read_bytes()[:-2] + b"\xff\xfe\n")
    elif damage == "plots-a-link":
        shutil.rmtree(target / "plots", ignore_errors=True)
        (tmp_path / "elsewhere").mkdir()
        (target / "plots").symlink_to(tmp_path / "elsewhere")
    elif damage == "mark-a-dir":
        mark = target / "ledgers" / "c000.jsonl.hwm"
        mark.unlink()
        mark.mkdir()
    return target


@pytest.mark.parametrize("damage", ["missing", "no-metrics", "bad-metrics", "bad-summary",
                                    "no-delta", "bad-ledger", "not-a-dir", "metrics-not-utf8",
                                    "summary-not-utf8", "clients-not-utf8", "mark-a-dir",
                                    "plots-a-link"])
def test_report_rejects_what_is_not_a_run_directory(
        damage: str, small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun],
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = _damaged(copy_run(small_run).path, damage, tmp_path)
    assert cli_main(["report", str(target)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("fedsim report: error: ")
    assert "Traceback" not in captured.err
    assert str(target.name) in captured.err or "ledgers" in captured.err
    if damage == "plots-a-link":
        assert not any((tmp_path / "elsewhere").iterdir())  # nothing drawn through the link


def test_many_clients_plot_quantile_clients_only(many_clients_run: SyntheticRun,
                                                 copy_run: Callable[..., SyntheticRun],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the evaluation budget only clients at quantiles of final eps are put on the grid,
    but every client's final eps is still computed (and reported)."""
    from fedsim.reporting import plots

    run = copy_run(many_clients_run)
    seen: dict[str, object] = {}
    original = plots.draw_epsilon

    def spy(run_dir, panels, path, *rest):  # type: ignore[no-untyped-def]
        (panel,) = panels  # every client of this run samples the same way: one panel
        seen.update(clients=panel.history.client_ids, population=panel.population,
                    labels=panel.labels)
        return original(run_dir, panels, path, *rest)

    monkeypatch.setattr(plots, "EXACT_BAND_EVALUATIONS", 10)
    monkeypatch.setattr(plots, "draw_epsilon", spy)
    drawn = plots.draw_run(RunDirectory.load(run.path))
    finals = {cid: run.final_epsilon(cid) for cid in run.histories}
    assert drawn.final_epsilon == pytest.approx(finals, rel=1e-9)
    assert seen["population"] == 12
    labels = seen["labels"]
    assert isinstance(labels, dict) and set(seen["clients"]) == set(labels)  # type: ignore[arg-type]
    ordered = sorted(finals, key=lambda cid: (finals[cid], cid))
    assert labels[ordered[0]].startswith("min") and labels[ordered[-1]].endswith("max")
    assert len(labels) < 12


def test_report_groups_stop_reasons_by_kind(small_run: SyntheticRun,
                                            copy_run: Callable[..., SyntheticRun],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The report counts the written kinds (clients.csv's stop_kind), never the text: a
    reason whose words would mislead a keyword match is counted by its kind."""
    run = copy_run(small_run)
    csv_path = run.path / "clients.csv"
    with csv_path.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    stops = [("its next round (round 237, counted from 0) would exceed its privacy budget", "budget"),
             ("finished its 12 rounds", "done"),
             ("crashed and did not rejoin", "crashed"),
             ("the server finished the run at version 9 (no budget left to anyone)",
              "server_finished")]
    for index, row in enumerate(rows):
        row["stop_reason"], row["stop_kind"] = stops[index % len(stops)]
        row["stopped_at"] = "1.0"
    with csv_path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert cli_main(["report", str(run.path)]) == 0
    out = capsys.readouterr().out
    counts: dict[str, int] = {}
    for index in range(len(rows)):
        kind = stops[index % len(stops)][1]
        counts[kind] = counts.get(kind, 0) + 1
    expected = ", ".join(f"{n} {kind}" for kind, n in sorted(
        counts.items(), key=lambda item: (-item[1], item[0])))
    assert f"stopped {len(rows)} ({expected})" in out
    assert "would exceed" not in out.split("clients:")[1].splitlines()[0]


def test_plots_put_each_neighbouring_relation_on_its_own_axes(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Poisson (add/remove) and fixed-size (replace-one) eps never share an axis."""
    from fedsim.reporting import plots

    run = copy_run(small_run)
    ledgers = sorted((run.path / "ledgers").glob("*.jsonl"))
    # Re-label one client's ledger as fixed-size sampling (header and steps alike).
    lines = ledgers[0].read_text().splitlines()
    lines = [line.replace('"poisson"', '"fixed"') for line in lines]
    # a legitimate rewrite: the hash chain is recomputed and the high-water mark follows
    import json

    from fedsim.privacy.ledger_file import MarkFile, line_hash
    from fedsim.privacy.ledger_mark import Mark, mark_path

    for i in range(1, len(lines)):
        record = json.loads(lines[i])
        record["prev"] = line_hash(lines[i - 1].encode())
        lines[i] = json.dumps(record)
    ledgers[0].write_text("\n".join(lines) + "\n")
    if mark_path(ledgers[0]).exists():
        mark = MarkFile(mark_path(ledgers[0]), create=False)
        mark.write_both(Mark(len(lines) - 1, line_hash(lines[-1].encode())))
        mark.close()
    directory = RunDirectory.load(run.path)
    relations = {lg.sampling for lg in read_ledgers(directory)}
    assert relations == {"fixed", "poisson"}
    captured: list[list[str]] = []
    original = plots.draw_epsilon

    def spy(run_dir, panels, path, *rest):  # type: ignore[no-untyped-def]
        captured.append([p.sampling for p in panels])
        for panel in panels:
            samplings = {lg.sampling for lg in read_ledgers(directory)
                         if lg.client_id in panel.history.client_ids}
            assert samplings == {panel.sampling}
        return original(run_dir, panels, path, *rest)

    monkeypatch.setattr(plots, "draw_epsilon", spy)
    plots.draw_run(directory)
    assert sorted(captured[0]) == ["fixed", "poisson"]


@pytest.mark.parametrize(("time_kind", "label", "client_label"), [
    (None, "virtual time (s)", "virtual time (s)"),
    ("virtual", "virtual time (s)", "virtual time (s)"),
    ("scenario", "scenario time (s: wall clock / time scale)",
     "scenario time (s: wall clock / time scale; each client's own clock)")])
def test_the_time_axis_says_what_the_seconds_are(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun],
        monkeypatch: pytest.MonkeyPatch, time_kind: str | None, label: str,
        client_label: str) -> None:
    """A deployed run's seconds are the wall clock divided by the time scale, not virtual
    time; its clients' (the epsilon plot's) are on each client's own clock, which starts with
    its process (a stranger saw a client stop after the server's end)."""
    run = copy_run(small_run)
    summary_path = run.path / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary.pop("time_kind", None)
    if time_kind is not None:
        summary["time_kind"] = time_kind
    summary_path.write_text(json.dumps(summary))
    labels: list[str] = []
    original = figure_files.save_png

    def recording_save(figure: Any, path: Path) -> Any:
        labels.extend(axes.get_xlabel() for axes in figure.axes if axes.get_xlabel())
        return original(figure, path)

    monkeypatch.setattr(figure_files, "save_png", recording_save)
    draw_all(run.path)
    time_labels = [text for text in labels if "time" in text]
    assert time_labels and set(time_labels) == {label, client_label}


def _drawn_figures(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """File name -> the figure saved to it (by spying on the one writer of a plot's file)."""
    figures: dict[str, Any] = {}
    original = figure_files.save_png

    def recording_save(figure: Any, path: Path) -> Any:
        figures[path.name] = figure
        return original(figure, path)

    monkeypatch.setattr(figure_files, "save_png", recording_save)
    return figures


def _legend_texts(figure: Any) -> list[str]:
    legends = [axes.get_legend() for axes in figure.axes] + list(figure.legends)
    return [t.get_text() for legend in legends if legend is not None for t in legend.get_texts()]


def test_plots_group_clients_fit_the_accuracy_axis_and_mark_an_interruption(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27, finding 8: identical curves no longer hide each other (one line per group),
    the trade-off plot says which clients it shows and why, the accuracy axis fits the values,
    the final model's evaluation is marked, and an interrupted run says so."""
    run = copy_run(small_run)
    directory = RunDirectory.load(run.path)
    groups: dict[str, list[str]] = {}
    for row in directory.clients:
        groups.setdefault(str(row["group"]), []).append(str(row["client_id"]))
    figures = _drawn_figures(monkeypatch)
    draw_all(run.path)
    # epsilon.png: one legend entry per group (not per client), naming its size.
    eps_labels = [t for t in _legend_texts(figures["epsilon.png"]) if "budget" not in t]
    assert len(eps_labels) == len(groups)
    for name, members in groups.items():
        (label,) = [t for t in eps_labels if t.startswith(f"{name}:")]
        assert (f"{len(members)} clients" in label) if len(members) > 1 else members[0] in label
    # tradeoff.png: per group, the client with the group's median final eps; the title says so.
    finals = {cid: run.final_epsilon(cid) for cid in run.histories}
    title = figures["tradeoff.png"]._suptitle.get_text()
    assert f"of {len(groups)} of {len(finals)} clients" in title and "median" in title
    tradeoff_labels = _legend_texts(figures["tradeoff.png"])
    for name, members in groups.items():
        own = {cid: finals[cid] for cid in members}
        (middle,) = plots.quantile_clients(own, [0.5])
        assert any(t.startswith(f"{name}") and middle in t for t in tradeoff_labels), name
    # accuracy.png: the axis fits the values with a margin, not 0-1.
    values = [m["accuracy"] for m in directory.metrics if m["accuracy"] is not None]
    (axes, *_) = figures["accuracy.png"].axes
    low, high = axes.get_ylim()
    assert low <= min(values) and high >= max(values)
    assert (high - low) < 1.2 * (max(values) - min(values)) + 0.021
    # An interrupted run: the titles and a vertical line say so.
    summary = json.loads((run.path / "summary.json").read_text())
    summary["interrupted"] = {"signal": "SIGINT", "partial": True}
    (run.path / "summary.json").write_text(json.dumps(summary))
    figures.clear()
    draw_all(run.path)
    assert "interrupted by SIGINT" in figures["accuracy.png"].axes[0].get_title()
    assert "interrupted by SIGINT" in figures["epsilon.png"]._suptitle.get_text()
    assert any(t == "interrupted by SIGINT" for t in _legend_texts(figures["accuracy.png"]))


def test_the_final_models_evaluation_is_a_star_on_the_accuracy_plot(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun],
        monkeypatch: pytest.MonkeyPatch) -> None:
    run = copy_run(small_run)
    summary = json.loads((run.path / "summary.json").read_text())
    summary.update(final_accuracy=0.9321, final_evaluated_version=57, final_version=57)
    (run.path / "summary.json").write_text(json.dumps(summary))
    figures = _drawn_figures(monkeypatch)
    draw_all(run.path)
    assert "final model (version 57): 0.9321" in _legend_texts(figures["accuracy.png"])
    assert figures["accuracy.png"].axes[0].get_ylim()[1] >= 0.9321


def _line_colours(figure: Any) -> dict[str, Any]:
    """Label -> colour (as RGBA) of every labelled line of ``figure``'s axes."""
    from matplotlib.colors import to_rgba

    return {line.get_label(): to_rgba(line.get_color()) for axes in figure.axes
            for line in axes.get_lines() if not line.get_label().startswith("_")}


def test_a_group_is_one_colour_on_every_plot(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stranger's finding: a group was blue on the epsilon plot and green on the trade-off
    plot (each plot numbered its own lines). Each group now has one colour in a run."""
    run = copy_run(small_run)
    names = {str(row["group"]) for row in RunDirectory.load(run.path).clients}
    assert len(names) >= 2
    figures = _drawn_figures(monkeypatch)
    draw_all(run.path)
    eps = _line_colours(figures["epsilon.png"])
    trade = _line_colours(figures["tradeoff.png"])
    seen = set()
    for name in names:
        (eps_colour,) = {c for label, c in eps.items() if label.startswith(f"{name}:")}
        (trade_colour,) = {c for label, c in trade.items()
                           if label.startswith(f"{name},") or label.startswith(f"{name}:")}
        assert eps_colour == trade_colour, name
        seen.add(eps_colour)
    assert len(seen) == len(names)  # and groups differ from each other


def test_long_tick_labels_keep_the_accuracy_label_in_the_figure(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stranger's finding: on an axis fitted to close values (0.6000-0.6004) the tick labels
    took five digits and pushed the axis label 'accuracy' out of the picture."""
    run = copy_run(small_run)
    metrics = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    evaluated = [m for m in metrics if m.get("accuracy") is not None]
    assert len(evaluated) >= 2
    for index, record in enumerate(evaluated):
        record["accuracy"] = 0.6 + 0.0001 * index
    (run.path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    figures = _drawn_figures(monkeypatch)
    draw_all(run.path)
    figure = figures["accuracy.png"]
    renderer = figure.canvas.get_renderer()
    ticks = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert max(len(t) for t in ticks) >= 6, ticks  # the case: long tick labels
    assert figure.axes[0].yaxis.label.get_window_extent(renderer).x0 >= 0


def test_the_accuracy_legend_counts_the_evaluations(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The legend says how many evaluations the line holds and their spacing in windows, from
    the metrics (it said 'every eval_every windows', a setting's name, whatever the run held)."""
    run = copy_run(small_run)
    directory = RunDirectory.load(run.path)
    windows = [m["window"] for m in directory.metrics if m.get("accuracy") is not None]
    figures = _drawn_figures(monkeypatch)
    draw_all(run.path)
    (label,) = [t for t in _legend_texts(figures["accuracy.png"]) if "held-out" in t]
    gaps = {b - a for a, b in zip(windows, windows[1:], strict=False)}
    expected = f"{len(windows)} evaluations" + (f", every {gaps.pop()} windows"
                                                 if len(gaps) == 1 else "")
    assert f"held-out accuracy, {expected} (left axis)" == label
    # One evaluation only: no spacing, and no plural.
    metrics = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    for m in [m for m in metrics if m.get("accuracy") is not None][1:]:
        m["accuracy"] = None
    (run.path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    figures.clear()
    draw_all(run.path)
    assert "held-out accuracy, 1 evaluation (left axis)" in _legend_texts(figures["accuracy.png"])


@pytest.mark.parametrize("name", ["metrics.jsonl", "summary.json", "clients.csv"])
def test_a_file_larger_than_a_run_writes_is_refused_unread(
        name: str, small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun],
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A run directory handed over may hold a file of any size; a report read each whole into
    memory. Past MAX_RUN_FILE_BYTES (lowered here) it is refused; at the limit it is read."""
    from fedsim.runtime import run_outputs

    target = copy_run(small_run).path
    limit = 2 * max(path.stat().st_size for path in target.iterdir() if path.is_file())
    monkeypatch.setattr(run_outputs, "MAX_RUN_FILE_BYTES", limit)
    original = (target / name).read_bytes()
    # Padded with what each reader skips (white space, empty lines) to the limit, then past it.
    (target / name).write_bytes(original + b"\n" * (limit - len(original)))
    assert cli_main(["report", str(target)]) == 0
    capsys.readouterr()
    (target / name).write_bytes(original + b"\n" * (limit + 1 - len(original)))
    assert cli_main(["report", str(target)]) == 2
    err = capsys.readouterr().err
    assert f"{name}: larger than {limit:,} bytes, more than a run writes; not read" in err


def test_a_directory_of_runs_is_named_as_one(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger gave `fedsim compare` a sweep's directory: "not a run directory", with no
    word of the runs inside it."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    shutil.copytree(copy_run(small_run).path, sweep / "trial-000-a")
    shutil.copytree(copy_run(small_run).path, sweep / "trial-001-b")
    (sweep / "sweep.json").write_text("{}")
    (sweep / "sweep.csv").write_text("trial\n")
    (sweep / "tuning").mkdir()  # (a privately tuned sweep's: not a run)
    assert cli_main(["compare", str(sweep), "--no-plots"]) == 2
    err = capsys.readouterr().err
    suggested = f"`fedsim compare {sweep}/trial-*/`"
    assert f"it is a sweep's directory: name its runs, for example {suggested}" in err \
        and f"`fedsim report {sweep / 'trial-000-a'}`" in err
    # ... and the suggestion works as a shell expands it (`sweep/*` took sweep.csv too, and a
    # stranger who ran it was refused)
    expanded = sorted(glob.glob(f"{sweep}/trial-*/"))
    assert len(expanded) == 2
    assert cli_main(["compare", *expanded, "--no-plots"]) == 0
    capsys.readouterr()
    (sweep / "sweep.json").unlink()
    assert cli_main(["report", str(sweep)]) == 2
    assert f"it is a directory of runs: name its runs, for example `fedsim compare " \
        f"{sweep}/trial-*/`" in capsys.readouterr().err
    shutil.move(sweep / "trial-001-b", sweep / "other")
    assert cli_main(["report", str(sweep)]) == 2
    assert f"`fedsim compare {sweep}/*/`" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli_main(["report", str(empty)]) == 2
    assert "directory of runs" not in capsys.readouterr().err


def test_a_group_that_spent_nothing_is_named_on_the_trade_off_plot(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stranger's group that never trained was left out of the trade-off plot without a
    word (the title said "2 of 10 clients")."""
    from fedsim.reporting.tradeoff_plot import draw_tradeoff

    run = copy_run(small_run)
    directory = RunDirectory.load(run.path)
    groups = {str(r["client_id"]): str(r["group"]) for r in directory.clients}
    quiet = sorted(set(groups.values()))[0]
    final = {cid: (0.0 if groups[cid] == quiet else run.final_epsilon(cid))
             for cid in run.histories}
    figures = _drawn_figures(monkeypatch)
    draw_tradeoff(directory, read_ledgers(directory), final, tmp_path / "tradeoff.png")
    labels = _legend_texts(figures["tradeoff.png"])
    assert f"{quiet}: no client spent privacy" in labels
    assert not any(t.startswith(f"{quiet},") or t.startswith(f"{quiet}:") and "median" in t
                   for t in labels)


def test_the_time_grid_keeps_a_plots_chords_near_a_concave_curve() -> None:
    """eps grows about as the square root of the steps taken, and a plot joins the grid's
    points by chords, which lie below it: on an evenly spaced grid the first segment read 29 %
    low at its middle (a stranger saw two runs' curves 2x apart at one time). The grid is dense
    early: from a fiftieth of the run on, every chord is within 6 % of such a curve."""
    end = 263.0
    grid = time_grid(end)
    assert grid[0] == 0.0 and grid[-1] == end and np.all(np.diff(grid) > 0)
    times = np.linspace(end / 50, end, 5001)
    chord = np.interp(times, grid, np.sqrt(grid))
    assert np.max(1 - chord / np.sqrt(times)) < 0.06
    even = np.linspace(0.0, end, len(grid))
    assert np.max(1 - np.interp(times, even, np.sqrt(even)) / np.sqrt(times)) > 0.2  # before


def test_hostile_names_and_times_neither_crash_nor_parse(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun],
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A review: a scenario name of nested mathtext crashed the report (RecursionError), and
    metrics times of 1e308 broke the axes (ValueError), both as tracebacks."""
    run = copy_run(small_run)
    summary = json.loads((run.path / "summary.json").read_text())
    summary["scenario"] = "$x" + "^{" * 400 + "}" * 400 + "$"
    (run.path / "summary.json").write_text(json.dumps(summary))
    figures = _drawn_figures(monkeypatch)
    assert cli_main(["report", str(run.path)]) == 0
    assert figures["accuracy.png"].axes[0].get_title().startswith("$x^{^{")  # drawn as text
    capsys.readouterr()
    metrics = [json.loads(t) for t in (run.path / "metrics.jsonl").read_text().splitlines()]
    metrics[-1]["time"] = 1e308
    (run.path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    assert cli_main(["report", str(run.path)]) == 2
    err = capsys.readouterr().err
    assert "'time' must be a number of seconds in [0, 1e+09], got 1e+308" in err
    assert "Traceback" not in err


def test_more_metrics_lines_than_a_run_has_windows_are_refused(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun],
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A review: 32 MiB of tiny metrics lines (3 million rows) took 1.1 GB to read, so the
    512 MiB file limit alone allowed about 18 GB. A run has a line a window, at most
    MAX_WINDOWS (lowered here to the run's own count: read; one line more: refused)."""
    from fedsim.config import limits

    run = copy_run(small_run)
    lines = [t for t in (run.path / "metrics.jsonl").read_text().splitlines() if t.strip()]
    monkeypatch.setattr(limits, "MAX_WINDOWS", len(lines))
    assert len(RunDirectory.load(run.path).metrics) == len(lines)  # at the limit: read
    with open(run.path / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write(lines[-1] + "\n")
    assert cli_main(["report", str(run.path)]) == 2
    assert f"more than {len(lines):,} lines, more windows than a run can have" in \
        capsys.readouterr().err


def test_metrics_rows_share_their_keys_and_equal_the_lines(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun]) -> None:
    """Every row's keys are the same string objects (json.loads makes new ones a line: a
    quickstart row took 1,456 bytes, with shared keys 584), and the rows are the lines' own
    values, in time order; a file with a new key a line (hostile) shares only the first
    ones (the shared set stays bounded)."""
    from fedsim.reporting import rundir

    run = copy_run(small_run)
    lines = [json.loads(t) for t in (run.path / "metrics.jsonl").read_text().splitlines()
             if t.strip()]
    rows = RunDirectory.load(run.path).metrics
    assert list(rows) == sorted(lines, key=lambda r: (r["time"], r.get("window") or 0))
    assert len(rows) > 1 and all(
        a is b for row in rows[1:] for a, b in zip(rows[0], row, strict=True))
    hostile = [{"time": float(k), f"key{k}": k} for k in range(rundir._SHARED_KEYS + 10)]
    (run.path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in hostile))
    read = RunDirectory.load(run.path).metrics
    assert list(read) == hostile
    # shared while the set is under its bound ("time" of the first rows), not after it
    time_keys = [next(iter(row)) for row in read]
    assert time_keys[1] is time_keys[0] and time_keys[-1] is not time_keys[0]


def test_a_title_wider_than_its_figure_is_wrapped_inside_it(tmp_path: Path) -> None:
    """A stranger: an interrupted run's long title was cut at both edges of the figure."""
    from fedsim.reporting.figures import new_figure, save

    figure, [axes] = new_figure()
    axes.plot([0, 1], [0, 1])
    figure.suptitle("a-scenario-name-" * 12 + ": privacy spent per client (interrupted)")
    axes.set_title("short")
    save(figure, tmp_path / "wide.png")
    renderer = figure.canvas.get_renderer()
    title = figure._suptitle
    assert "\n" in title.get_text() and axes.title.get_text() == "short"
    box = title.get_window_extent(renderer)
    assert box.x0 >= 0 and box.x1 <= figure.bbox.width and box.y1 <= figure.bbox.height
    assert axes.get_window_extent(renderer).y1 < box.y0  # the axes moved down under it


def test_compare_says_when_runs_state_eps_at_different_deltas(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun], tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A stranger compared the same run at delta 1e-5 and 1e-3 and read the second as spending
    half the privacy: the table and the plot said only "delta = 1e-05, 0.001"."""
    import fedsim.reporting.compare as compare_module

    base = copy_run(small_run)
    wider = copy_run(small_run)  # the same ledgers, stated at a larger delta
    summary = json.loads((wider.path / "summary.json").read_text())
    summary["privacy"]["delta"] = 1e-3
    (wider.path / "summary.json").write_text(json.dumps(summary))
    # the legend's labels, as the plot draws them
    drawn: list[str] = []
    original = compare_module._draw_run_line

    def recording(axes: Any, run: Any, times: Any, values: Any, label: str, style: Any) -> None:
        drawn.append(label)
        original(axes, run, times, values, label, style)

    monkeypatch.setattr(compare_module, "_draw_run_line", recording)
    plots = tmp_path / "plots"
    assert cli_main(["compare", str(base.path), str(wider.path), "--plots", str(plots),
                     "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    [note] = shown["notes"]
    assert "different deltas" in note and "not comparable as numbers" in note
    first, second = shown["runs"]
    assert (first["delta"], second["delta"]) == (DELTA, 1e-3)
    assert second["eps_max"] < first["eps_max"]  # the same ledgers read smaller at 1e-3
    assert any(label.endswith(f"(delta {DELTA:g})") for label in drawn)
    assert any(label.endswith("(delta 0.001)") for label in drawn)
    # --delta states both at one delta: the same ledgers, the same eps, no note
    drawn.clear()
    assert cli_main(["compare", str(base.path), str(wider.path), "--plots", str(plots),
                     "--json", "--delta", str(DELTA)]) == 0
    shown = json.loads(capsys.readouterr().out)
    first, second = shown["runs"]
    assert shown["notes"] == [] and first["delta"] == second["delta"] == DELTA
    for key in ("eps_min", "eps_median", "eps_max"):
        assert second[key] == pytest.approx(first[key], rel=1e-12)
    # ... the most a fresh accountant gives any of the ledgers, at that delta
    expected = max(make_accountant("pld", list(group_steps(s for _, s in history))).epsilon(DELTA)
                   for history in base.histories.values() if history)
    assert first["eps_max"] == pytest.approx(expected, rel=1e-9)
    assert not any("(delta" in label for label in drawn)
    # the table says it too
    assert cli_main(["compare", str(base.path), str(wider.path), "--no-plots"]) == 0
    assert "different deltas" in capsys.readouterr().out
    # a delta above a run's own is said to weaken its guarantee
    assert cli_main(["compare", str(base.path), str(wider.path), "--no-plots", "--delta",
                     "0.01"]) == 0
    said = capsys.readouterr().out
    assert "delta 0.01 is larger than the scenario's own of" in said and "weaker" in said
    assert cli_main(["compare", str(base.path), "--no-plots", "--delta", "2"]) == 2
    assert "--delta must be in (0, 1)" in capsys.readouterr().err


def test_compare_of_many_runs_draws_medians_and_wrapped_labels(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A stranger's seven runs' bands overlapped into one brown area, and a long label
    ("...(interrupted by SIGTERM)") ran off the figure's edge."""
    import fedsim.reporting.compare as compare_module

    figures: list[Any] = []
    original = compare_module._figure

    def keeping(rows: int) -> Any:
        made = original(rows)
        figures.append(made[1])
        return made

    monkeypatch.setattr(compare_module, "_figure", keeping)
    long_label = "a-rather-long-trial-name-of-a-sweep sigma=1.3 seed=0 (interrupted by SIGTERM)"
    for count in (compare_module.MAX_BANDED_RUNS, compare_module.MAX_BANDED_RUNS + 1):
        figures.clear()
        runs = [RunDirectory.load(copy_run(small_run).path) for _ in range(count)]
        compare_module.draw_epsilon_comparison(runs, [long_label] * count,
                                               tmp_path / f"eps{count}.png")
        [axes] = figures[0]
        bands = [c for c in axes.collections if type(c).__name__ in ("PolyCollection",
                                                                     "FillBetweenPolyCollection")]
        assert len(bands) == (count if count <= compare_module.MAX_BANDED_RUNS else 0)
        assert ("band min-max" in axes.get_title()) == (count <= compare_module.MAX_BANDED_RUNS)
        texts = [t.get_text() for t in axes.get_legend().get_texts()]
        assert all(max(len(line) for line in t.splitlines()) <= 42 for t in texts)
        assert texts[0].replace("\n", " ") == long_label


def test_a_tuning_trials_eps_plot_says_what_it_is(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun]) -> None:
    """A plot copied from a privately tuned release showed the trial's own eps (the
    release's privacy is the tuned eps, above those curves); another trial's said nothing of
    not being a release."""
    run = copy_run(small_run)
    summary = json.loads((run.path / "summary.json").read_text())
    assert figure_files.tuning_note(RunDirectory.load(run.path)) == ""
    summary["private_tuning"] = {"release": True, "epsilon_max": 4.3007}
    (run.path / "summary.json").write_text(json.dumps(summary))
    note = figure_files.tuning_note(RunDirectory.load(run.path))
    assert "the release of a private tuning" in note and "max 4.301" in note
    summary["private_tuning"] = {"release": False}
    (run.path / "summary.json").write_text(json.dumps(summary))
    assert "NOT A RELEASE" in figure_files.tuning_note(RunDirectory.load(run.path))


def test_report_of_a_run_without_clients_csv_says_so(
        small_run: SyntheticRun, copy_run: Callable[..., SyntheticRun],
        capsys: pytest.CaptureFixture[str]) -> None:
    """Before: "clients: 0; stopped 0" above "eps ... over 4 clients" (from the ledgers) when
    clients.csv was gone; now the clients line says the file is missing."""
    run = copy_run(small_run)
    (run.path / "clients.csv").unlink()
    assert cli_main(["report", str(run.path)]) == 0
    out = capsys.readouterr().out
    assert "clients: 0" not in out
    assert ("clients: no clients.csv in this run directory: their states and stops are "
            "unknown") in out
    assert "over 4 clients" in out
