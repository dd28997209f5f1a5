"""`python -m spotrun_trainer {prepare,launch}`: the trainer package's command line.

Local runs, the demo and the example builders live outside the image, in the `spotrun` package
(`spotrun local`, `spotrun demo`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from .data import DataError, prepare
from .launcher import main as launch_main
from .processing import ProcessingPaths, prepare_part


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spotrun_trainer", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="tokenize .txt/.jsonl files into token shards plus index.json")
    p.add_argument("inputs", nargs="*", type=Path, help="files or directories of .txt / .jsonl / .jsonl.gz / .parquet")
    p.add_argument("--tokenizer", help="local directory of a HF tokenizer")
    p.add_argument("--out", type=Path, help="output dataset directory")
    p.add_argument("--sagemaker-processing", action="store_true",
                   help="run as the pipeline's SageMaker Processing job: inputs, tokenizer and output are SageMaker "
                        "Processing's paths under /opt/ml (SPOTRUN_SM_ROOT elsewhere); this instance's part goes "
                        "to output/parts/<host>/")
    p.add_argument("--shard-mb", type=float, default=256, help="target shard size in MB (default 256)")
    p.add_argument("--text-field", default="text", help="JSONL field holding the text (default text)")
    p.add_argument("--validation-fraction", type=float, default=0.0,
                   help="share of documents (by a stable hash of each) written to OUT/validation (default 0)")
    launch = sub.add_parser("launch", help="the container entry point (same as the image's ENTRYPOINT)")
    launch.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for the launcher")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    if args.cmd == "prepare" and args.sagemaker_processing:
        return _processing(args, Path(os.environ.get("SPOTRUN_SM_ROOT", "/opt/ml")))
    if args.cmd == "prepare":
        if not args.inputs or args.tokenizer is None or args.out is None:
            parser.error("prepare needs INPUT..., --tokenizer and --out (or --sagemaker-processing)")
        try:
            index = prepare(args.inputs, args.tokenizer, args.out, shard_bytes=int(args.shard_mb * 1e6),
                            text_field=args.text_field, validation_fraction=args.validation_fraction)
        except DataError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"prepared {index['total_tokens']} tokens in {len(index['shards'])} shards at {args.out}")
        return 0

    return launch_main(args.rest)


def _processing(args: argparse.Namespace, root: Path) -> int:
    paths = None
    try:
        paths = ProcessingPaths.under(root)
        index = prepare_part(paths, shard_bytes=int(args.shard_mb * 1e6), text_field=args.text_field,
                             validation_fraction=args.validation_fraction)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if paths is not None:  # the job's ExitMessage: the file and line, not only an exit code
            paths.message.parent.mkdir(parents=True, exist_ok=True)
            paths.message.write_bytes(f"{paths.host}: {exc}".encode()[:1024])
        return 2
    tokens = index["total_tokens"] if index else 0
    print(f"prepared part {paths.host}: {tokens} tokens in {len(index['shards']) if index else 0} shards")
    return 0


if __name__ == "__main__":
    sys.exit(main())
