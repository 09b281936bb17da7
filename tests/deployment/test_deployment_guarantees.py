"""Issue 25 finding 1: a deployed posture always has a public slot, so its clients are paced by
the server and their releases padded; a scenario without one (the schema's default speed, 0) is
refused for deployment with an error naming the group, and ``fedsim validate`` says per group
what holds."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from fedsim.cli import main
from fedsim.clock import WallClock
from fedsim.config import load_scenario
from fedsim.errors import ConfigError
from fedsim.protocol.messages import ClientUpdate
from fedsim.runtime.actors.admission import BURST, Pacer
from fedsim.runtime.assembly import make_server_actor
from fedsim.runtime.deployed.client_process import run_client
from fedsim.runtime.deployed.launcher import Launcher
from fedsim.runtime.deployed.server_process import serve
from fedsim.runtime.population import build_population
from fedsim.transports.mqtt import parse_broker_url
from tests.doubles import RecordingEndpoint

SCENARIO = Path(__file__).parent / "four_clients.yaml"
NO_SPEED = "clients.groups[0].speed=0"  # the schema's default


def test_the_shipped_deployment_scenario_paces_a_flooding_client() -> None:
    # The attack: one client sends 40 within-bound rounds per model. With the default speed 0
    # the server had no slot for it and applied all 40; the shipped scenario's slot paces it.
    population = build_population(load_scenario(SCENARIO))
    server = make_server_actor(population, clock=WallClock(), endpoint=RecordingEndpoint(),
                               evaluate=None)
    slots = {c: info.slot for c, info in server.clients.items()}
    assert all(slot is not None and slot > 0 for slot in slots.values())
    pacer = Pacer(slots, start=0.0)
    size = population.initial_params.size
    verdicts = [pacer.offer(ClientUpdate("c-000", r, 0, np.zeros(size, np.float32), 32.0), 0.0)
                for r in range(40)]
    assert verdicts.count("pass") == 1 and verdicts.count("wait") == 39
    # ... and at its slot's pace afterwards: a window of 1 s frees 1 / 0.16 = 6 of them
    freed = list(iter(lambda: pacer.next_due(1.0), None))
    assert len(freed) == int(1.0 / slots["c-000"]) <= BURST


def test_a_scenario_without_a_public_slot_is_refused_for_deployment(tmp_path: Path,
                                                                   capsys) -> None:
    loaded = load_scenario(SCENARIO, [NO_SPEED])
    broker = parse_broker_url("mqtt://127.0.0.1:9")  # never reached: refused before connecting
    with pytest.raises(ConfigError, match=r"clients.groups\[0\] \(c\).*neither paced"):
        asyncio.run(serve(loaded, broker, state_dir=tmp_path / "s", out_dir=tmp_path / "o"))
    with pytest.raises(ConfigError, match=r"clients.groups\[0\] \(c\)"):
        asyncio.run(run_client(loaded, "c-000", broker, state_dir=tmp_path / "c"))
    with pytest.raises(ConfigError, match=r"clients.groups\[0\] \(c\)"):
        Launcher(SCENARIO, tmp_path / "run", overrides=[NO_SPEED])
    assert main(["deploy", str(SCENARIO), "--set", NO_SPEED, "--out", str(tmp_path / "d"),
                 "--plain"]) == 2
    assert "cannot be deployed" in capsys.readouterr().err
    # validate says so per group (the scenario stays valid for the simulator)
    assert main(["validate", str(SCENARIO), "--set", NO_SPEED]) == 0
    assert "group c: NOT DEPLOYABLE" in capsys.readouterr().out
    assert main(["validate", str(SCENARIO), "--deployed"]) == 0
    out = capsys.readouterr().out
    assert "group c: deployed, paced at one update per 0.16 s" in out
    assert "release times padded" in out
