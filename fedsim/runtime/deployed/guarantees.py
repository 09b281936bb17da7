"""What a deployed run guarantees per client group, and the refusal of a posture that would
deploy without them (docs/SECURITY.md, "Pacing and release padding").

Two protections of a deployment rest on a group's **public slot**
(:func:`~fedsim.runtime.actors.admission.group_slot`, from its ``speed`` and expected batch):

* **pacing** (:class:`~fedsim.runtime.actors.admission.Pacer`): the server applies a client's
  updates at most one per slot (plus a burst), so a client that sends its legal rounds back to
  back moves the model no further than an honest one;
* **release padding** (:func:`~fedsim.runtime.actors.exposure.release_time`, ``privacy.timing:
  public``): a client releases each round at ``start + k * slot``, so the publish-to-arrival
  time does not follow its realised Poisson batch size.

A group without a slot (``speed: 0``, the schema's default, or an ``exponential`` speed under
``timing: realised`` with Poisson sampling) has neither, so deployment refuses it
(:func:`require_public_slots`); the simulator, where nobody observes time and every client is
honest, runs it. It refuses ``dp_pca`` too: its shared projection needs every client's release
before round 0, which only the simulated runtime gathers (:mod:`fedsim.runtime.dp_pca`). :func:`group_guarantees` says per group what holds (``fedsim validate``).
"""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.config.schema import Scenario
from fedsim.errors import ConfigError
from fedsim.runtime.actors.admission import BURST, group_slot

__all__ = ["GroupGuarantee", "group_guarantees", "require_public_slots"]


def _missing(scenario: Scenario) -> list[str]:
    timing = scenario.privacy.timing
    problems = []
    for index, group in enumerate(scenario.clients.groups):
        if group_slot(group, timing) is None:
            problems.append(
                f"clients.groups[{index}] ({group.name}): its speed "
                f"({group.speed.model_dump()}) gives no public round time "
                + ("under privacy.timing = realised with Poisson sampling; " if timing == "realised"
                   else "; ")
                + "deployed, its clients would be neither paced by the server nor released on a "
                "public schedule (give speed a positive value in seconds per sample gradient, "
                "for example speed: 0.001)")
        if group.dp_pca is not None:
            problems.append(
                f"clients.groups[{index}] ({group.name}): dp_pca needs every client's released "
                "matrix before round 0 for the shared projection, which only the simulated "
                "runtime gathers (fedsim run)")
    return problems


def require_public_slots(scenario: Scenario) -> None:
    """Refuse ``scenario`` for deployment (a :class:`ConfigError` naming each group) unless
    every group has a public slot (module docstring)."""
    problems = _missing(scenario)
    if problems:
        raise ConfigError("this scenario cannot be deployed:\n  " + "\n  ".join(problems))


@dataclass(frozen=True)
class GroupGuarantee:
    """What holds for one group deployed: ``text`` says it; ``caveat``: the group cannot be
    deployed, or its release times are not padded (what ``fedsim validate`` names even
    without ``--deployed``)."""

    text: str
    caveat: bool


def group_guarantees(scenario: Scenario) -> list[GroupGuarantee]:
    """One per group: whether deployed it is paced and its releases padded (and by which
    slot), or why it cannot be deployed."""
    timing = scenario.privacy.timing
    notes = []
    for group in scenario.clients.groups:
        slot = group_slot(group, timing)
        if group.dp_pca is not None:
            notes.append(GroupGuarantee(f"group {group.name}: NOT DEPLOYABLE: dp_pca's shared "
                                        "projection is gathered by the simulated runtime only",
                                        caveat=True))
            continue
        if slot is None:
            notes.append(GroupGuarantee(f"group {group.name}: NOT DEPLOYABLE: no public round "
                                        "time (speed 0?): it would be neither paced nor padded",
                                        caveat=True))
            continue
        padded = ("release times padded to the public schedule, each round at the end of its "
                  "own expected round time" if timing == "public" else
                  "release times NOT padded (privacy.timing = realised)")
        # (a stranger read the pace for the group's round time: it is its fastest possible)
        notes.append(GroupGuarantee(
            f"group {group.name}: deployed, paced at one update per {slot:.4g} s from each "
            f"client, its fastest possible round (a burst of up to {BURST:g} beyond that "
            f"waits); {padded}", caveat=timing != "public"))
    return notes
