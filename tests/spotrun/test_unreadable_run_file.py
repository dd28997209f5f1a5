"""Issue #26: a run file that cannot be read is said in the project's words by every command that reads one (the
one loader, spotrun/contract/runfile.py), not in the operating system's ('No such file or directory': a new user's
`spotrun simulate missing.json`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from spotrun.cli.main import main

ROOT = Path(__file__).parents[2]


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


def test_a_fifo_nobody_writes_to_is_refused_at_once_not_waited_on(tmp_path):
    """`mkfifo fifo.json; spotrun validate fifo.json` hung (open waits for a writer): now it reads as empty. Run in
    a child process with a timeout, so that a hang fails the test instead of stopping the suite."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "spotrun", "validate", str(fifo)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}"
                                                     f"{os.environ.get('PYTHONPATH', '')}"})
    assert done.returncode == 2 and "the file is empty" in done.stdout + done.stderr, done


def test_a_run_piped_in_is_read(capsys):
    """The other use of a pipe: `cat run.json | spotrun validate /dev/stdin` - its writer's bytes, delivered in
    pieces, are the run (the writer holds the pipe open before the reader opens it, as a shell's pipe does)."""
    text = (ROOT / "examples/runs/qwen2-0.5b-full-small.json").read_bytes()
    read_end, write_end = os.pipe()

    def write():
        with os.fdopen(write_end, "wb") as out:
            for i in range(0, len(text), 100):
                out.write(text[i:i + 100])
                out.flush()
                time.sleep(0.01)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        assert main(["validate", "--format", "json", f"/dev/fd/{read_end}"]) == 0, capsys.readouterr()
    finally:
        writer.join(timeout=30)
        os.close(read_end)
    assert not writer.is_alive()
