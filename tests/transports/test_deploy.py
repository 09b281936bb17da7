"""`fedsim deploy`: credentials, mosquitto files, ACL, and the docker-compose file."""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import shlex
import stat
from pathlib import Path

import pytest
import yaml

from fedsim.cli import main as cli_main
from fedsim.commands import deploy
from fedsim.errors import ConfigError
from fedsim.transports.security import (
    PARALLEL_HASHING_FROM,
    PBKDF2_ITERATIONS,
    PROCESS_SECRETS_DIR,
    SERVER_USERNAME,
    Credentials,
    PasswordHashing,
    RunSecrets,
    acl_text,
    generate_secrets,
    load_secrets,
    mosquitto_conf_text,
    mosquitto_password_hash,
    password_file_text,
    process_secrets_name,
    write_secrets,
)

REPO = Path(__file__).resolve().parents[2]


def run_deploy(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    deploy.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["deploy", *argv])
    return args.func(args)


def test_deploy_writes_private_secrets_hashes_and_acl(tmp_path: Path) -> None:
    out = tmp_path / "gen"
    assert (
        run_deploy("--client-id", "a-1", "--client-id", "b-2", "--run", "r", "--out", str(out)) == 0
    )
    assert stat.S_IMODE((out / "secrets.json").stat().st_mode) == 0o600
    secrets = load_secrets(out / "secrets.json")
    assert secrets.run == "r" and sorted(secrets.clients) == ["a-1", "b-2"]
    passwords = {c.username: c.password for c in [secrets.server, *secrets.clients.values()]}
    assert len(set(passwords.values())) == 3 and all(len(p) >= 32 for p in passwords.values())
    # Every line is user:$7$iterations$salt$PBKDF2-SHA512(password), checked independently.
    for line in (out / "passwd").read_text().splitlines():
        user, _, hashed = line.partition(":")
        _, kind, iterations, salt, digest = hashed.split("$")
        expected = hashlib.pbkdf2_hmac(
            "sha512", passwords.pop(user).encode(), base64.b64decode(salt), int(iterations)
        )
        assert kind == "7" and base64.b64decode(digest) == expected
    assert passwords == {}
    acl = (out / "acl").read_text()
    assert "user a-1\ntopic write fedsim/r/updates/a-1\ntopic write fedsim/r/status/a-1\n" in acl
    assert "topic read fedsim/r/global\ntopic read fedsim/r/acks/a-1\n" in acl
    assert "fedsim/r/updates/b-2" not in acl.split("user b-2")[0].split("user a-1")[1]
    conf = (out / "mosquitto.conf").read_text()
    assert "allow_anonymous false" in conf and f"acl_file {out.resolve()}/acl" in conf


def test_deploy_writes_one_secrets_file_a_process_holding_its_own_alone(tmp_path: Path) -> None:
    """secrets/<username>.json: one a process, mode 0600, that process's credentials and not
    one other password (every file parsed, and searched for every other password)."""
    out = tmp_path / "gen"
    argv = ["--client-id", "a-1", "--client-id", "b-2", "--run", "r", "--aggregators", "1",
            "--out", str(out), "--plain"]
    assert run_deploy(*argv) == 0
    everyone = load_secrets(out / "secrets.json")
    users = [everyone.for_server(), *everyone.clients.values(), *everyone.aggregators.values()]
    folder = out / PROCESS_SECRETS_DIR
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{u.username}.json" for u in users)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for user in users:
        path = out / process_secrets_name(user.username)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        text = path.read_text()
        assert user.password in text
        others = [u.password for u in users if u is not user]
        assert not any(password in text for password in others), path  # nobody else's
        alone = load_secrets(path)
        held = [alone.server, *alone.clients.values(), *alone.aggregators.values()]
        assert alone.run == "r" and [c for c in held if c is not None] == [user], path
    assert load_secrets(folder / "a-1.json").for_client("a-1") == everyone.for_client("a-1")
    assert load_secrets(folder / "fedsim-server.json").for_server() == everyone.for_server()
    assert load_secrets(folder / "fedsim-aggregator-0.json").for_aggregator("aggregator-0") == \
        everyone.for_aggregator("aggregator-0")
    # A later deploy without b-2 (and its aggregator): their old files are gone, the rest new.
    assert run_deploy("--client-id", "a-1", "--run", "r", "--out", str(out), "--plain") == 0
    assert sorted(p.name for p in folder.iterdir()) == ["a-1.json", "fedsim-server.json"]
    assert load_secrets(folder / "a-1.json").for_client("a-1") == \
        load_secrets(out / "secrets.json").for_client("a-1") != everyone.for_client("a-1")


