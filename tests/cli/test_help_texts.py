"""Every command and option of the ``fedsim`` command line has help in whole sentences,
without markup."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedsim.cli import build_parser, main

MARKUP = re.compile(r"``|`|\*\*|:(class|func|mod|meth|data):|\bpaper \d{3}\b")


def commands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from commands(sub)


def command_helps(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str | None]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                yield f"{parser.prog} {choice.dest}", choice.help


def sentence_problem(text: str | None) -> str | None:
    if text is None or not text.strip():
        return "no help"
    text = " ".join(text.split())
    if MARKUP.search(text):
        return f"markup in {text!r}"
    if not text[0].isupper():
        return f"does not start with a capital letter: {text!r}"
    if not text.endswith(".") or text.endswith("..."):
        return f"is not a whole sentence (no full stop): {text!r}"
    return None


def test_every_option_has_help_in_whole_sentences() -> None:
    problems = []
    for prog, parser in commands(build_parser()):
        problem = sentence_problem(parser.description)
        if problem:
            problems.append(f"{prog} description: {problem}")
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            if action.help == argparse.SUPPRESS:
                continue
            name = "/".join(action.option_strings) or action.dest
            problem = sentence_problem(action.help)
            if problem:
                problems.append(f"{prog} {name}: {problem}")
    for name, text in command_helps(build_parser()):
        problem = sentence_problem(text)
        if problem:
            problems.append(f"{name} (in the command list): {problem}")
    assert not problems, "\n".join(problems)


def test_the_walk_finds_every_command_and_sees_a_missing_help() -> None:
    found = {prog for prog, _ in commands(build_parser())}
    assert {"fedsim run", "fedsim account", "fedsim report", "fedsim launch"} <= found
    parser = argparse.ArgumentParser(prog="probe", description="A probe.")
    parser.add_argument("--bare")
    parser.add_argument("--marked", help="Uses ``markup``.")
    parser.add_argument("--fragment", help="lower case fragment")
    assert sentence_problem(parser._actions[1].help) == "no help"
    assert "markup" in str(sentence_problem(parser._actions[2].help))
    assert "capital" in str(sentence_problem(parser._actions[3].help))


@pytest.mark.parametrize("flags", [["--quiet"], ["--verbose"], ["--log-level", "warning"]])
def test_every_command_takes_the_output_options(flags: list[str]) -> None:
    parser = build_parser()
    for prog, sub in commands(parser):
        if prog == "fedsim" or any(isinstance(a, argparse._SubParsersAction) for a in sub._actions):
            continue
        options = {o for a in sub._actions for o in a.option_strings}
        assert {"--quiet", "--verbose", "--log-level"} <= options, prog


def test_quiet_and_verbose_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["schema", "--quiet", "--verbose"])
    assert exit_info.value.code == 2
    assert "not allowed with" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "command", "unknown"), [
    # a stranger's: only the commands that load a data set take --offline
    (["data", "fetch", "mnist", "--offline"], "data fetch", "--offline"),
    (["run", "scenarios/quickstart.yaml", "--sed", "3"], "run",
     "--sed 3 (did you mean --seed?)"),
    (["sweep", "scenarios/quickstart.yaml", "--grids=a=1"], "sweep",
     "--grids=a=1 (did you mean --grid?)"),
    (["ledger", "check", "x.jsonl", "--bogus"], "ledger check", "--bogus"),
])
def test_an_unknown_argument_is_the_commands_error_with_its_usage(
        argv: list[str], command: str, unknown: str, capsys: pytest.CaptureFixture[str]) -> None:
    """argparse hands an argument a sub-command does not know up to the top-level parser,
    whose usage (``fedsim [-h] [--version] COMMAND ...``) said nothing about the command the
    stranger typed; every command and sub-command now reports it with its own usage, and a
    near miss of one of its options with that option."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"usage: fedsim {command} " in err
    assert f"fedsim {command}: error: unrecognized arguments: {unknown}\n" in err
    assert "COMMAND ..." not in err


def test_report_shows_one_directory_and_points_several_at_compare(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``fedsim report``'s usage read ``DIR [DIR ...]`` for a command that reads one (a
    stranger's review); more directories still get the way to compare them."""
    with pytest.raises(SystemExit):
        main(["report", "--help"])
    usage = capsys.readouterr().out.splitlines()[0]
    assert usage.endswith("] DIR") and "more_dirs" not in usage
    assert main(["report", "a", "b"]) == 2
    assert "`fedsim compare a b`" in capsys.readouterr().err


@pytest.mark.parametrize(("command", "default"), [
    (["deploy"], "deploy/generated"), (["sweep", "s.yaml"], "runs/NAME-sweep")])
def test_an_output_directory_option_says_its_default(
        command: list[str], default: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's `fedsim deploy` wrote into deploy/generated and `fedsim sweep` into
    runs/quickstart-sweep, while their --out help ("The output directory.") said neither."""
    with pytest.raises(SystemExit):
        main([command[0], "--help"])
    assert default in " ".join(capsys.readouterr().out.split())


def test_launch_offers_only_what_it_takes(capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's `fedsim launch --help` said --broker defaults to $FEDSIM_BROKER (launch
    starts its private broker and never reads it) and offered --run, which it always refused
    ("fedsim launch names the run after the scenario"). The server's and the clients' own
    commands keep both."""
    with pytest.raises(SystemExit):
        main(["launch", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(by default a private mosquitto on 127.0.0.1, started and stopped by this " \
        "command; $FEDSIM_BROKER is not read)" in text
    assert "--run" not in text
    for command in ("server", "client", "aggregator"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "(by default $FEDSIM_BROKER)" in text and "--run NAME" in text, command


@pytest.mark.parametrize("timeout", ["0", "-1", "nan"])
def test_launch_refuses_a_timeout_it_cannot_wait(
        tmp_path: Path, timeout: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A stranger's `fedsim launch S --timeout -1` started the broker and every process, then
    gave up at once ("within -1 wall seconds"), leaving a launch's directory behind."""
    out = tmp_path / "run"
    scenario = Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.yaml"
    assert main(["launch", str(scenario), "--out", str(out), "--timeout",
                 timeout]) == 2
    assert f"--timeout must be a positive number of seconds, got {float(timeout)!r}" in \
        capsys.readouterr().err
    assert not out.exists()
