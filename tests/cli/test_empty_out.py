"""``--out ""`` fell back silently to the default directory (a stranger's review): an empty
path is refused, as the flag, in one line."""

from __future__ import annotations

import pytest

from fedsim.cli import main


@pytest.mark.parametrize("command", ["run", "sweep", "launch", "server"])
def test_an_empty_out_is_refused(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, "scenario.yaml", "--out", ""])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --out: an empty path names no directory" in err
    assert "Traceback" not in err
