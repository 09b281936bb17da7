"""Containers without host-specific mounts: the compose file's structure (and ``docker compose
config`` where a Compose v2 binary exists), the image's non-root user and data cache, and the
broker's persistence directory that ``fedsim deploy`` prepares."""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from fedsim.commands import deploy
from fedsim.transports.broker import MOSQUITTO_MISSING, find_mosquitto
from fedsim.transports.security import (
    PROCESS_SECRETS_DIR,
    SERVER_USERNAME,
    aggregator_username,
    process_secrets_name,
)

REPO = Path(__file__).resolve().parents[2]
# Compose specification: project and service names, long-syntax secret keys.
PROJECT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
SERVICE_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$")
TOP_LEVEL = {"name", "services", "networks", "volumes", "secrets", "configs"}
SECRET_KEYS = {"source", "target", "uid", "gid", "mode"}


def _compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text(encoding="utf-8"))


def _generated(tmp_path: Path, ids: list[str]) -> dict:
    text = deploy.compose_text("scenarios/s.yaml", "r", ids, generated_dir="deploy/generated")
    return yaml.safe_load(text)


@pytest.mark.parametrize("source", ["tracked", "generated"])
def test_compose_structure_follows_the_compose_rules(source: str, tmp_path: Path) -> None:
    document = _compose() if source == "tracked" else _generated(tmp_path, ["a-0", "b-1"])
    assert set(document) <= TOP_LEVEL and PROJECT_NAME.match(document["name"])
    services, volumes, secrets = document["services"], document["volumes"], document["secrets"]
    for name, service in services.items():
        assert SERVICE_NAME.match(name), name
        assert set(service.get("depends_on", [])) <= set(services)
        for entry in service.get("secrets", []):
            assert set(entry) <= SECRET_KEYS and entry["source"] in secrets
        for volume in service.get("volumes", []):
            source_part, target, *mode = volume.split(":")
            assert target.startswith("/") and set(mode) <= {"ro", "rw"}
            if source_part.startswith((".", "/", "~")):  # a bind mount: only the broker config
                assert name == "broker" and target == "/mosquitto/config" and mode == ["ro"]
                assert not source_part.startswith(("/", "~", "..")), volume
            else:
                assert source_part in volumes, f"{name}: volume {source_part} is not declared"
    used = {v.split(":")[0] for s in services.values() for v in s.get("volumes", [])}
    assert set(volumes) <= used  # no stray declarations


@pytest.mark.parametrize("source", ["tracked", "generated"])
def test_no_data_from_the_host_and_every_container_non_root(source: str, tmp_path: Path) -> None:
    document = _compose() if source == "tracked" else _generated(tmp_path, ["a-0"])
    text = yaml.safe_dump(document)
    assert "../" not in text and "shared" not in text and "datasets" not in text
    for name, service in document["services"].items():
        uid, gid = (int(part) for part in str(service["user"]).split(":"))
        assert uid != 0 and gid != 0, name
        if name == "broker":
            assert uid == deploy.BROKER_UID and service["image"].startswith("eclipse-mosquitto:2")
            continue
        assert uid == gid == deploy.FEDSIM_UID
        secret, *ca = service["secrets"]
        assert secret["target"] == deploy.CONTAINER_SECRETS
        # With TLS (the tracked file), also the run's CA: a public certificate, as it is.
        assert ca == ([{"source": "fedsim-ca", "target": deploy.CONTAINER_CA}]
                      if source == "tracked" else [])
        assert f"state-{name}:{deploy.CONTAINER_STATE}" in service["volumes"]
    assert f"runs:{deploy.CONTAINER_RUNS}" in document["services"]["server"]["volumes"]


def _username(name: str) -> str:
    """The broker username of the compose service ``name``."""
    if name == "server":
        return SERVER_USERNAME
    return aggregator_username(name) if name.startswith("aggregator-") else name


@pytest.mark.parametrize("source", ["tracked", "generated"])
def test_each_container_gets_its_own_credentials_file_and_no_other(
    source: str, tmp_path: Path
) -> None:
    """Every fedsim service gets one credentials secret, its own per-process file (which
    `fedsim deploy` writes with that process's credentials alone); no secret holds another's,
    and no secret is shared or taken from a variable (that was everyone's secrets.json)."""
    document = _compose() if source == "tracked" else yaml.safe_load(deploy.compose_text(
        "scenarios/s.yaml", "r", ["a-0", "server-1"], aggregators=["aggregator-0"],
        overrides=["aggregators.count=1"]))
    declared, given = document["secrets"], {}
    for name, service in document["services"].items():
        if name == "broker":
            assert "secrets" not in service
            continue
        credentials = [s["source"] for s in service["secrets"] if s["source"] != "fedsim-ca"]
        assert credentials == [f"credentials-{_username(name)}"], name
        given[name] = credentials[0]
        # A file secret, bind-mounted as it is: the header has its user own it (no uid/gid/mode,
        # which Compose ignores for a file, with a warning).
        assert declared[credentials[0]] == {
            "file": f"./deploy/generated/{process_secrets_name(_username(name))}"}, name
        assert set(service["secrets"][0]) == {"source", "target"}
    assert len(set(given.values())) == len(given)  # nobody shares one
    assert set(declared) == set(given.values()) | ({"fedsim-ca"} if source == "tracked" else set())
    assert not any("environment" in secret for secret in declared.values())
    header = (deploy.compose_text("scenarios/s.yaml", "r", ["a-0"]) if source == "generated"
              else (REPO / "docker-compose.yml").read_text(encoding="utf-8"))
    assert (f"sudo chown {deploy.FEDSIM_UID}:{deploy.FEDSIM_UID} "
            f"deploy/generated/{PROCESS_SECRETS_DIR}/*.json\n") in header