def test_deploy_refuses_a_linked_or_shared_secrets_folder(tmp_path: Path) -> None:
    """A reviewer planted DIR/secrets -> another folder: deploy deleted its *.json (as an
    earlier run's stale files) and wrote the credentials there. A folder others may write
    was left 0777, and the broker's configuration 0666 under a umask of 000."""
    argv = ["--client-id", "a-1", "--run", "r", "--plain"]
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "important.json").write_text('{"precious": 1}')
    out = tmp_path / "linked"
    out.mkdir()
    (out / PROCESS_SECRETS_DIR).symlink_to(victim)
    with pytest.raises(ConfigError, match="not a directory"):
        run_deploy(*argv, "--out", str(out))
    assert sorted(p.name for p in victim.iterdir()) == ["important.json"]
    assert not (out / "secrets.json").exists()
    shared = tmp_path / "shared"
    (shared / PROCESS_SECRETS_DIR).mkdir(parents=True)
    (shared / PROCESS_SECRETS_DIR).chmod(0o777)
    previous = os.umask(0)
    try:
        assert run_deploy(*argv, "--out", str(shared)) == 0
    finally:
        os.umask(previous)
    assert stat.S_IMODE((shared / PROCESS_SECRETS_DIR).stat().st_mode) == 0o700
    assert stat.S_IMODE((shared / "mosquitto.conf").stat().st_mode) == 0o644


def test_a_per_process_file_answers_only_for_its_own_process(tmp_path: Path) -> None:
    """Asking a per-process file for another process's credentials is a ConfigError that
    names the file and the role asked for, not a KeyError."""
    run_secrets = generate_secrets("r", ["a-1", "b-2"], ["aggregator-0"])
    files = run_secrets.per_process()
    for name, one in files.items():
        write_secrets(tmp_path / name, one)
    mine = load_secrets(tmp_path / process_secrets_name("a-1"))
    assert mine.for_client("a-1") == run_secrets.for_client("a-1") and mine.server is None
    path = tmp_path / process_secrets_name("a-1")
    for ask, whose in ((lambda: mine.for_server(), "the server"),
                       (lambda: mine.for_client("b-2"), "client 'b-2'"),
                       (lambda: mine.for_aggregator("aggregator-0"), "aggregator 'aggregator-0'")):
        with pytest.raises(ConfigError) as refused:
            ask()
        message = str(refused.value)
        assert str(path) in message and f"no credentials for {whose}" in message
        assert "it is client 'a-1''s own file" in message
    server = load_secrets(tmp_path / process_secrets_name(SERVER_USERNAME))
    with pytest.raises(ConfigError, match="no credentials for client 'a-1'"):
        server.for_client("a-1")
    empty = tmp_path / "empty.json"
    empty.write_text('{"run": "r"}')
    with pytest.raises(ConfigError, match="holds no credentials"):
        load_secrets(empty)


@pytest.mark.parametrize(
    ("ids", "aggregators", "message"),
    [
        (["../evil"], (), "MQTT topics"),
        (["a/../../evil"], (), "MQTT topics"),
        ([".hidden"], (), "MQTT topics"),
        (["a-1"], ["../evil"], "MQTT topics"),
        (["Phone-1", "phone-1"], (), "case-insensitive"),
    ],
)
def test_no_id_names_a_secrets_file_outside_its_folder_or_shares_one(
    tmp_path: Path, ids: list[str], aggregators: list[str], message: str
) -> None:
    from fedsim.transports.security import write_broker_files

    out = tmp_path / "deep" / "gen"
    with pytest.raises(ConfigError, match=message):
        write_broker_files(out, "r", ids, aggregators=aggregators, per_process=True)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # nothing written anywhere


