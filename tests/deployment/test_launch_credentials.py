"""``fedsim launch --broker URL --secrets FILE`` checks the file before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedsim.config import load_scenario
from fedsim.errors import ConfigError
from fedsim.runtime.deployed.launcher import Launcher
from fedsim.runtime.deployed.options import DeploymentOptions
from fedsim.runtime.population import client_ids
from fedsim.transports.security import SERVER_USERNAME, write_broker_files

SCENARIO = Path(__file__).with_name("four_clients.yaml")


def test_a_secrets_file_without_every_processs_credentials_is_refused_at_once(
        tmp_path: Path) -> None:
    """A stranger's launch with the server's own secrets file (secrets/fedsim-server.json)
    started every process; each client exited at once, naming the file in its log, and the
    launcher waited out its --timeout (3600 s by default) for a server whose clients never
    came. The file is now checked before anything starts, as is its run."""
    scenario = load_scenario(SCENARIO).scenario
    files = write_broker_files(tmp_path / "gen", scenario.name, client_ids(scenario),
                               per_process=True)

    def launcher(secrets: Path, out: str, broker: str = "mqtt://127.0.0.1:1883") -> Launcher:
        return Launcher(SCENARIO, tmp_path / out,
                        options=DeploymentOptions(broker=broker, secrets_file=str(secrets)))

    with pytest.raises(ConfigError, match="holds no credentials for client .*it is the server's "
                                          "own file"):
        launcher(files.process_secrets_file(SERVER_USERNAME), "a")
    other = write_broker_files(tmp_path / "other", "another-run", client_ids(scenario))
    with pytest.raises(ConfigError, match=f"is for run 'another-run', not '{scenario.name}'"):
        launcher(other.secrets_file, "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    # Every process's: taken; a URL with user:password needs no file.
    launcher(files.secrets_file, "c")
    launcher(files.process_secrets_file(SERVER_USERNAME), "d", "mqtt://u:p@127.0.0.1:1883")
