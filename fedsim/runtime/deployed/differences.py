"""What a deployed run of a scenario does differently from its simulation, said up front
(``fedsim validate``'s "if deployed" lines) and after the run (a launched run's
``summary.json``, ``deployed_differences``), so that a comparison of the two runtimes' results
is read for what it is (a stranger's review: a launched run trained half the rounds of the
simulation and said nothing).

* The scenario's client links (``network``, a group's ``network``) are emulated at each client
  (:mod:`fedsim.transports.emulated`: the simulated network's rule, on the broker's real
  network), and so are ``availability.crashes`` (:mod:`fedsim.runtime.deployed.client_lives`:
  the simulation's rule, in the client's process), so neither is a difference; the
  aggregation nodes' links (``aggregators.latency``, ``aggregators.drop``) are not emulated:
  the broker is the network there (docs/DEPLOYMENT.md, "Time").
* Under ``interrupt: switch`` with ``privacy.timing: public``, a deployed client computes its
  round paced, in parts (eighths of a local step, fewer for a short slot) as its slot passes
  (:mod:`fedsim.runtime.actors.round_timing`), and takes a global model arriving mid-round
  from the first part starting after its arrival, where a simulated client takes it from the
  arrival itself;
  the release keeps its time unless the parts fall behind and overrun the slot (counted);
  a model arriving after the last part's start is the next round's (counted, ``late_models``). A
  model too large to keep its sums (above 5.5 M parameters times local steps) has a split round
  computed again whole and released a whole slot after the arrival
  (:meth:`~fedsim.runtime.actors.round_timing.RoundTiming.padded`); before session 58 every model
  did, and a stranger measured 15 of a simulation's 31 rounds (accuracy 0.756 against 0.838).
"""

from __future__ import annotations

from collections.abc import Iterable

from fedsim.config.schema import Scenario

__all__ = ["measured_differences", "scenario_differences"]

_SWITCH_DELAY = (
    "interrupt switch with public timing (groups {groups}): a deployed client computes its round "
    "in parts (eighths of a local step, fewer for a short slot: one, and a model arriving "
    "mid-round is the next round's, where a part would get under 25 ms of wall time) as its "
    "slot passes and takes a global model arriving mid-round from the next part on (a "
    "simulation from the arrival itself), releasing on time unless its compute falls behind "
    "the slot (counted); above "
    "5.5 M parameters (times local steps) a split round is computed again whole and released "
    "a whole round time after the arrival (interrupt: snapshot avoids both)")


def _aggregator_link_settings(scenario: Scenario) -> list[str]:
    """The aggregation nodes' link settings that are not a perfect link (none without nodes)."""
    aggregators = scenario.aggregators
    if not aggregators.count:
        return []
    plain = type(aggregators)()
    return [f"aggregators.{name}" for name in ("latency", "drop")
            if getattr(aggregators, name) != getattr(plain, name)]


def scenario_differences(scenario: Scenario) -> list[str]:
    """What a deployed run of ``scenario`` would not do as its simulation does (module
    docstring), from the scenario alone."""
    lines = []
    links = _aggregator_link_settings(scenario)
    if links:
        lines.append(f"not emulated: the aggregation nodes' links ({', '.join(links)}); the "
                     "broker is the network between the nodes and the server (the clients' "
                     "links are emulated)")
    switching = [g.name for g in scenario.clients.groups if g.interrupt == "switch"]
    if switching and scenario.privacy.timing == "public":
        lines.append(_SWITCH_DELAY.format(groups=", ".join(switching)))
    return lines


def measured_differences(scenario: Scenario, split_delays: Iterable[int],
                         released_rounds: int, late_models: Iterable[int] = ()) -> list[str]:
    """:func:`scenario_differences`, with the switch's cost as this run measured it: how many
    of the ``released_rounds`` of its switching groups' clients a split moved to a later slot
    (``split_delays``: each client's count), and how many global models came mid-round after
    a paced round's last part began (``late_models``: each client's count), the next round's
    where a simulation splits the round at them."""
    lines = scenario_differences(scenario)
    delayed = sum(split_delays)
    late = sum(late_models)
    for index, line in enumerate(lines):
        if line.startswith("interrupt switch"):
            lines[index] = (f"{line}; this run: {delayed} of those groups' {released_rounds} "
                            "released rounds were moved to a later slot by a model's arrival, "
                            f"and {late} models arriving mid-round came after the round's last "
                            "part began (the next round's)")
    return lines