def _hashed_users(text: str, passwords: dict[str, str]) -> list[tuple[str, int]]:
    """Each line's user and iteration count, its hash checked independently of fedsim."""
    seen = []
    for line in text.splitlines():
        user, _, hashed = line.partition(":")
        _, kind, iterations, salt, digest = hashed.split("$")
        expected = hashlib.pbkdf2_hmac(
            "sha512", passwords[user].encode(), base64.b64decode(salt), int(iterations)
        )
        assert kind == "7" and base64.b64decode(digest) == expected, user
        seen.append((user, int(iterations)))
    return seen


def test_deploy_hashes_at_the_default_count_or_the_one_asked(tmp_path: Path) -> None:
    for argv, count in (((), PBKDF2_ITERATIONS), (("--pbkdf2-iterations", "2500"), 2500)):
        out = tmp_path / str(count)
        assert run_deploy("--client-id", "a", "--run", "r", "--out", str(out), *argv) == 0
        secrets = load_secrets(out / "secrets.json")
        passwords = {c.username: c.password for c in [secrets.server, *secrets.clients.values()]}
        seen = _hashed_users((out / "passwd").read_text(), passwords)
        assert {n for _, n in seen} == {count} and len(seen) == 2
    for bad in ("0", "2147483648"):  # OpenSSL refuses 2^31 with an OverflowError
        with pytest.raises(ConfigError, match="--pbkdf2-iterations must be between 1 and"):
            run_deploy("--client-id", "a", "--run", "r", "--out", str(tmp_path / bad),
                       "--pbkdf2-iterations", bad)
        assert not (tmp_path / bad).exists()  # refused before anything is written


@pytest.mark.parametrize("listener", [["--plain"], []])  # [] : TLS, the default
def test_an_interrupted_or_refused_deploy_leaves_the_earlier_files_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listener: list[str]
) -> None:
    from fedsim.transports import security

    out = tmp_path / "gen"
    assert run_deploy("--client-id", "a", "--run", "r", "--out", str(out), *listener) == 0
    names = sorted(str(p.relative_to(out)) for p in out.rglob("*"))  # secrets/ too
    assert ("ca.crt" in names) == (not listener) and "secrets/a.json" in names
    before = {name: (out / name).read_bytes() for name in names if (out / name).is_file()}
    (out / "secrets.json").chmod(0o644)  # widened by someone: rewritten 0600 from creation

    def interrupted(*_args: object, **_kwargs: object) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(security, "mosquitto_password_hash", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_deploy("--client-id", "a", "--run", "r", "--out", str(out), *listener)
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="repeated"):
        run_deploy("--client-id", "a", "--client-id", "a", "--run", "r", "--out", str(out),
                   *listener)
    assert {name: (out / name).read_bytes() for name in before} == before
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == names  # no temporary file
    assert run_deploy("--client-id", "a", "--run", "r", "--out", str(out), *listener) == 0
    assert stat.S_IMODE((out / "secrets.json").stat().st_mode) == 0o600
    assert (out / "secrets.json").read_bytes() != before["secrets.json"]
    fresh = tmp_path / "fresh"
    with pytest.raises(ConfigError, match="repeated"):
        run_deploy("--client-id", "a", "--client-id", "a", "--run", "r", "--out", str(fresh),
                   *listener)
    assert not fresh.exists() or not list(fresh.iterdir())


def test_duplicate_client_ids_are_found_in_linear_time() -> None:
    ids = [f"c{i}" for i in range(200_000)] + ["c7", "c7", "c99"]
    with pytest.raises(ConfigError, match=r"repeated: \['c7', 'c99'\]"):
        generate_secrets("r", ids)


