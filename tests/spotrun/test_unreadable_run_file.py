"""Issue #26: a run file that cannot be read is said in the project's words by every command that reads one (the
one loader, spotrun/contract/runfile.py), not in the operating system's ('No such file or directory': a new user's
`spotrun simulate missing.json`)."""

from __future__ import annotations

import json

import pytest

from spotrun.cli.main import main


@pytest.mark.parametrize("command", ["validate", "estimate", "simulate"])
def test_a_missing_run_file_is_said_to_be_missing(command, tmp_path, capsys):
    path = tmp_path / "missing.json"
    assert main([command, "--format", "json", str(path)]) != 0
    doc = json.loads(capsys.readouterr().out)
    message = doc["message"]
    assert message.startswith("run=") and message.endswith(  # the path's middle is elided past a length
        "missing.json\" is invalid: expected a readable file (nothing is there)"), doc
    assert doc.get("field") == "run", doc


def test_a_directory_given_as_the_run_file_is_said_to_be_one(tmp_path, capsys):
    assert main(["estimate", "--format", "json", str(tmp_path)]) != 0
    message = json.loads(capsys.readouterr().out)["message"]
    assert message.endswith("expected a readable file (it is a directory)"), message
    assert "Errno" not in message and "Is a directory" not in message, message


def test_a_path_through_a_file_is_said_in_words(tmp_path, capsys):
    (tmp_path / "f").write_text("{}")
    assert main(["validate", "--format", "json", str(tmp_path / "f" / "run.json")]) != 0
    message = json.loads(capsys.readouterr().out)["message"]
    assert message.endswith("(a part of the path is a file, not a directory)"), message
