"""The fetch of a hub model (`hf://org/name[@revision]`) into a directory, with huggingface_hub's own client.

Run by the preparation step's fetch job (`python -m spotrun.pipeline.hub_fetch hf://org/name@rev
--sagemaker-processing` in the trainer image, which installs spotrun; network allowed there only) and by `spotrun
local` (into OUT/models/, the local stand-in of the stage's models/ prefix); never inside a training job.

- the revision is resolved to its commit first (HfApi.model_info) and the files are downloaded at that commit, so
  every file comes from one commit even if the branch moves meanwhile;
- only a model's top-level files: configs, safetensors weights, tokenizer and chat-template files
  (`MODEL_PATTERNS`); a repository with only pickled weights (.bin) is refused;
- `spotrun-hub.json` (HUB_MANIFEST) is written last beside the files: the id, the revision asked for, the commit,
  each file's size and SHA-256;
- `fetch_into` reuses a complete copy (every listed file present with its size): a later run with the same id and
  revision makes no request to the hub.
The hub's address is huggingface_hub's (`HF_ENDPOINT`, read by the entry points and passed in as `endpoint`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ..contract.hub_id import COMMIT, HubId, parse_hub_id
from ..contract.strict_json import RunValidationError
from ..seams import HUB_MANIFEST, HUB_MODELS_PREFIX, PROCESSING_MODEL_OUTPUT
from .hub import check_manifest

# A model's files (fnmatch patterns, top level only): configs, safetensors weights and their index, tokenizers
# (tokenizer.json, sentencepiece .model, merges/vocab .txt, tiktoken), the chat template.
MODEL_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja"]
NOT_NESTED = ["*/*"]  # subfolders (onnx/, original/, checkpoints) are not the model the trainer loads


class HubFetchError(RuntimeError):
    """A hub model that cannot be fetched as asked: one line naming the id and why."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())  # huggingface_hub's messages span lines


def resolve_commit(hub: HubId, endpoint: str | None, token: str | None = None) -> str:
    """The commit `hub.revision` names now, asked of the hub in one request even for a 40-digit commit: it proves
    the commit exists, and a hub that cannot be reached fails here at once. NOTE: snapshot_download itself skips
    this for a commit and goes to its tree listing, which retries network errors 5 times (~23 s) and has no
    setting for it. The request's timeout is huggingface_hub's own for metadata (HF_HUB_ETAG_TIMEOUT, 10 s)."""
    # NOTE: huggingface_hub and its HTTP client are imported where the hub is asked: at the top of this module
    # (spotrun/local/pipeline.py imports it) they took ~0.15 s of every `spotrun` command's start, a tenth of a
    # `spotrun simulate`
    import httpx2  # huggingface_hub 2.x's HTTP client: a network failure is its error, not an OSError
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        sha = HfApi(endpoint=endpoint, token=token).model_info(hub.repo, revision=hub.revision,
                                                               timeout=constants.HF_HUB_ETAG_TIMEOUT).sha
    except RevisionNotFoundError:
        raise HubFetchError(f"{hub.text}: the hub has no revision {hub.revision!r} of {hub.repo}") from None
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise HubFetchError(f"{hub.text}: the hub has no public model {hub.repo} ({type(exc).__name__}; gated "
                            "and private models are not fetched)") from None
    except (HfHubHTTPError, httpx2.HTTPError, OSError) as exc:
        raise HubFetchError(f"{hub.text}: the hub could not be reached ({_one_line(exc)})") from None
    if not sha or not COMMIT.fullmatch(sha) or (COMMIT.fullmatch(hub.revision) and sha != hub.revision):
        raise HubFetchError(f"{hub.text}: the hub named no commit for {hub.revision!r} (it answered {sha!r})")
    return sha