def test_the_image_runs_as_that_user_with_data_in_its_cache() -> None:
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8")
    assert f"ARG FEDSIM_UID={deploy.FEDSIM_UID}" in dockerfile
    instructions = [line.split()[0] for line in dockerfile.splitlines()
                    if line and not line[0].isspace() and not line.startswith("#")]
    assert instructions.count("USER") == 1 and "\nUSER fedsim\n" in dockerfile
    after_user = dockerfile.split("\nUSER fedsim\n", 1)[1]
    assert 'fedsim data fetch "$name"' in after_user and "ARG FEDSIM_DATASETS=mnist" in after_user
    # The volumes' mount points exist in the image, owned by the user (so are the volumes).
    assert "mkdir -p /state /runs" in dockerfile and "chown fedsim:fedsim /state /runs" in dockerfile
    assert "shared" not in dockerfile


def _compose_v2() -> list[str] | None:
    for command in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(command[0]) is None:
            continue
        try:
            done = subprocess.run([*command, "version", "--short"], capture_output=True,
                                  text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and done.stdout.strip().lstrip("v").startswith("2."):
            return command
    return None


def test_docker_compose_config_accepts_the_file() -> None:
    command = _compose_v2()
    if command is None:
        pytest.skip("no Docker Compose v2 binary (`docker compose` or `docker-compose`) here")
    done = subprocess.run([*command, "-f", str(REPO / "docker-compose.yml"), "config",
                           "--format", "json"], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    normalised = json.loads(done.stdout)
    for name, service in normalised["services"].items():
        if name == "broker":
            continue
        secret = service["secrets"][0]
        assert secret["target"] == deploy.CONTAINER_SECRETS
        file = Path(normalised["secrets"][secret["source"]]["file"])
        assert file == REPO / "deploy" / "generated" / process_secrets_name(_username(name))
    assert all(v["type"] == "volume" for v in normalised["services"]["server"]["volumes"])


# ----------------------------------------------------------------------- broker persistence
def _deploy(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    deploy.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["deploy", *argv])
    return args.func(args)


def test_deploy_creates_the_persistence_directory_for_the_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert _deploy("--client-id", "a", "--run", "r", "--out", "gen",
                   "--persistence-dir", "broker-data") == 0
    made = tmp_path / "broker-data"
    assert made.is_dir() and made.stat().st_mode & 0o777 == 0o700
    conf = (tmp_path / "gen" / "mosquitto.conf").read_text()
    assert f"persistence_location {made}/" in conf  # absolute: mosquitto's cwd does not matter
    if os.geteuid() == 0:  # a broker started as root writes as its own user
        try:
            expected = pwd.getpwnam("mosquitto").pw_uid
        except KeyError:
            expected = deploy.BROKER_UID
        assert made.stat().st_uid == expected
    else:
        assert made.stat().st_uid == os.geteuid()
    # Not root: the broker runs as the caller, who keeps the directory.
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    other = deploy.prepare_persistence_dir(tmp_path / "as-user")
    assert other.stat().st_uid == os.getuid()
    # Without such a user in the database, the image's uid.
    if os.getuid() == 0:
        monkeypatch.setattr(os, "geteuid", lambda: 0)
        image = deploy.prepare_persistence_dir(tmp_path / "image", broker_user="no-such-user")
        assert (image.stat().st_uid, image.stat().st_gid) == (deploy.BROKER_UID,) * 2
    # Container paths (--broker-config-dir given) are the named volume's business, not made.
    assert _deploy("--client-id", "a", "--run", "r", "--out", "gen2", "--broker-config-dir",
                   "/mosquitto/config", "--persistence-dir", "/mosquitto/data") == 0
    assert not Path("/mosquitto/data").exists() or Path("/mosquitto").is_dir()


def test_a_root_started_broker_persists_into_that_directory() -> None:
    """The real broker, started as root and switching to its user, writes its database there."""
    binary = find_mosquitto()
    if binary is None:
        pytest.skip(MOSQUITTO_MISSING)
    if os.geteuid() != 0:
        pytest.skip("needs root: the broker switches to its own user only when started as root")
    try:
        pwd.getpwnam("mosquitto")
    except KeyError:
        pytest.skip("no `mosquitto` user on this machine for the broker to switch to")

    # Outside pytest's private (0700) tree: the broker's user must reach the directory.
    base = Path(tempfile.mkdtemp(prefix="fedsim-persist-"))
    os.chmod(base, 0o755)
    try:
        _persist_as_root(binary, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _persist_as_root(binary: str, base: Path) -> None:
    from fedsim.transports.broker import free_loopback_port

    data = deploy.prepare_persistence_dir(base / "data")
    conf = base / "m.conf"
    conf.write_text(f"listener {free_loopback_port()} 127.0.0.1\nallow_anonymous true\n"
                    f"persistence true\npersistence_location {data}/\nuser mosquitto\n")
    broker = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(1.0)
        assert broker.poll() is None, broker.stdout.read() if broker.stdout else ""
    finally:
        broker.send_signal(signal.SIGTERM)  # mosquitto saves its database on a clean stop
        output = broker.communicate(timeout=20)[0]
    assert (data / "mosquitto.db").is_file(), output
    assert (data / "mosquitto.db").stat().st_uid == pwd.getpwnam("mosquitto").pw_uid
