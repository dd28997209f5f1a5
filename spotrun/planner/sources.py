"""Read what the estimate needs from a run's sources: the model's config.json and the data's index.json.

A source is a local directory or an s3://bucket/prefix URI (read with boto3; the estimate Lambda has read access
to the datasets/ and models/ prefixes). The pipeline reads strictly: a source it cannot read refuses the run, since
the training job could not read it either. The CLI may plan offline: a source it cannot read (no credentials,
the examples' placeholder bucket) is reported as not checked, and the run's inline copies (`model.config`,
`data.tokens`) are used instead when it has them.

The sources are checked against the run and each other before anything is paid for (docs/checks-before-paying.md):
the validation split the prepared data holds (`check_validation`: used when the run names none, refused when the
run asks for another or reads a validation loss without any), the tokenizer the shards were made with against
the model's (`check_tokenizer`), and data.seq_len within the model's positions (`check_seq_len`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..contract.hub_id import is_hub_id
from ..contract.json_text import JsonSyntaxError, loads
from ..contract.spec import RunSpec, RunValidationError, check_json_tree, check_seq_len_within
from ..seams import (
    TOKENIZER_DEFINITION,
    TOKENIZER_VOCABULARY_FILES,
    DatasetIndex,
    directory_tokenizer_identity,
    tokenizer_identity,
)

PLACEHOLDER_BUCKET = "your-artifact-bucket"  # the examples' bucket: docs/deploying.md step 7 replaces it
MAX_SOURCE_JSON_BYTES = 1 << 20  # config.json and index.json are a few KB


@dataclass
class Sources:
    model_config: dict | None  # the source's config.json, or None when not read
    tokens: int | None  # index.json's total_tokens, or None when not read
    notes: list[str] = field(default_factory=list)  # what was read, and what was not and why
    validation_tokens: int | None = None  # data.validation's index.json total_tokens, or None when not read
    split: float | None = None  # the validation split data.source holds (its index.json), or None
    unchecked: list[str] = field(default_factory=list)  # the run's own settings its unread sources leave unchecked


class _Unreadable(Exception):
    """A source could not be read here (no credentials, access denied, placeholder bucket): not checked, as
    opposed to read and found wrong (missing object, bad JSON), which is a RunValidationError."""


def _read_bytes(source: str, name: str, field_path: str, s3_client: Any) -> bytes:
    if source.startswith("s3://"):
        # boto3 takes ~1 s to import: only an s3:// source loads it (the CLI checks local files)
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, _, prefix = source[len("s3://"):].partition("/")
        key = f"{prefix.rstrip('/')}/{name}" if prefix.strip("/") else name
        try:
            client = s3_client or boto3.client("s3")
            return client.get_object(Bucket=bucket, Key=key)["Body"].read(MAX_SOURCE_JSON_BYTES + 1)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "NoSuchBucket", "404"):  # read, and found missing: the source is wrong
                hint = ("; raw text under the stage's datasets/ is prepared by the pipeline itself (`spotrun "
                        "start` accepts it; estimating it here needs data.tokens)") if name == DatasetIndex.FILE else ""
                raise RunValidationError(field_path, source, f"a model or data directory holding {name} "
                                         f"(s3://{bucket}/{key}: {code}){hint}") from None
            raise _Unreadable(f"s3://{bucket}/{key} could not be read: {code or type(exc).__name__}") from None
        except BotoCoreError as exc:  # no credentials, no network: not checked
            raise _Unreadable(f"s3://{bucket}/{key} could not be read: {type(exc).__name__}") from None
    try:
        path = Path(source) / name
        with path.open("rb") as fh:
            return fh.read(MAX_SOURCE_JSON_BYTES + 1)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        hint = ""
        if name == DatasetIndex.FILE and Path(source).is_dir():  # raw text: tokenized by `spotrun prepare`
            hint = (f"; raw text is tokenized into one by `spotrun prepare {source} --tokenizer MODEL_DIR --out DIR` "
                    "(or `--stage STAGE --name NAME`)")
        raise RunValidationError(field_path, source, f"a directory holding {name} "
                                 f"({getattr(exc, 'strerror', None) or exc}){hint}") from None


def _read_json(source: str, name: str, field_path: str, s3_client: Any) -> dict:
    body = _read_bytes(source, name, field_path, s3_client)
    if len(body) > MAX_SOURCE_JSON_BYTES:
        raise RunValidationError(field_path, source, f"a {name} of at most {MAX_SOURCE_JSON_BYTES:,} bytes")
    try:
        value = loads(body.removeprefix(b"\xef\xbb\xbf").decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RunValidationError(field_path, source, f"a valid JSON {name} (UTF-8 text; its byte {exc.start:,} is "
                                 "not UTF-8)") from None
    except JsonSyntaxError as exc:
        raise RunValidationError(field_path, source, f"a valid JSON {name} (not JSON {exc.where_what})",
                                 excerpt=exc.excerpt) from None
    except (RecursionError, ValueError):  # nested deeper than json reads; an integer of over 4,300 digits
        raise RunValidationError(field_path, source, f"a valid JSON {name}") from None
    if not isinstance(value, dict):
        raise RunValidationError(field_path, source, f"a {name} holding a JSON object")
    try:
        check_json_tree(value)
    except RunValidationError as exc:
        raise RunValidationError(field_path, source, f"a {name} without odd values ({exc})") from None
    return value


def _unreadable_here(source: str) -> str | None:
    if is_hub_id(source):  # never read from the hub here (docs/models.md): the fetched copy is
        return (f"{source} is a hub id: its config.json is read from the copy the preparation step fetches "
                "(`spotrun start`; `spotrun local` fetches into OUT/models/); give model.config, a copy of it, to "
                "estimate before")
    if source.startswith(f"s3://{PLACEHOLDER_BUCKET}/"):
        return f"{source} still names the placeholder bucket {PLACEHOLDER_BUCKET}"
    return None


def check_seq_len(run: RunSpec, model_config: dict | None) -> None:
    """data.seq_len within the model's positions (spotrun/contract/spec.py `check_seq_len_within`): those of the
    source's config.json when it was read, else of the inline model.config."""
    if model_config is not None:
        check_seq_len_within(run.data.seq_len, model_config, f"model.source's config.json ({run.model.source})")
    else:
        check_seq_len_within(run.data.seq_len, run.model.config, "model.config")


