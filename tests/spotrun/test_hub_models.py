"""Hub models (`model.source` hf://org/name[@revision]): the contract, the fetch from a loopback mirror of the
hub's API (tests/spotrun/hub_mirror.py, with huggingface_hub's own client) into a local stand-in of the stage's
models/ and its reuse, the estimate's rule (no hub access at estimate time), and `spotrun local` training on a
fetched copy."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from spotrun.cli.main import main
from spotrun.contract.hub_id import parse_hub_id
from spotrun.contract.runfile import load_run_file
from spotrun.contract.spec import RunValidationError, parse_run
from spotrun.local.pipeline import load_run
from spotrun.pipeline.hub_fetch import HubFetchError, fetch_into, local_copy
from spotrun.planner.sources import read_sources
from spotrun.seams import EXPORT_METADATA, HUB_MANIFEST
from tests.spotrun.hub_mirror import HubMirror

REPO = "tiny-org/tiny-llama"
ROOT = Path(__file__).resolve().parents[2]


def _run(source: str, data: str = "/data") -> dict:
    return {"version": 1, "name": "hub", "model": {"source": source}, "data": {"source": data, "seq_len": 64},
            "budget": {"max_usd": 5}}


@pytest.mark.parametrize("source, repo, revision", [
    ("hf://org/name", "org/name", "main"),
    ("hf://Qwen/Qwen2.5-0.5B-Instruct@v1.0", "Qwen/Qwen2.5-0.5B-Instruct", "v1.0"),
    ("hf://a/b@" + "0123456789abcdef" * 2 + "01234567", "a/b", "0123456789abcdef" * 2 + "01234567"),
])
def test_the_contract_accepts_hub_ids_with_or_without_a_revision(source, repo, revision):
    run = parse_run(_run(source))
    assert run.model.source == source and run.model.init == "pretrained"
    hub = parse_hub_id(source)
    assert (hub.repo, hub.revision) == (repo, revision)


@pytest.mark.parametrize("source", ["hf://name-only", "hf://org/name/extra", "hf://org/-name", "hf://org/na--me",
                                    "hf://org/name@", "hf://org/name@refs/pr/1", "hf://org/name@a..b", "hf:/org/n",
                                    "https://huggingface.co/org/name", "hf://" + "a" * 97 + "/n"])
def test_a_malformed_hub_id_is_one_line_naming_model_source_and_the_accepted_form(source):
    with pytest.raises(RunValidationError) as err:
        parse_run(_run(source))
    message = str(err.value)
    assert err.value.field == "model.source" and "\n" not in message
    assert "hf://org/name or hf://org/name@revision" in message or "hf://org/name[@revision]" in message


def test_a_run_file_keeps_a_hub_id_as_written(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps(_run("hf://org/name@v1", "data")))
    loaded = load_run_file(tmp_path / "run.json")
    assert loaded.raw["model"]["source"] == "hf://org/name@v1"  # not made a path like the local data source
    assert loaded.raw["data"]["source"] == str(tmp_path / "data")


def test_the_estimate_never_reads_the_hub_it_plans_with_an_inline_config_or_names_what_to_do():
    run = parse_run(_run("hf://org/name"))
    with pytest.raises(RunValidationError) as err:
        read_sources(run, offline=True)
    assert err.value.field == "model.source" and "give model.config" in str(err.value)
    config = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 128, "vocab_size": 256}
    with_config = parse_run({**_run("hf://org/name"), "model": {"source": "hf://org/name", "config": config},
                             "data": {"source": "/data", "seq_len": 64, "tokens": 10_000}})
    sources = read_sources(with_config, offline=True)
    assert sources.model_config is None and any("is a hub id" in n for n in sources.notes)


@pytest.fixture
def hub(assets):
    with HubMirror() as mirror:
        mirror.add(REPO, Path(assets["model"]))
        yield mirror


def test_a_fetch_pins_the_commit_records_each_files_sha256_and_is_reused_without_asking_the_hub(hub, assets,
                                                                                              tmp_path):
    models = tmp_path / "models"
    path, manifest, reused = fetch_into(models, parse_hub_id(f"hf://{REPO}"), endpoint=hub.endpoint)
    assert not reused and path == models / "_hub" / "tiny-org" / "tiny-llama" / "main"
    assert manifest["commit"] == hub.repos[REPO].commit and manifest["revision"] == "main"
    assert json.loads((path / HUB_MANIFEST).read_text()) == manifest
    for name, entry in manifest["files"].items():  # the bytes the hub served, hashed here independently
        assert hashlib.sha256((Path(assets["model"]) / name).read_bytes()).hexdigest() == entry["sha256"]
    assert set(manifest["files"]) == {p.name for p in Path(assets["model"]).iterdir()}
    assert sorted(hub.downloads()) == sorted(f"/{REPO}/resolve/{manifest['commit']}/{n}" for n in manifest["files"])

    # The branch moves on the hub: the stage keeps the commit of its first fetch, and asks nothing.
    asked = len(hub.requests)
    hub.repos[REPO].branches["main"] = "f" * 40
    again, manifest2, reused2 = fetch_into(models, parse_hub_id(f"hf://{REPO}@main"), endpoint=hub.endpoint)
    assert reused2 and again == path and manifest2 == manifest and len(hub.requests) == asked

    # A copy missing a file is fetched again (at the commit the branch names now: here none the hub has).
    (path / "config.json").unlink()
    with pytest.raises(HubFetchError, match="downloading commit f{40} failed|no revision"):
        fetch_into(models, parse_hub_id(f"hf://{REPO}"), endpoint=hub.endpoint)


def test_an_id_the_hub_does_not_have_or_a_model_without_safetensors_is_one_line_with_the_reason(hub, assets,
                                                                                                tmp_path):
    for source, reason in ((f"hf://{REPO}@v9", "the hub has no revision 'v9'"),
                           ("hf://tiny-org/missing", "the hub has no public model tiny-org/missing")):
        with pytest.raises(HubFetchError, match=reason):
            fetch_into(tmp_path / "models", parse_hub_id(source), endpoint=hub.endpoint)
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(Path(assets["model"]) / "config.json", pickled / "config.json")
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    hub.add("tiny-org/pickled", pickled)
    with pytest.raises(HubFetchError, match="config.json and .safetensors weights"):
        fetch_into(tmp_path / "models", parse_hub_id("hf://tiny-org/pickled"), endpoint=hub.endpoint)
    assert not any("pytorch_model.bin" in p for p in hub.downloads())  # never downloaded: not a model file
    assert not local_copy(tmp_path / "models", parse_hub_id("hf://tiny-org/pickled")).exists()


def test_local_load_fetches_into_out_models_once_and_refuses_an_unknown_revision_by_field(hub, assets, tmp_path):
    run_path = tmp_path / "run.json"
    run_path.write_text(json.dumps(_run(f"hf://{REPO}", str(assets["data"]))))
    lines: list[str] = []
    raw, run = load_run(run_path, tmp_path / "out" / "models", hub_endpoint=hub.endpoint, emit=lines.append)
    copy = local_copy(tmp_path / "out" / "models", parse_hub_id(f"hf://{REPO}"))
    assert run.model.source == raw["model"]["source"] == str(copy) and (copy / "config.json").is_file()
    assert "fetched commit" in lines[0]
    asked = len(hub.requests)
    load_run(run_path, tmp_path / "out" / "models", hub_endpoint=hub.endpoint, emit=lines.append)
    assert len(hub.requests) == asked and "reused commit" in lines[1]
    run_path.write_text(json.dumps(_run(f"hf://{REPO}@v9", str(assets["data"]))))
    with pytest.raises(RunValidationError) as err:
        load_run(run_path, tmp_path / "out" / "models", hub_endpoint=hub.endpoint, emit=lines.append)
    assert err.value.field == "model.source" and "no revision 'v9'" in str(err.value)


@pytest.mark.slow
def test_spotrun_local_trains_a_hub_model_fetched_from_the_mirror(hub, assets, tmp_path, monkeypatch, capsys):
    run_path = tmp_path / "run.json"
    run_path.write_text(json.dumps({**_run(f"hf://{REPO}", str(assets["data"])), "training": {"lr": 0.003}}))
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)  # read by the CLI's entry point
    code = main(["local", str(run_path), "--out", str(tmp_path / "out"), "--nproc", "1", "--progress", "none",
                 "--format", "json", "--set", "max_steps=3", "--set", "log_every=1"])
    assert code == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert report["status"] != "GateFailed" and report["model_package"]
    copy = local_copy(tmp_path / "out" / "models", parse_hub_id(f"hf://{REPO}"))
    job_run = json.loads((Path(report["files"]["report"]).parent / "run.json").read_text())
    assert job_run["model"]["source"] == str(copy)  # trained from the fetched copy
    assert len(hub.downloads()) == len(json.loads((copy / HUB_MANIFEST).read_text())["files"])


@pytest.mark.slow
def test_a_lora_adapter_of_a_hub_model_names_the_hub_id_and_commit_and_loads_from_the_hub_once_the_job_is_gone(
        hub, assets, tmp_path, monkeypatch, capsys):
    """adapter_config.json named the fetched copy (OUT/models/_hub/...) as its base: gone with OUT, and no name the
    hub knows. It names the hub id and the commit trained on, which PEFT's AutoPeftModel loads from the hub."""
    run_path = tmp_path / "run.json"
    run_path.write_text(json.dumps({**_run(f"hf://{REPO}", str(assets["data"])),
                                    "training": {"method": "lora", "lora": {"rank": 4}}}))
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)  # read by the CLI's entry point
    code = main(["local", str(run_path), "--out", str(tmp_path / "out"), "--nproc", "1", "--progress", "none",
                 "--format", "json", "--set", "max_steps=2"])
    assert code == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(report["model_package"], elsewhere)
    shutil.rmtree(tmp_path / "out")  # the job directory and the fetched copy are gone
    adapter, commit = elsewhere / "model", hub.repos[REPO].commit
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["base_model_name_or_path"], config["revision"]) == (REPO, commit)
    base = json.loads((adapter / EXPORT_METADATA).read_text())["base_model"]
    assert (base["source"], base["revision"]) == (REPO, commit)
    # A user's fresh Python with the hub (here the mirror) and an empty cache: the base comes from the hub.
    fetched_before = len(hub.downloads())
    load = ("import sys, torch; from peft import AutoPeftModelForCausalLM; "
            "model = AutoPeftModelForCausalLM.from_pretrained(sys.argv[1]).eval(); "
            "print(model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, do_sample=False).shape)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    done = subprocess.run([sys.executable, "-c", load, str(adapter)], capture_output=True, text=True, timeout=300,
                          env={**env, "HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf-home")})
    assert done.returncode == 0 and "torch.Size([1, 6])" in done.stdout, done.stderr[-3000:]
    weights = [n for n in hub.repos[REPO].files if n.endswith(".safetensors")]
    assert sorted(p.removeprefix(f"/{REPO}/resolve/{commit}/") for p in hub.downloads()[fetched_before:]
                  if p.endswith(".safetensors")) == sorted(weights)


