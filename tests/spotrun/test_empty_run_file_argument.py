"""Issue #26: `spotrun validate ""` said run="." (the current directory, which an empty path names) is not a readable
file: the user gave an empty argument, and every command taking a run file now says so, naming it."""

from __future__ import annotations

import json

import pytest

from spotrun.cli.main import main


@pytest.mark.parametrize("command", [["validate"], ["estimate"], ["simulate"], ["local"], ["start", "--stage", "dev"]])
@pytest.mark.parametrize("given", ["", "  "])
def test_an_empty_run_file_argument_is_named_as_empty(capsys, command, given):
    with pytest.raises(SystemExit) as exited:
        main([command[0], given, *command[1:]])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    field = "runs" if command[0] in ("validate", "estimate") else "run"
    assert f'{field}={json.dumps(given)} is invalid: expected a run JSON file\'s path (the argument is empty)' in err
    assert '"."' not in err and "Traceback" not in err, err


def test_the_json_error_names_it_too(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["validate", "--format", "json", ""])
    doc = json.loads(capsys.readouterr().out)
    assert exited.value.code == 2 and doc["error"] == "InvalidArguments", doc
    assert doc["message"].startswith('runs="" is invalid: expected a run JSON file\'s path'), doc
