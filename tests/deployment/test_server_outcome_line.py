"""What ``fedsim server`` prints when it ends."""

from __future__ import annotations

from typing import Any

import pytest

from fedsim.commands.server import outcome_line

REASON = "window 24 ended at 6.01 scenario seconds, the first window end at or after its limit of 6 s"


@pytest.mark.parametrize(("final", "last", "said"), [
    ({"version": 23, "accuracy": 0.6184, "loss": 1.2}, None, "final accuracy 0.6184"),
    ({"version": 23, "accuracy": 0.6184, "loss": 1.2}, 0.5, "final accuracy 0.6184"),
    (None, 0.5, "last evaluated accuracy 0.5000"),
    (None, None, "accuracy n/a (not evaluated)")])
def test_the_server_says_the_final_models_accuracy(
        final: dict[str, Any] | None, last: float | None, said: str) -> None:
    """A stranger's hand-started server ran 24 windows (periodic evaluation every 40) and
    printed "accuracy n/a", while its server.json held the final model's evaluation, 0.6184
    (fedsim report said it)."""
    outcome = {"windows": 24, "final_version": 23, "final_evaluation": final,
               "last_accuracy": last, "stop_reason": REASON}
    assert outcome_line("quickstart", outcome) == (
        f"server quickstart: 24 windows, version 23, {said}; {REASON}")


@pytest.mark.parametrize(("resumed", "said"), [
    (None, "server quickstart: no window closed; "),
    (12, "server quickstart: no window closed in this part (resumed after window 12); ")])
def test_a_server_stopped_before_its_first_window_says_so(resumed: int | None, said: str) -> None:
    """A stranger's ``fedsim server`` on a broker that was not up, stopped by Ctrl-C while it
    kept trying, printed "server quickstart: None windows, version None, accuracy n/a (not
    evaluated); stopped by a signal before the first connection to the broker"."""
    from fedsim.runtime.deployed.deployment import STOPPED_BEFORE_CONNECTING

    outcome = {"run": "quickstart", "resumed_from_window": resumed, "finished": False,
               "stop_reason": STOPPED_BEFORE_CONNECTING}
    line = outcome_line("quickstart", outcome)
    assert line == said + STOPPED_BEFORE_CONNECTING
    assert "None" not in line