def test_a_hub_that_cannot_be_reached_is_one_line_naming_model_source(assets, tmp_path):
    """huggingface_hub 2.x raises its HTTP client's errors (not OSError) when nothing listens: still one line."""
    with socket.socket() as s:  # a loopback port nothing listens on once this socket is closed
        s.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(HubFetchError, match="the hub could not be reached"):
        fetch_into(tmp_path / "models", parse_hub_id(f"hf://{REPO}@v1"), endpoint=endpoint)
    run_path = tmp_path / "run.json"
    run_path.write_text(json.dumps(_run(f"hf://{REPO}@v1", str(assets["data"]))))
    with pytest.raises(RunValidationError) as err:
        load_run(run_path, tmp_path / "out" / "models", hub_endpoint=endpoint, emit=lambda line: None)
    assert err.value.field == "model.source" and "could not be reached" in str(err.value)
    assert "\n" not in str(err.value)


class _Listener:
    """A loopback 'hub' that accepts each connection and then closes it unanswered (`answer=False`: holds it
    open, silent); counts the connections."""

    def __init__(self, *, close: bool = True):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections, self.held, self.close = 0, [], close
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed by the test
                return
            self.connections += 1
            conn.close() if self.close else self.held.append(conn)

    def shut(self):
        self.sock.close()
        for conn in self.held:
            conn.close()