def _index_tokens(index: dict, field_path: str, source: str) -> int:
    tokens = index.get(DatasetIndex.TOTAL_TOKENS)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 0 < tokens <= 10**15:
        raise RunValidationError(field_path, source, "an index.json with a positive total_tokens (prepare refuses "
                                 "empty data: this one is damaged or hand-written)")
    return tokens


def _data_index(run: RunSpec, s3_client: Any, offline: bool, out: Sources) -> dict | None:
    """data.source's index.json: read strictly when the token count comes from it; when only the validation
    split or the tokenizer is checked against it, one that cannot be read offline is noted (None)."""
    source = run.data.source
    try:
        reason = _unreadable_here(source) if offline else None  # the placeholder bucket: named, not asked for
        if reason:
            raise _Unreadable(reason)
        index = _read_json(source, DatasetIndex.FILE, "data.source", s3_client)
    except _Unreadable as exc:
        if run.data.tokens is None:
            raise RunValidationError("data.source", source, "prepared shards with a readable index.json, "
                                     f"or data.tokens ({exc})") from None
        if not offline:
            raise RunValidationError("data.source", source, f"prepared shards with a readable index.json: "
                                     f"{run.validation_needed_by or 'data.validation_fraction'} needs to know its "
                                     f"validation split ({exc})") from None
        out.notes.append(f"not checked: data.source's validation split and tokenizer ({exc})")
        _split_unchecked(run, str(exc), out)
        return None
    if run.data.tokens is None:
        out.tokens = _index_tokens(index, "data.source", source)
        out.notes.append(f"read data.source's index.json ({source}): {out.tokens:,} tokens")
    return index