def fetch(hub: HubId, out: Path, *, endpoint: str | None = None, token: str | None = None) -> dict:
    """Download the model's files at the revision's commit into `out` (made or emptied), the manifest last."""
    # NOTE: imported here, as in `resolve_commit`: only a fetch loads huggingface_hub
    import httpx2
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    commit = resolve_commit(hub, endpoint, token)
    with tempfile.TemporaryDirectory(prefix="spotrun-hub-") as cache:
        try:
            snapshot = Path(snapshot_download(hub.repo, revision=commit, cache_dir=cache, endpoint=endpoint,
                                              token=token, allow_patterns=MODEL_PATTERNS,
                                              ignore_patterns=NOT_NESTED))
        except (HfHubHTTPError, httpx2.HTTPError, OSError) as exc:
            raise HubFetchError(f"{hub.text}: downloading commit {commit} failed ({_one_line(exc)})") from None
        names = sorted(p.name for p in snapshot.iterdir() if p.is_file())
        if "config.json" not in names or not any(n.endswith(".safetensors") for n in names):
            raise HubFetchError(f"{hub.text}: expected a model with config.json and .safetensors weights at commit "
                                f"{commit} (found {', '.join(names) or 'nothing'}; pickled .bin weights are not "
                                "loaded)")
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        files = {}
        for name in names:  # the cache's files are links into its blobs: copied as bytes
            shutil.copyfile(snapshot / name, out / name)
            files[name] = {"size": (out / name).stat().st_size, "sha256": _sha256(out / name)}
    manifest = {"source": hub.text, "repo": hub.repo, "revision": hub.revision, "commit": commit, "files": files}
    (out / HUB_MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def local_copy(models: Path, hub: HubId) -> Path:
    """Where a local stage (`spotrun local`'s OUT/models/) keeps the copy: the stage bucket's layout."""
    return models / HUB_MODELS_PREFIX.removeprefix("models/") / hub.org / hub.name / hub.revision


def complete(path: Path, hub: HubId) -> dict | None:
    """The copy's manifest when every listed file is there with its size (as spotrun/pipeline/hub.py `fetched`)."""
    try:
        manifest = check_manifest(json.loads((path / HUB_MANIFEST).read_text()), hub)
    except (OSError, ValueError):
        return None
    ok = all((path / name).is_file() and (path / name).stat().st_size == entry.get("size")
             for name, entry in manifest["files"].items())
    return manifest if ok else None


def fetch_into(models: Path, hub: HubId, *, endpoint: str | None = None,
               token: str | None = None) -> tuple[Path, dict, bool]:
    """(the copy's directory, its manifest, whether it was reused): a complete copy is reused without asking the
    hub; otherwise fetched into a temporary sibling and moved into place."""
    dest = local_copy(models, hub)
    manifest = complete(dest, hub)
    if manifest is not None:
        return dest, manifest, True
    staging = dest.with_name(f".{dest.name}.partial")  # a revision never starts with "."
    manifest = fetch(hub, staging, endpoint=endpoint, token=token)
    if dest.exists():
        shutil.rmtree(dest)
    staging.rename(dest)
    return dest, manifest, False


def main(argv: list[str] | None = None) -> int:
    """The fetch job's entry point: the hub from HF_ENDPOINT, SageMaker Processing's root from SPOTRUN_SM_ROOT
    (/opt/ml in the job); a failure's one line is also the job's ExitMessage (/opt/ml/output/message)."""
    parser = argparse.ArgumentParser(prog="python -m spotrun.pipeline.hub_fetch", description=__doc__.split("\n")[0])
    parser.add_argument("source", help="the run's model.source, hf://org/name[@revision]")
    parser.add_argument("--out", type=Path, help="the directory to fill (made or emptied)")
    parser.add_argument("--sagemaker-processing", action="store_true",
                        help="run as the pipeline's fetch job: the output is SageMaker Processing's model directory")
    args = parser.parse_args(argv)
    root = Path(os.environ.get("SPOTRUN_SM_ROOT", "/opt/ml"))
    out = root / "processing" / PROCESSING_MODEL_OUTPUT if args.sagemaker_processing else args.out
    if out is None:
        parser.error("--out DIR or --sagemaker-processing")
    try:
        manifest = fetch(parse_hub_id(args.source, "source"), out, endpoint=os.environ.get("HF_ENDPOINT"))
    except (RunValidationError, HubFetchError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        if args.sagemaker_processing:
            (root / "output").mkdir(parents=True, exist_ok=True)
            (root / "output" / "message").write_bytes(str(exc).encode()[:1024])
        return 2
    print(f"fetched {args.source} at commit {manifest['commit']}: {len(manifest['files'])} files into {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