COMMIT = "0123456789abcdef" * 2 + "01234567"


def test_a_commit_is_asked_of_the_hub_once_and_fetched_or_refused_by_name(hub, tmp_path):
    commit = hub.repos[REPO].commit
    path, manifest, _ = fetch_into(tmp_path / "models", parse_hub_id(f"hf://{REPO}@{commit}"), endpoint=hub.endpoint)
    assert manifest["commit"] == manifest["revision"] == commit and path.name == commit
    assert ("GET", f"/api/models/{REPO}/revision/{commit}") in hub.requests
    with pytest.raises(HubFetchError, match=f"the hub has no revision '{COMMIT}'"):
        fetch_into(tmp_path / "models", parse_hub_id(f"hf://{REPO}@{COMMIT}"), endpoint=hub.endpoint)


def test_a_commit_against_a_hub_that_does_not_answer_fails_at_once_in_one_line(tmp_path):
    """A 40-digit commit is checked on the hub like any revision (one request): huggingface_hub's tree listing,
    which retries network errors 5 times over ~23 s, is never reached."""
    hub = _Listener()
    try:
        with pytest.raises(HubFetchError, match="the hub could not be reached") as err:
            fetch_into(tmp_path / "models", parse_hub_id(f"hf://{REPO}@{COMMIT}"), endpoint=hub.endpoint)
    finally:
        hub.shut()
    assert hub.connections == 1 and "\n" not in str(err.value), (hub.connections, str(err.value))