def read_sources(run: RunSpec, s3_client: Any = None, *, offline: bool = False) -> Sources:
    """The sources' config.json / index.json where the run needs them, checked against each other: the
    validation split (`check_validation`), the tokenizer (`check_tokenizer`), seq_len within the positions.

    `offline=False` (the pipeline): a source that cannot be read is a RunValidationError naming it.
    `offline=True` (the CLI): it is noted, and the run's inline copy is used when it has one.
    """
    out = Sources(None, None)
    if run.model.source is not None:
        reason = _unreadable_here(run.model.source) if offline or is_hub_id(run.model.source) else None
        try:
            if reason:
                raise _Unreadable(reason)
            out.model_config = _read_json(run.model.source, "config.json", "model.source", s3_client)
            out.notes.append(f"read model.source's config.json ({run.model.source})")
        except _Unreadable as exc:
            if not (offline and run.model.config is not None):
                inline = "; to estimate without reading it, give model.config (a copy of its config.json), as " \
                    "examples/runs/ do" if offline else ""
                raise RunValidationError("model.source", run.model.source,
                                         f"a readable model directory with config.json ({exc}){inline}") from None
            out.notes.append(f"not checked: model.source ({exc}); planned with the inline model.config")
    index = None
    if run.data.source is not None:
        if run.data.tokens is None or split_settings(run):
            reason = _unreadable_here(run.data.source) if offline and run.data.tokens is not None else None
            if reason:
                out.notes.append(f"not checked: data.source's validation split and tokenizer ({reason})")
                _split_unchecked(run, reason, out)
            else:
                index = _data_index(run, s3_client, offline, out)
        else:
            out.notes.append("not read: data.source's index.json (data.tokens is given)")
    if index is not None:
        out.split = check_validation(run, index)
        if out.split is not None and run.data.validation_fraction is None:
            out.notes.append(f"data.source holds a validation split ({out.split:g} of the documents): the run "
                             "evaluates on it")
        check_tokenizer(run, index, out, s3_client, offline)
    if run.data.validation is not None and not run.eval.max_batches:  # its size plans the evaluation time
        out.validation_tokens = _validation_tokens(run, s3_client, offline, out.notes)
    check_seq_len(run, out.model_config)
    return out


def split_settings(run: RunSpec) -> str | None:
    """The run's settings that depend on the validation split data.source holds ("registry.gate and
    data.validation_fraction", ...), or None when it names its own data.validation or needs no split."""
    if run.data.validation is not None:
        return None
    named = [run.validation_needed_by, "data.validation_fraction" if run.data.validation_fraction is not None else None]
    return " and ".join(f for f in named if f) or None


def unchecked_split(run: RunSpec, why: str) -> str:
    """How `validate` and `estimate` alike name split settings they could not check (their status `unchecked`)."""
    return f"{split_settings(run)} against the validation split data.source holds ({run.data.source}: {why})"


def _split_unchecked(run: RunSpec, why: str, out: Sources) -> None:
    if split_settings(run):
        out.unchecked.append(unchecked_split(run, why))


_NO_SPLIT_FIX = ("data.validation (prepared validation shards), or data.validation_fraction with data prepared "
                 "with that split (`spotrun prepare ... --validation-fraction F`; raw text in data.source is split "
                 "when it is prepared)")