def test_many_users_hash_on_threads_in_order_and_report_progress(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fedsim.transports import security

    monkeypatch.setattr(security, "HASHING_CHUNK", 7)  # many chunks, on several threads
    ids = [f"c{i:03d}" for i in range(PARALLEL_HASHING_FROM + 37)]
    run_secrets = generate_secrets("r", ids, ["aggregator-0"])
    extra = Credentials("fedsim-observer", "watching")
    told: list[int] = []
    text = password_file_text(run_secrets, hashing=PasswordHashing(7, told.append), extra=[extra])
    users = [run_secrets.server, *run_secrets.clients.values(),
             *run_secrets.aggregators.values(), extra]
    passwords = {u.username: u.password for u in users}
    seen = _hashed_users(text, passwords)
    assert [u for u, _ in seen] == [u.username for u in users]  # the order the file had
    assert {n for _, n in seen} == {7} and sum(told) == len(users)
    assert len(told) > 1 and max(told) <= 7  # in chunks, each told once it is joined
    for bad in (0, security.MAX_PBKDF2_ITERATIONS + 1, True):
        with pytest.raises(ConfigError, match="between 1 and"):
            password_file_text(run_secrets, hashing=PasswordHashing(bad))


def test_deploy_tls_flags_configure_the_listener(tmp_path: Path) -> None:
    out = tmp_path / "gen"
    argv = ["--client-id", "a", "--run", "r", "--out", str(out), "--port", "8883"]
    assert run_deploy(*argv, "--tls-cert", "/certs/srv.crt", "--tls-key", "/certs/srv.key") == 0
    conf = (out / "mosquitto.conf").read_text()
    assert "listener 8883 0.0.0.0\ncertfile /certs/srv.crt\nkeyfile /certs/srv.key\n" in conf


def test_password_hash_matches_mosquitto_passwd_format() -> None:
    # The documented format: $7$<iterations>$<base64 12-byte salt>$<base64 64-byte key>.
    salt = bytes(range(12))
    hashed = mosquitto_password_hash("secret", salt=salt, iterations=101)
    assert hashed.startswith("$7$101$AAECAwQFBgcICQoL$")
    assert len(base64.b64decode(hashed.split("$")[-1])) == 64


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--client-id", "a"], "needs --run"),
        (["--client-id", "a/b", "--run", "r"], "MQTT topics"),
        (["--client-id", "a", "--client-id", "a", "--run", "r"], "unique"),
        (["--client-id", "fedsim-server", "--run", "r"], "reserved"),
        (["--client-id", "a", "--run", "r#"], "run name"),
        (["--client-id", "a", "--run", "r", "--port", "70000"], "not a TCP port"),
        ([], "give a SCENARIO"),
        (["--client-id", "a", "--run", "r", "--compose", "x.yml"], "needs a SCENARIO"),
        (["--client-id", "a", "--run", "r", "--tls-cert", "c.pem"], "go together"),
    ],
)
def test_deploy_rejects_bad_input_with_a_clear_error(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        run_deploy(*argv, "--out", str(tmp_path / "gen"))


def test_committed_broker_files_are_what_deploy_generates() -> None:
    conf = mosquitto_conf_text(
        port=1883,
        bind_address="0.0.0.0",
        password_file="/mosquitto/config/passwd",
        acl_file="/mosquitto/config/acl",
        persistence_dir="/mosquitto/data",
    )
    assert (REPO / "deploy" / "mosquitto.conf").read_text() == conf
    example = RunSecrets(
        "example",
        Credentials("fedsim-server", "-"),
        {c: Credentials(c, "-") for c in ("phone-000", "laptop-000")},
    )
    assert (REPO / "deploy" / "acl.example").read_text() == acl_text(example)


# ------------------------------------------------------------------------------- compose


def _compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_deploy_readme_makes_what_the_committed_compose_file_runs() -> None:
    """deploy/README.md's commands make the credentials and the compose file that the
    committed docker-compose.yml was made with (its header says how): a README without the
    compose file's settings (aggregators.count=2) gives secrets with no aggregator in them,
    and every aggregator container exits."""
    compose = (REPO / "docker-compose.yml").read_text(encoding="utf-8")
    first = next(line for line in compose.splitlines() if line.startswith("# First: "))
    made_with = shlex.split(first.removeprefix("# First: "))
    readme = (REPO / "deploy" / "README.md").read_text(encoding="utf-8")
    commands = [shlex.split(command, comments=True)
                for command in readme.replace("\\\n", " ").splitlines()
                if command.startswith("fedsim deploy ") and "/mosquitto/config" in command]
    assert len(commands) == 2  # Docker Compose's: the credentials, and the compose file
    for command in commands:
        if "--compose" in command:
            at = command.index("--compose")
            command = command[:at] + command[at + 2:]
        assert command == made_with, (command, made_with)


def test_compose_file_is_current_and_has_one_service_per_client() -> None:
    from fedsim.config import load_scenario
    from fedsim.runtime.population import client_ids
    from fedsim.transports.topics import aggregator_ids

    scenario = load_scenario(REPO / "scenarios" / "quickstart.yaml").scenario
    ids = client_ids(scenario)
    # As `fedsim deploy --aggregators 2` writes it by default: TLS on port 8883, the run's CA
    # a secret, two aggregation nodes.
    aggregators = aggregator_ids(2)
    regenerated = deploy.compose_text(
        "scenarios/quickstart.yaml", scenario.name, ids, port=8883, tls_ca=True,
        overrides=["aggregators.count=2"], aggregators=aggregators,
    )
    assert (REPO / "docker-compose.yml").read_text() == regenerated, (
        "docker-compose.yml is stale: regenerate it (see deploy/README.md)"
    )
    services = _compose()["services"]
    assert list(services) == ["broker", "server", *ids, *aggregators]
    for name in aggregators:  # each its own process, state volume and the same count
        command = services[name]["command"]
        assert command[:2] == ["fedsim", "aggregator"] and name in command
        assert "aggregators.count=2" in command and "aggregators.count=2" in \
            services["server"]["command"]
    assert services["broker"]["image"].startswith("eclipse-mosquitto:2")
    volumes = {v.split(":")[0] for s in services.values() for v in s.get("volumes", [])}
    assert {f"state-{c}" for c in ids} | {"state-server"} <= volumes  # a state volume each


def test_every_compose_command_is_a_valid_fedsim_invocation() -> None:
    from fedsim.cli import build_parser

    parser = build_parser()
    services = _compose()["services"]
    roles = {}
    for name, service in services.items():
        if name == "broker":
            continue
        command = service["command"]
        assert command[0] == "fedsim", shlex.join(command)
        args = parser.parse_args(command[1:])
        roles[name] = args.command
        assert args.broker == "mqtts://broker:8883" and args.secrets == deploy.CONTAINER_SECRETS
        assert args.tls_ca == deploy.CONTAINER_CA
        if args.command == "client":
            assert args.client_id == name
        if args.command == "aggregator":
            assert args.aggregator_id == name
        # The state directory is in the service's own volume, so the ledger survives the
        # container (the volume is mounted at /state, a directory the image's user owns).
        assert f"state-{name}:{deploy.CONTAINER_STATE}" in service["volumes"]
        assert args.state == f"{deploy.CONTAINER_STATE}/{name}"
    assert roles.pop("server") == "server"
    assert set(roles.values()) == {"client", "aggregator"}


def test_compose_commands_match_what_fedsim_launch_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedsim.runtime.deployed import launcher as launcher_module
    from fedsim.runtime.deployed.launcher import Launcher
    from fedsim.runtime.deployed.options import LAUNCH_WAIT_FOR_CLIENTS, DeploymentOptions

    # The command lines are the point here, not the data set the launcher finds first.
    monkeypatch.setattr(launcher_module, "dataset_file", lambda *args, **kwargs: None)

    from fedsim.config import load_scenario
    from fedsim.runtime.population import client_ids
    from fedsim.transports.security import write_broker_files
    from fedsim.transports.topics import aggregator_ids

    # (a launch with a broker of its own checks the file holds every process's credentials)
    scenario = load_scenario(REPO / "scenarios" / "quickstart.yaml").scenario
    files = write_broker_files(tmp_path / "gen", scenario.name, client_ids(scenario),
                               aggregators=aggregator_ids(2))
    launcher = Launcher(
        REPO / "scenarios" / "quickstart.yaml",
        tmp_path / "run",
        options=DeploymentOptions(
            broker="mqtts://broker:8883",
            secrets_file=str(files.secrets_file),
            tls_ca=str(tmp_path / "ca.crt"),
            wait_for_clients=LAUNCH_WAIT_FOR_CLIENTS,
        ),
        overrides=["aggregators.count=2"],  # as the tracked compose file was made
    )
    launcher.prepare()
    services = _compose()["services"]
    # Same options and values, except the paths that differ between a container and a host.
    paths = {"--scenario", "--secrets", "--tls-ca", "--state", "--out"}

    def options(argv: list[str]) -> dict[str, str | None]:
        found: dict[str, str | None] = {}
        for index, token in enumerate(argv):
            if token.startswith("--"):
                following = argv[index + 1] if index + 1 < len(argv) else None
                value = None if following is None or following.startswith("--") else following
                found[token] = "<path>" if token in paths else value
        return found

    assert set(launcher.processes) == set(services) - {"broker"}
    for name, process in launcher.processes.items():
        launched, composed = process.argv, services[name]["command"][1:]
        assert launched[0] == composed[0]
        expected = options(launched)
        if name == "server":
            expected["--wait-for-clients"] = repr(deploy.COMPOSE_WAIT_FOR_CLIENTS)
        # The launcher's processes read the resolved scenario (the count in it); the
        # containers read the image's and get the count as an override.
        expected["--set"] = "aggregators.count=2"
        assert options(composed) == expected


@pytest.mark.slow
def test_compose_written_outside_the_clone_builds_from_the_clone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Paths in the compose file are relative to it: the build context is the clone and the
    containers' scenario path is the one inside the image, wherever the file is written."""
    monkeypatch.chdir(tmp_path)
    compose = tmp_path / "elsewhere" / "compose.yml"
    compose.parent.mkdir()
    status = cli_main(["deploy", str(REPO / "scenarios" / "quickstart.yaml"), "--out",
                       str(tmp_path / "generated"), "--compose", str(compose)])
    assert status == 0
    services = yaml.safe_load(compose.read_text())["services"]
    assert (compose.parent / services["server"]["build"]).resolve() == REPO.resolve()
    command = services["server"]["command"]
    assert command[command.index("--scenario") + 1] == "scenarios/quickstart.yaml"
    broker_config = services["broker"]["volumes"][0].split(":")[0]
    assert (compose.parent / broker_config).resolve() == (tmp_path / "generated").resolve()


@pytest.mark.slow
def test_compose_writes_the_brokers_files_where_its_container_sees_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's `fedsim deploy S --out gen --compose F` (this module's docstring's command)
    wrote a mosquitto.conf naming gen/'s paths on the host; the composed broker mounts gen/ at
    /mosquitto/config and could not open its password file. --compose now puts the files where
    the container sees them, and its persistence in the broker-data volume; given
    directories are kept."""
    compose = tmp_path / "compose.yml"
    assert cli_main(["deploy", str(REPO / "scenarios" / "quickstart.yaml"), "--out",
                     str(tmp_path / "gen"), "--compose", str(compose)]) == 0
    conf = (tmp_path / "gen" / "mosquitto.conf").read_text()
    # (no host command for a broker whose paths are the container's)
    assert "mosquitto -c" not in capsys.readouterr().out
    assert "password_file /mosquitto/config/passwd" in conf
    assert "acl_file /mosquitto/config/acl" in conf
    assert "certfile /mosquitto/config/broker.crt" in conf
    assert "persistence_location /mosquitto/data/" in conf
    assert str(tmp_path) not in conf
    broker = yaml.safe_load(compose.read_text())["services"]["broker"]
    assert broker["volumes"] == ["./gen:/mosquitto/config:ro", "broker-data:/mosquitto/data"]
    assert cli_main(["deploy", str(REPO / "scenarios" / "quickstart.yaml"), "--out",
                     str(tmp_path / "own"), "--compose", str(compose),
                     "--broker-config-dir", "/etc/broker"]) == 0
    assert "password_file /etc/broker/passwd" in (tmp_path / "own" / "mosquitto.conf").read_text()


@pytest.mark.slow
def test_the_printed_commands_run_the_scenario_the_files_were_made_for(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's `fedsim deploy S --aggregators 2 --set stop.windows=20` printed server and
    client commands without either setting (the processes would run another scenario than
    the broker's files were made for: flat, to another stop) and no aggregator's command."""
    from fedsim.cli import build_parser

    out = tmp_path / "gen"
    assert cli_main(["deploy", str(REPO / "scenarios" / "quickstart.yaml"), "--out", str(out),
                     "--aggregators", "2", "--set", "stop.windows=20"]) == 0
    printed = capsys.readouterr().out
    lines = {line.split(":", 1)[0]: line.split(":", 1)[1].split("  (")[0].strip()
             for line in printed.splitlines() if line.startswith(("server:", "client:",
                                                                    "aggregator:"))}
    assert set(lines) == {"server", "client", "aggregator"}
    assert "(ID: aggregator-0, aggregator-1)" in printed
    parser = build_parser()
    for role, line in lines.items():
        ids = {"client": "phone-000", "aggregator": "aggregator-0"}
        argv = shlex.split(line.replace("ID", ids.get(role, "ID")))
        assert argv[:2] == ["fedsim", role]
        args = parser.parse_args(argv[1:])
        assert args.overrides == ["stop.windows=20", "aggregators.count=2"], role
        assert Path(args.secrets).is_file(), (role, args.secrets)


@pytest.mark.slow
def test_compose_refuses_a_scenario_the_image_does_not_hold(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    own = tmp_path / "mine.yaml"
    own.write_text((REPO / "scenarios" / "quickstart.yaml").read_text())
    status = cli_main(["deploy", str(own), "--out", str(tmp_path / "generated"),
                       "--compose", str(tmp_path / "compose.yml")])
    assert status == 2
    assert "copy the scenario" in capsys.readouterr().err
    assert not (tmp_path / "generated").exists() and not (tmp_path / "compose.yml").exists()


def test_a_launchs_private_broker_writes_no_second_copy_of_the_passwords(tmp_path: Path) -> None:
    """Per-process files are for processes on machines or containers of their own (fedsim
    deploy); a launch's private broker, whose processes all read secrets.json as one user,
    writes no second copy of every password."""
    from fedsim.transports.security import write_broker_files

    files = write_broker_files(tmp_path / "launch", "r", ["a-1", "b-2"])
    assert files.secrets_file.is_file() and not files.process_secrets_dir.exists()
    files = write_broker_files(tmp_path / "deploy", "r", ["a-1", "b-2"], per_process=True)
    assert sorted(p.name for p in files.process_secrets_dir.iterdir()) == [
        "a-1.json", "b-2.json", "fedsim-server.json"]


@pytest.mark.parametrize("plain", [False, True], ids=["tls", "plain"])
def test_deploy_again_into_the_same_out_says_it_replaced_the_credentials(
        plain: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger ran ``fedsim deploy`` a second time into the same --out (to add
    --compose): every password and the CA were new and nothing said so, so the broker and the
    processes given the first files could no longer meet. The second run says so."""
    out = tmp_path / "gen"
    argv = ["--client-id", "a-1", "--run", "r", "--out", str(out), *(["--plain"] if plain else [])]
    assert run_deploy(*argv) == 0
    assert "REPLACED" not in capsys.readouterr().out
    first = load_secrets(out / "secrets.json").clients["a-1"].password
    ca = None if plain else (out / "ca.crt").read_bytes()
    assert run_deploy(*argv) == 0
    printed = capsys.readouterr().out
    assert load_secrets(out / "secrets.json").clients["a-1"].password != first
    replaced = [line.strip() for line in printed.splitlines() if "REPLACED" in line]
    if plain:
        assert replaced == [f"REPLACED: {out} held a deployment's credentials; every password "
                            "is new: restart the broker with these files and give every "
                            "process its new secrets file"]
    else:
        assert (out / "ca.crt").read_bytes() != ca
        assert replaced == [f"REPLACED: {out} held a deployment's credentials; every password "
                            "and the CA are new: restart the broker with these files and give "
                            "every process its new secrets file and ca.crt"]