def test_a_hub_that_accepts_and_never_answers_is_given_up_after_huggingface_hubs_own_timeout(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_ETAG_TIMEOUT", 1)  # HF_HUB_ETAG_TIMEOUT (default 10 s)
    hub = _Listener(close=False)
    try:
        with pytest.raises(HubFetchError, match="the hub could not be reached .*Timeout"):
            fetch_into(tmp_path / "models", parse_hub_id(f"hf://{REPO}@{COMMIT}"), endpoint=hub.endpoint)
    finally:
        hub.shut()


# ---- docs/hub-offline.md, as the code does it ----------------------------------------------------------------------


def test_the_routes_the_offline_page_names_are_the_ones_a_fetch_calls(hub, tmp_path):
    page = (ROOT / "docs" / "hub-offline.md").read_text(encoding="utf-8")
    routes = re.findall(r"`((?:GET|GET\|HEAD) /[^`]+)`", page)
    assert len(routes) == 3, routes
    shapes = [(set(m.split("|")), re.compile(re.sub(r"<[a-z]+>", "[^/]+", path) + "$"))
              for m, path in (r.split(" ", 1) for r in routes)]
    fetch_into(tmp_path / "models", parse_hub_id(f"hf://{REPO}"), endpoint=hub.endpoint)
    used = {i for method, path in hub.requests for i, (methods, shape) in enumerate(shapes)
            if method in methods and shape.match(path)}
    unmatched = [(m, p) for m, p in hub.requests if not any(m in ms and s.match(p) for ms, s in shapes)]
    assert unmatched == [] and used == {0, 1, 2}


def test_offline_mode_uses_a_complete_copy_and_refuses_a_missing_one_in_one_line(hub, assets, tmp_path,
                                                                                monkeypatch):
    from huggingface_hub import constants

    run_path = tmp_path / "run.json"
    run_path.write_text(json.dumps(_run(f"hf://{REPO}", str(assets["data"]))))
    load_run(run_path, tmp_path / "out" / "models", hub_endpoint=hub.endpoint, emit=lambda line: None)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # HF_HUB_OFFLINE=1, as huggingface_hub reads it
    asked = len(hub.requests)
    _, run = load_run(run_path, tmp_path / "out" / "models", hub_endpoint=hub.endpoint, emit=lambda line: None)
    assert Path(run.model.source) == local_copy(tmp_path / "out" / "models", parse_hub_id(f"hf://{REPO}"))
    assert len(hub.requests) == asked
    run_path.write_text(json.dumps(_run(f"hf://{REPO}@v2", str(assets["data"]))))
    with pytest.raises(RunValidationError) as err:
        load_run(run_path, tmp_path / "out" / "models", hub_endpoint=hub.endpoint, emit=lambda line: None)
    assert str(err.value).startswith(f'model.source="hf://{REPO}@v2" is invalid: expected a hub model that can be '
                                     f"fetched (hf://{REPO}@v2: the hub could not be reached (OfflineModeIsEnabled")
    assert "\n" not in str(err.value) and len(hub.requests) == asked


def test_a_model_downloaded_with_local_dir_is_a_model_source_for_spotrun_local(hub, assets, tmp_path):
    from huggingface_hub import snapshot_download  # what `hf download REPO --local-dir DIR` calls

    directory = tmp_path / "downloaded"
    snapshot_download(REPO, local_dir=directory, endpoint=hub.endpoint)
    assert (directory / ".cache").is_dir()  # huggingface_hub's own metadata, left in the directory
    run_path = tmp_path / "run.json"
    run_path.write_text(json.dumps(_run(str(directory), str(assets["data"]))))
    _, run = load_run(run_path, tmp_path / "out" / "models", emit=lambda line: None)
    assert run.model.source == str(directory)


def test_the_estimate_of_raw_text_with_a_hub_model_says_where_the_tokenizer_comes_from(tmp_path, capsys):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "train.txt").write_text("a document.\n\nanother document.\n")
    run = {**_run(f"hf://{REPO}", str(tmp_path / "raw")), "model": {"source": f"hf://{REPO}", "config": {
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "vocab_size": 1000}}}
    (tmp_path / "run.json").write_text(json.dumps(run))
    assert main(["estimate", str(tmp_path / "run.json")]) == 2
    err = capsys.readouterr().err
    assert 'model.source="hf://tiny-org/tiny-llama" is invalid' in err and "the estimate never fetches a hub id" in err
    assert "OUT/models/_hub/<org>/<name>/<revision>/" in err


def test_the_cli_loads_huggingface_hub_only_to_fetch():
    """The fetch imports huggingface_hub (and its HTTP client) where it asks the hub: a command's start does not
    (~0.15 s of each `spotrun simulate` and `spotrun estimate`, a tenth of the first)."""
    code = ("import sys; from spotrun.cli.main import build_parser; build_parser(); "
            "loaded = sorted(m for m in ('huggingface_hub', 'httpx2') if m in sys.modules); "
            "assert not loaded, f'imported: {loaded}'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