def check_validation(run: RunSpec, index: dict) -> float | None:
    """The validation split the run trains with, from data.source's index.json: the split the data holds (used
    when the run names none; refused when the run's data.validation_fraction is another), or None. A run that
    reads a validation loss (registry.gate, eval) without any validation data is refused before it is paid for:
    it would train to the end and fail at the gate."""
    held = index.get(DatasetIndex.VALIDATION)
    split = held.get("fraction") if isinstance(held, dict) else None
    split = float(split) if isinstance(split, (int, float)) and not isinstance(split, bool) else None
    wanted, source = run.data.validation_fraction, run.data.source
    if run.data.validation is not None:
        return None  # its own validation set (the `validation` channel wins over a split in the train channel)
    if wanted is not None and split is None:
        raise RunValidationError("data.validation_fraction", wanted, f"a split data.source holds: {source} was "
                                 "prepared without one; prepare it again with `spotrun prepare ... "
                                 f"--validation-fraction {wanted:g}` (or give raw text, split when prepared), give "
                                 "data.validation, or drop data.validation_fraction"
                                 + (f" and {run.validation_needed_by}" if run.validation_needed_by else ""))
    if wanted is not None and split is not None and abs(wanted - split) > 1e-9:
        raise RunValidationError("data.validation_fraction", wanted, f"{split:g}, the split data.source holds "
                                 f"({source} was prepared with --validation-fraction {split:g}), or no "
                                 f"data.validation_fraction (the split is used); for another split prepare the data "
                                 f"again with --validation-fraction {wanted:g}")
    if split is None and run.validation_needed_by:
        raise RunValidationError(run.validation_needed_by, "no validation data", f"{_NO_SPLIT_FIX}: data.source "
                                 f"({source}) holds no validation split, and without one the run would train to the "
                                 "end and report no validation loss")
    return split


def check_local_split(run: RunSpec) -> str | None:
    """`spotrun validate`'s check of the validation settings against a local data.source's index.json (read here,
    no network): what was checked, or None when data.source is not a local prepared directory (S3, raw text) or
    the run asks for no split. Refuses as `check_validation` does."""
    source = run.data.source
    if not split_settings(run) or source is None or source.startswith("s3://") or \
            not (Path(source) / DatasetIndex.FILE).is_file():
        return None
    split = check_validation(run, _read_json(source, DatasetIndex.FILE, "data.source", None))
    return f"data.source's validation split against the run's validation settings (it holds {split:g})"


MAX_TOKENIZER_BYTES = 256 << 20  # the largest tokenizer file hashed (the biggest hub tokenizer.json are ~35 MB)


def _model_tokenizer_identity(source: str, s3_client: Any) -> str | None:
    """`tokenizer_identity` of the model directory's defining files, streamed (a local directory or an S3 prefix);
    None when it has none. _Unreadable when it cannot be listed or read here."""
    if not source.startswith("s3://"):
        return directory_tokenizer_identity(source)
    # boto3 takes ~1 s to import: only an s3:// source loads it (the CLI checks local files)
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, prefix = source[len("s3://"):].partition("/")
    prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
    client = s3_client or boto3.client("s3")
    wanted = (TOKENIZER_DEFINITION, *TOKENIZER_VOCABULARY_FILES)
    try:
        listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix, Delimiter="/").get("Contents", [])
        found = {o["Key"][len(prefix):]: o for o in listed if o["Key"][len(prefix):] in wanted}
        for obj in found.values():
            if obj.get("Size", 0) > MAX_TOKENIZER_BYTES:
                raise _Unreadable(f"s3://{bucket}/{obj['Key']} is larger than {MAX_TOKENIZER_BYTES >> 20} MiB")

        def chunks(key: str):
            return client.get_object(Bucket=bucket, Key=key)["Body"].iter_chunks(1 << 20)

        return tokenizer_identity({name: (lambda key=obj["Key"]: chunks(key)) for name, obj in found.items()})
    except (ClientError, BotoCoreError) as exc:
        raise _Unreadable(f"model.source's tokenizer files could not be read: {type(exc).__name__}") from None


