"""Raw text is tokenized once (issue #30: `spotrun estimate` prepared it beside the run file, then `spotrun local`
prepared it again under --out): `local` reuses the estimate's shards when their content key (the inputs' bytes,
every tokenizer file, the options; recorded in the dataset's marker) is this run's, prepares otherwise, and says
which."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from spotrun.cli.main import main
from spotrun.local.pipeline import prepare_if_raw, prepared_beside
from spotrun.seams import PREPARE_MARKER


def _run_dir(tmp_path, assets) -> tuple:
    """A run file beside a copy of the raw corpus (the run's own data, so a test may edit it)."""
    corpus = tmp_path / "corpus"
    shutil.copytree(assets["corpus"].parent, corpus)
    run = {"version": 1, "name": "once", "model": {"source": str(assets["model"])},
           "data": {"source": "corpus", "seq_len": 64}, "compute": {"instance_type": "ml.g5.xlarge"},
           "budget": {"max_usd": 5}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    return path, corpus


def _local_until_planned(tmp_path, capsys, path) -> str:
    """`spotrun local` up to its plan (an interruption past the run's last step is refused there): its output."""
    code = main(["local", str(path), "--out", str(tmp_path / "out"), "--interrupt-at", "99999", "--progress",
                 "none"])
    captured = capsys.readouterr()
    assert code == 2 and "--interrupt-at=99999 is invalid" in captured.err, captured.err
    return captured.out


def test_local_reuses_the_shards_the_estimate_prepared_beside_the_run_file(tmp_path, assets, capsys):
    path, _ = _run_dir(tmp_path, assets)
    assert main(["estimate", str(path), "--format", "json"]) == 0
    capsys.readouterr()
    (shards,) = [p for p in prepared_beside(path).iterdir() if p.is_dir()]
    before = (shards / "index.json").stat().st_mtime_ns
    out = _local_until_planned(tmp_path, capsys, path)
    assert f"[local] raw text: reused the shards in {shards} (prepared before from the same inputs, tokenizer " \
           f"and settings: content key {shards.name}); nothing tokenized" in out, out
    assert "[prepare]" not in out and not (tmp_path / "out" / "prepared").exists()
    assert (shards / "index.json").stat().st_mtime_ns == before


def test_other_bytes_or_a_dataset_whose_key_differs_are_prepared_again_and_said_so(tmp_path, assets, capsys):
    path, corpus = _run_dir(tmp_path, assets)
    raw = {"model": {"source": str(assets["model"])}, "data": {"source": str(corpus)}}
    beside = prepared_beside(path)
    first, how = prepare_if_raw(raw, beside, emit=lambda _: None)  # what the estimate does
    assert how == "prepared"
    again, how = prepare_if_raw(raw, tmp_path / "out" / "prepared", emit=lambda _: None, also=(beside,))
    assert (again, how) == (first, "reused")
    # the same directory name, but its marker holds another key: not proof of these shards
    marker = Path(first["data"]["source"]) / PREPARE_MARKER
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "key": "0" * 24}))
    redone, how = prepare_if_raw(raw, tmp_path / "out" / "prepared", emit=lambda _: None, also=(beside,))
    assert how == "prepared" and redone["data"]["source"].startswith(str(tmp_path / "out" / "prepared"))
    # edited text: another key, prepared again, and the line says where it looked
    doc = next(corpus.iterdir())
    doc.write_text(doc.read_text() + json.dumps({"text": "one more document"}) + "\n")
    out = _local_until_planned(tmp_path, capsys, path)
    assert "[local] raw text: prepared into " in out and f"settings in {tmp_path / 'out' / 'prepared'} or " \
           f"{beside}" in out, out


def test_estimate_and_simulate_reuse_the_shards_local_prepared_under_its_default_out(tmp_path, assets, capsys,
                                                                                   monkeypatch):
    """`spotrun local` (default --out ./runs) prepares the raw text into runs/prepared/<key>; `spotrun estimate` and
    `spotrun simulate` on the same run file then plan on those shards, tokenizing nothing and writing no prepared/
    beside the run file (they prepared it again there before: the text tokenized twice)."""
    path, _ = _run_dir(tmp_path, assets)
    monkeypatch.chdir(tmp_path)
    code = main(["local", str(path), "--interrupt-at", "99999", "--progress", "none"])  # up to its plan
    captured = capsys.readouterr()
    assert code == 2 and "[local] raw text: prepared into " in captured.out, captured
    (shards,) = [p for p in (tmp_path / "runs" / "prepared").iterdir() if p.is_dir()]
    before = (shards / "index.json").stat().st_mtime_ns
    for command in (["estimate", str(path), "--format", "json"],
                    ["simulate", str(path), "--n", "5", "--no-optimum", "--format", "json",
                     "--out", str(tmp_path / "sim")]):
        assert main(command) == 0, command
        captured = capsys.readouterr()
        assert "[prepare]" not in captured.err and not prepared_beside(path).exists(), (command, captured.err)
        if command[0] == "estimate":
            checked = json.loads(captured.out)["checked"]
            assert f"raw data.source reused as shards in {shards} (what `spotrun local` trains on)" in checked, checked
    assert (shards / "index.json").stat().st_mtime_ns == before
