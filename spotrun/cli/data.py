"""`spotrun prepare` and `spotrun upload-model`: data and models into the stage's bucket, checked first.

    spotrun prepare INPUT... --tokenizer DIR --out DIR                 shards + index.json here
    spotrun prepare INPUT... --tokenizer DIR --stage dev --name chat   ... then to s3://<bucket>/datasets/chat/
    spotrun upload-model DIR --stage dev [--name N]                    a checked HF model to models/<name>/

Preparation is spotrun.cli.datasets (content-addressed: the same inputs and tokenizer are never prepared, or uploaded,
twice); the model check is spotrun.cli.models. The bucket comes from the stack's outputs
(spotrun.cli.remote.deployment), never typed. Each prints the `data.source` / `model.source` to put in the run JSON.
Exit codes: 0 done, 2 invalid
input or destination (the message names the file and line or the option), 1 an AWS error.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from botocore.exceptions import BotoCoreError, ClientError

from ..contract.strict_json import dumps as strict_dumps
from ..seams import DatasetIndex, StackOutput
from .arguments import as_typed
from .datasets import (
    PrepareError,
    check_has_text,
    check_name,
    dataset_key,
    dataset_uri,
    input_files,
    prepare_dataset,
    remote_marker,
    upload_dataset,
)
from .exits import Exit, fail
from .models import ModelDirError, check_model_dir, upload_model
from .remote import RemoteError, aws_message, deployment


def _stage_args(p, *, required_name: bool) -> None:
    p.add_argument("--stage", help="the deployed stage whose artifact bucket receives it (stacks/config.py)")
    p.add_argument("--stack", help="CloudFormation stack name (default <stage>-Spotrun)")
    p.add_argument("--region", help="AWS region (default: the stage's, stacks/config.py; else the AWS "
                   "configuration's)")
    p.add_argument("--name", required=False, help="the name under the bucket's prefix" +
                   (" (required with --stage)" if required_name else " (default: the directory's name)"))
    p.add_argument("--format", choices=["text", "json"], default="text", help="text (default) or one JSON document")


def register(sub) -> None:
    p = sub.add_parser("prepare", help="tokenize raw .txt / .jsonl / .jsonl.gz / .parquet into token shards + "
                       "index.json, here (--out) or into the stage's bucket (--stage, --name)")
    p.add_argument("inputs", nargs="+", type=Path, help="files or directories of text (JSONL: a `text` field or "
                   "chat `messages`)")
    p.add_argument("--tokenizer", required=True, type=Path, help="a Hugging Face tokenizer or model directory (the "
                   "model you will fine-tune)")
    p.add_argument("--out", type=Path, help="write the dataset to this directory (not with --stage)")
    p.add_argument("--work", type=Path, default=Path("prepared"), help="with --stage: the local cache of prepared "
                   "datasets, one directory per content key (default ./prepared)")
    p.add_argument("--text-field", default="text", help="JSONL/Parquet field holding plain text (default text)")
    p.add_argument("--shard-mb", type=float, default=256, help="target shard size in MB (default 256)")
    p.add_argument("--validation-fraction", type=float, default=0.0, help="this share of the documents (0-0.5, by "
                   "a stable hash of each) goes to the dataset's validation/ split (default 0: none)")
    _stage_args(p, required_name=True)
    p.set_defaults(func=prepare_command)

    m = sub.add_parser("upload-model", help="check a Hugging Face model directory (config, complete safetensors, "
                       "tokenizer) and upload it to the stage's models/ prefix")
    m.add_argument("model", type=Path, help="the model directory (save_pretrained's layout)")
    _stage_args(m, required_name=False)
    m.set_defaults(func=upload_model_command)


def _print(result: dict, fmt: str, lines: list[str]) -> None:
    if fmt == "json":
        print(strict_dumps(result, indent=2))
    else:
        print("\n".join(lines))


def _guard(fn, args) -> int:
    """Run a command; its exit code from spotrun/cli/exits.py. With `--format json` an error is one JSON document on
    stdout (as the result is), else `error: <error>: <message>` on stderr: InvalidInput (the inputs, the tokenizer or
    the model directory), RemoteError (the stage or its stack), as `spotrun start` and the other stage commands
    say it."""
    fmt = getattr(args, "format", "text")
    try:
        return fn(args)
    except (PrepareError, ModelDirError, RemoteError) as exc:
        return fail(fmt, Exit.INVALID, "RemoteError" if isinstance(exc, RemoteError) else "InvalidInput", str(exc))
    except (ClientError, BotoCoreError) as exc:
        return fail(fmt, Exit.FAILED, "AWS", aws_message(exc))
    except KeyboardInterrupt:
        message = "Ctrl-C (nothing half-written is left looking complete; run the command again)"
        if fmt == "json":
            return fail(fmt, Exit.STOPPED, "Stopped", message)
        print(f"stopped: {message}", file=sys.stderr)
        return int(Exit.STOPPED)


MIN_SHARD_BYTES = 1024  # the least spotrun_trainer.data.prepare takes (it names shard_bytes, not the flag)

def _bucket(args) -> tuple[str, object]:
    dep = deployment(args.stage, args.stack, args.region)
    bucket = dep.outputs.get(StackOutput.ARTIFACT_BUCKET.value)
    if not bucket:
        raise RemoteError(f"stack {dep.stack} has no {StackOutput.ARTIFACT_BUCKET.value} output")
    return bucket, dep.client("s3")


def prepare_command(args: argparse.Namespace) -> int:
    return _guard(_prepare, args)


def _prepare(args: argparse.Namespace) -> int:
    emit = (lambda line: print(line, file=sys.stderr, flush=True)) if args.format == "json" else \
        (lambda line: print(line, flush=True))
    # the flags' refusals as every command's (`error: InvalidArguments: ...`, its JSON naming the flag)
    if (args.out is None) == (args.stage is None):
        return fail(args.format, Exit.INVALID, "InvalidArguments", "spotrun prepare needs --out DIR (here) or "
                    "--stage STAGE --name NAME (the stage's bucket), "
                    f"{'not both' if args.out is not None else 'and got neither'}", "--out")
    if not (math.isfinite(args.shard_mb) and args.shard_mb * 1e6 >= MIN_SHARD_BYTES):
        return fail(args.format, Exit.INVALID, "InvalidArguments", f"--shard-mb={args.shard_mb:g} is invalid: "
                    f"expected a shard size in MB of at least {MIN_SHARD_BYTES / 1e6:g} ({MIN_SHARD_BYTES:,} bytes; "
                    "default 256)", "--shard-mb")
    shard_bytes = int(args.shard_mb * 1e6)
    split = args.validation_fraction
    if not 0 <= split <= 0.5:
        return fail(args.format, Exit.INVALID, "InvalidArguments", f"--validation-fraction={as_typed(split)} is "
                    "invalid: expected a number from 0 to 0.5", "--validation-fraction")
    if args.out is not None:
        done = prepare_dataset(args.inputs, args.tokenizer, args.out, text_field=args.text_field,
                               shard_bytes=shard_bytes, emit=emit, validation_fraction=split)
        result = {"data_source": str(done.path.resolve()), "key": done.key, "reused": done.reused,
                  "total_tokens": done.index[DatasetIndex.TOTAL_TOKENS], "seconds": done.seconds}
        _print(result, args.format, [f"{'already prepared (same inputs and tokenizer)' if done.reused else 'prepared'}"
                                     f": {done.index['total_tokens']:,} tokens",
                                     f'data.source: "{result["data_source"]}"'])
        return 0
    name = check_name(args.name or "")
    files = input_files(args.inputs)
    check_has_text(files)  # the inputs first: an empty file is refused before the stage's credentials are asked for
    key = dataset_key(files, args.tokenizer, text_field=args.text_field, shard_bytes=shard_bytes,
                      validation_fraction=split)
    bucket, s3 = _bucket(args)
    uri = dataset_uri(bucket, name)
    marker, index_there = remote_marker(s3, bucket, f"datasets/{name}/")
    if marker is not None and marker.get("key") == key and index_there:
        result = {"data_source": uri, "key": key, "reused": True, "uploaded": False,
                  "total_tokens": marker.get("total_tokens")}
        _print(result, args.format, [f"already in {uri} (same inputs and tokenizer): not prepared or uploaded again",
                                     f'data.source: "{uri}"'])
        return 0
    done = prepare_dataset(args.inputs, args.tokenizer, cache=args.work, text_field=args.text_field,
                           shard_bytes=shard_bytes, emit=emit, validation_fraction=split)
    up = upload_dataset(s3, done, bucket, name, emit=emit)
    result = {"data_source": uri, "key": done.key, "reused": done.reused, "uploaded": up["uploaded"],
              "total_tokens": done.index[DatasetIndex.TOTAL_TOKENS], "bytes": up["bytes"]}
    _print(result, args.format, [f"{done.index['total_tokens']:,} tokens in {uri}", f'data.source: "{uri}"'])
    return 0


def upload_model_command(args: argparse.Namespace) -> int:
    return _guard(_upload_model, args)


def _upload_model(args: argparse.Namespace) -> int:
    if args.stage is None:  # a missing flag, as argparse's own errors name it
        return fail(args.format, Exit.INVALID, "InvalidArguments", "--stage is required: the deployed stage whose "
                    "bucket receives the model (`spotrun upload-model --help` lists the flags)", "--stage")
    emit = (lambda line: print(line, file=sys.stderr, flush=True)) if args.format == "json" else \
        (lambda line: print(line, flush=True))
    checked = check_model_dir(args.model)
    emit(f"[upload-model] {args.model}: {checked.summary()}")
    name = check_name(args.name or args.model.resolve().name.lower())
    bucket, s3 = _bucket(args)
    up = upload_model(s3, args.model, bucket, name, emit=emit)
    result = {"model_source": up["uri"], "uploaded": up["uploaded"], "bytes": up["bytes"], **checked.to_json()}
    _print(result, args.format, [f"model.source: \"{up['uri']}\""])
    return 0