def check_tokenizer(run: RunSpec, index: dict, out: Sources, s3_client: Any, offline: bool) -> None:
    """The shards were made with the model's tokenizer: every token id below the model's vocab_size, and the
    tokenizer recorded in index.json (its identity, spotrun.seams.tokenizer_identity) the model.source's own.
    Shards of another tokenizer train without an error, on ids that mean other words: garbage in, a paid run out."""
    config = out.model_config if out.model_config is not None else run.model.config
    vocab, ids = (config or {}).get("vocab_size"), index.get(DatasetIndex.VOCAB_SIZE)
    fix = (f"prepare data.source again with the model's tokenizer (`spotrun prepare INPUT... --tokenizer "
           f"{run.model.source or 'MODEL_DIR'} ...`)")
    if isinstance(vocab, int) and isinstance(ids, int) and not isinstance(ids, bool) and ids > vocab:
        raise RunValidationError("data.source", run.data.source, f"shards made with the model's tokenizer: they were "
                                 f"prepared with a tokenizer of {ids:,} tokens and the model's vocab_size is "
                                 f"{vocab:,} (ids past it index beyond the embedding); {fix}")
    recorded = index.get(DatasetIndex.TOKENIZER)
    if run.model.source is None:
        return  # random weights: no tokenizer of the model's to compare with (the vocab_size above is the check)
    if not isinstance(recorded, str):
        out.notes.append("not checked: data.source's tokenizer (its index.json records none: prepared by an older "
                         "spotrun or from a cached tokenizer name)")
        return
    reason = _unreadable_here(run.model.source) if offline else None
    try:
        if reason:
            raise _Unreadable(reason)
        model = _model_tokenizer_identity(run.model.source, s3_client)
    except _Unreadable as exc:
        if not offline:
            raise RunValidationError("model.source", run.model.source, f"a model directory whose tokenizer files "
                                     f"can be read, to compare with data.source's ({exc})") from None
        out.notes.append(f"not checked: data.source's tokenizer against model.source's ({exc})")
        return
    if model is None:
        out.notes.append(f"not checked: data.source's tokenizer (model.source {run.model.source} holds no "
                         "tokenizer.json or vocabulary file to compare with)")
    elif model != recorded:
        raise RunValidationError("data.source", run.data.source, f"shards made with model.source's tokenizer: its "
                                 f"index.json records tokenizer {recorded[:19]}..., model.source's tokenizer files "
                                 f"are {model[:19]}... ({run.model.source}); {fix}")
    else:
        out.notes.append("data.source was prepared with model.source's tokenizer")


def with_split(run: RunSpec, sources: Sources) -> RunSpec:
    """The run with data.source's validation split as its data.validation_fraction (what the planner and the
    trainer's evaluation hyperparameters follow), when it names none of its own."""
    if sources.split is None or run.data.validation_fraction is not None or run.data.validation is not None:
        return run
    return replace(run, data=replace(run.data, validation_fraction=sources.split))


def _validation_tokens(run: RunSpec, s3_client: Any, offline: bool, notes: list[str]) -> int | None:
    reason = _unreadable_here(run.data.validation) if offline else None
    try:
        if reason:
            raise _Unreadable(reason)
        index = _read_json(run.data.validation, DatasetIndex.FILE, "data.validation", s3_client)
        tokens = _index_tokens(index, "data.validation", run.data.validation)
        notes.append(f"read data.validation's index.json ({run.data.validation}): {tokens:,} tokens")
        return tokens
    except _Unreadable as exc:
        if not offline:
            raise RunValidationError("data.validation", run.data.validation,
                                     f"prepared shards with a readable index.json ({exc})") from None
        notes.append(f"not checked: data.validation ({exc}); its evaluation time is not estimated")
        return None


def resolve(run: RunSpec, s3_client: Any = None) -> tuple[dict | None, int | None]:
    """(model config or None, data tokens or None) read strictly from the run's sources where needed."""
    sources = read_sources(run, s3_client)
    return sources.model_config, sources.tokens
