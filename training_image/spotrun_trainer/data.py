"""Token shards: `prepare` writes them, `TokenShardLoader` reads them back.

Layout of a prepared dataset directory (the index's name, format and the keys read outside the trainer are
spotrun.seams.DatasetIndex):
    tokenizer/            the tokenizer used, copied into the exported model at the end
    index.json            {"format": 1, "dtype": "uint16"|"uint32", "eos_token_id": int, "loss_mask": bool,
                           "vocab_size": int, "documents": int, "tokenizer_sha256": "sha256:..." (the tokenizer's
                           identity, spotrun.seams.tokenizer_identity; null for a cached name),
                           "total_tokens": int, "shards": [{"file": "shard-00000.bin", "tokens": int,
                                                             "mask": "shard-00000.mask" (optional),
                                                             "starts": "shard-00000.starts" (with a mask)}, ...]}
    shard-00000.bin ...   raw little-endian token ids, documents concatenated, each followed by EOS
    shard-00000.mask ...  one uint8 per token: 1 where the loss is taken, 0 where it is masked (only for shards
                          that mask something)
    shard-00000.starts .. little-endian int64 offsets in the shard of the documents that begin in it (beside a
                          mask: chat data, whose conversations may hold EOS tokens of their own, so EOS alone does
                          not tell where one begins; the report's sample prompts start there, samples.py)

With a validation fraction, `prepare` sends each document to `validation/` (the same layout, its own index.json)
or to the training shards by a stable hash of the document's content (`validation_share`): the split is the same
on every run and machine, whatever the order of the files, and no document is in both. index.json then records
{"validation": {"dir": "validation", "fraction": f, "documents": n}}.

Inputs: .txt (blank-line separated documents), JSONL (also gzip-compressed, .jsonl.gz) or Parquet with a text field
(plain text: every token is trained on), or chat records (a JSONL line or a Parquet row) `{"messages": [{"role":
..., "content": ...}, ...]}`: formatted with the tokenizer's chat template, and only the assistant messages' tokens
are trained on (prompt masking: supervised fine-tuning, not continued pre-training). The mask is found by rendering
each conversation's prefixes: the tokens an assistant message adds after the generation prompt are its own (this
needs a template whose prefixes render as prefixes of the whole, which the common templates do; one that does not is
refused).

The loader memory-maps shards and reads each one front to back (friendly to SageMaker FastFile mode, which
streams S3 objects sequentially). Samples are `seq_len` tokens packed from one shard; the shard order of an
epoch is a permutation seeded by (seed, epoch). A global step takes `micro_batch * dp_size` consecutive samples;
data-parallel rank r takes its own contiguous slice of them, so ranks never overlap and the whole position is
one integer: the number of samples consumed in the current epoch.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spotrun.contract.json_text import JsonSyntaxError, loads, with_excerpt
from spotrun.seams import RAW_SUFFIXES, DatasetIndex, directory_tokenizer_identity

log = logging.getLogger(__name__)

DEFAULT_SHARD_BYTES = 256 * 1024 * 1024


class DataError(ValueError):
    """The dataset directory or an input file is unusable; the message says which and why."""


CHAT_ROLES = ("system", "user", "assistant", "tool")
VALIDATION_DIR = "validation"


def validation_share(doc: str | list) -> float:
    """A document's place in [0, 1) by the SHA-256 of its content (chat records as canonical JSON): documents
    below the validation fraction are validation data. Depends on nothing but the document."""
    text = doc if isinstance(doc, str) else json.dumps(doc, sort_keys=True, ensure_ascii=False)
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


INPUT_SUFFIXES = RAW_SUFFIXES  # the raw formats, defined once for the pipeline and the trainer


def input_kind(path: Path) -> str | None:
    """The input format of a file by its name: one of INPUT_SUFFIXES, or None."""
    return next((s for s in INPUT_SUFFIXES if path.name.endswith(s)), None)


def _iter_documents(paths: Iterable[Path], text_field: str) -> Iterator[tuple[str, str | list]]:
    """(where, text) for plain documents, (where, messages) for chat records; `where` is file:line (row for
    Parquet). Bytes that are not UTF-8 are named by file and line, not a traceback."""
    for path in paths:
        kind = input_kind(path)
        if kind == ".parquet":
            yield from _parquet_records(path, text_field)
        elif kind in (".jsonl", ".jsonl.gz"):
            fh = gzip.open(path, "rb") if kind == ".jsonl.gz" else path.open("rb")
            with fh:
                try:
                    for lineno, raw in enumerate(fh, 1):
                        where = f"{path}:{lineno}"
                        line = _utf8(raw, where)
                        if line.strip():
                            yield where, _record(line, where, text_field)
                except (OSError, EOFError) as exc:  # gzip: truncated or not gzip at all
                    raise DataError(f"{path}: not readable as {kind} ({exc})") from None
        elif kind == ".txt":
            data = path.read_bytes()
            text = _utf8(data, str(path))
            # Blank-line separated paragraphs are documents; a file without blank lines is one document.
            for doc in text.split("\n\n"):
                if doc.strip():
                    yield str(path), doc
        else:
            raise DataError(f"{path}: unsupported input type: expected {', '.join(INPUT_SUFFIXES)}")


def _utf8(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        newline = b"\n"
        line_start = raw.rfind(newline, 0, exc.start) + 1
        if ":" not in Path(where).name:  # a whole file: say the line
            where = f"{where}:{raw.count(newline, 0, exc.start) + 1}"
        raise DataError(f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start - line_start + 1});"
                        " convert the file to UTF-8") from None


def _record(line: str, where: str, text_field: str) -> str | list:
    try:
        record = loads(line)
    except JsonSyntaxError as exc:  # one record per line: its column, what it needs there, the line with a caret
        raise DataError(with_excerpt(f"{where}: not valid JSON (at column {exc.column}: expected {exc.expected})",
                                     exc.excerpt)) from None
    except RecursionError:
        raise DataError(f"{where}: not valid JSON (nested too deep)") from None
    if isinstance(record, dict) and "messages" in record:
        return _messages(record["messages"], where)
    if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
        raise DataError(f"{where}: expected an object with a string field {text_field!r} or a "
                        "list of chat messages in 'messages'")
    return record[text_field]


def _parquet_records(path: Path, text_field: str) -> Iterator[tuple[str, str | list]]:
    """Rows of a Parquet file with a string column `text_field` or a `messages` column (list of structs)."""
    import pyarrow.parquet as pq  # pyarrow takes ~1.5 s to import: only Parquet inputs need it

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ...
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None
    names = pf.schema_arrow.names
    column = "messages" if "messages" in names else text_field
    if column not in names:
        raise DataError(f"{path}: expected a column {text_field!r} (text) or 'messages' (chat); found "
                        f"{', '.join(names) or 'none'}")
    row = 0
    for batch in pf.iter_batches(columns=[column], batch_size=1024):
        for value in batch.column(0).to_pylist():
            row += 1
            where = f"{path}:row {row}"
            if column == "messages":
                yield where, _messages(value, where)
            elif not isinstance(value, str):
                raise DataError(f"{where}: column {text_field!r} must be a string, got {type(value).__name__}")
            else:
                yield where, value


def _messages(raw: object, where: str) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        raise DataError(f"{where}: messages must be a non-empty list of {{role, content}} objects")
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in CHAT_ROLES or not isinstance(m.get("content"), str):
            raise DataError(f"{where}: messages[{i}] must be an object with a role ({', '.join(CHAT_ROLES)}) and a "
                            "string content")
    if not any(m["role"] == "assistant" for m in raw):
        raise DataError(f"{where}: no assistant message: nothing to train on (prompt masking keeps only them)")
    return [{"role": m["role"], "content": m["content"]} for m in raw]


def chat_tokens(tokenizer, messages: list[dict], where: str = "chat") -> tuple[list[int], list[int]]:
    """The conversation's token ids (the tokenizer's chat template) and its loss mask: 1 on the tokens of the
    assistant messages, 0 on everything else (system, user, tool messages and the template's markup before them)."""

    def ids(msgs: list[dict], generation_prompt: bool) -> list[int]:
        if not msgs:
            return []
        try:
            text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=generation_prompt)
        except Exception as exc:  # noqa: BLE001 - Jinja raises its own errors (e.g. "roles must alternate")
            raise DataError(f"{where}: the tokenizer's chat template refused this conversation: {exc}") from None
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    full = ids(messages, False)
    mask = [0] * len(full)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt, upto = ids(messages[:i], True), ids(messages[: i + 1], False)
        if full[: len(upto)] != upto or upto[: len(prompt)] != prompt:
            raise DataError(f"{where}: the chat template does not render this conversation's prefixes as "
                            "prefixes of the whole; assistant tokens cannot be located for prompt masking")
        mask[len(prompt): len(upto)] = [1] * (len(upto) - len(prompt))
    return full, mask


def load_tokenizer(name: str):
    """A tokenizer from a local directory or the local Hugging Face cache; never the network."""
    # transformers takes ~5 s to import: the launcher and `spotrun prepare --help` import this module
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - transformers raises OSError, ValueError, ... for missing files
        raise DataError(f"tokenizer={name!r} could not be loaded offline: expected a local directory with a Hugging "
                        f"Face tokenizer (tokenizer.json or tokenizer_config.json) or a name already in the local "
                        f"Hugging Face cache ({type(exc).__name__})") from None


def separator_mask(ids: list[int], doc_mask: list[int], eos: int) -> int:
    """The loss mask of the EOS appended after a document (packed documents are separated by it): trained after
    plain text, and after a conversation whose last trained tokens have no EOS of their own (the EOS ends the
    assistant's turn: learn to stop). NOTE: not trained where the chat template already ends the assistant's turn
    with the EOS token and adds markup after it (ChatML with eos_token <|im_end|>, as Qwen2's instruct tokenizers:
    `...<|im_end|>\n`): the separator would teach "after a newline comes EOS", and the generation prompt ends in
    that newline (`<|im_start|>assistant\n`), so the fine-tuned model answered every prompt with an empty turn."""
    if not doc_mask or all(doc_mask):
        return 1  # plain text is trained in full, its end included
    if not doc_mask[-1]:
        return 0
    return 0 if any(m and t == eos for t, m in zip(ids, doc_mask, strict=True)) else 1


class _ShardWriter:
    """Appends documents' tokens (and loss masks) to `tokens_per_shard`-token shard files in one directory."""

    def __init__(self, out_dir: Path, dtype, tokens_per_shard: int):
        self.out_dir, self.dtype, self.tokens_per_shard = out_dir, dtype, tokens_per_shard
        self.shards: list[dict] = []
        self.buffer: list[int] = []
        self.mask: list[int] = []  # parallel to buffer: 1 where the loss is taken
        self.starts: list[int] = []  # offsets in buffer of the documents' first tokens
        self.documents = 0

    def add(self, ids: list[int], doc_mask: list[int], eos: int) -> None:
        self.starts.append(len(self.buffer))
        self.buffer.extend(ids)
        self.buffer.append(eos)
        self.mask.extend(doc_mask)
        self.mask.append(separator_mask(ids, doc_mask, eos))
        self.documents += 1
        self.flush(final=False)

    @property
    def tokens(self) -> int:
        return sum(s["tokens"] for s in self.shards) + len(self.buffer)

    def flush(self, final: bool) -> None:
        n = self.tokens_per_shard
        while len(self.buffer) >= n or (final and self.buffer):
            chunk, self.buffer = self.buffer[:n], self.buffer[n:]
            chunk_mask, self.mask = self.mask[:n], self.mask[n:]
            chunk_starts = [at for at in self.starts if at < len(chunk)]
            self.starts = [at - len(chunk) for at in self.starts if at >= len(chunk)]
            name = f"shard-{len(self.shards):05d}.bin"
            self.out_dir.mkdir(parents=True, exist_ok=True)
            np.asarray(chunk, dtype=self.dtype).tofile(self.out_dir / name)
            self.shards.append({"file": name, "tokens": len(chunk)})
            if not all(chunk_mask):
                np.asarray(chunk_mask, dtype=np.uint8).tofile(self.out_dir / name.replace(".bin", ".mask"))
                self.shards[-1]["mask"] = name.replace(".bin", ".mask")
                np.asarray(chunk_starts, dtype="<i8").tofile(self.out_dir / name.replace(".bin", ".starts"))
                self.shards[-1]["starts"] = name.replace(".bin", ".starts")

    def index(self, eos: int, vocab_size: int) -> dict:
        self.flush(final=True)
        return {"format": DatasetIndex.FORMAT, "dtype": np.dtype(self.dtype).name, "eos_token_id": eos,
                "loss_mask": any("mask" in s for s in self.shards), DatasetIndex.VOCAB_SIZE: vocab_size,
                DatasetIndex.TOTAL_TOKENS: sum(s["tokens"] for s in self.shards), DatasetIndex.SHARDS: self.shards}


def _one_document_files(files: list[Path], documents: int) -> str:
    """Why so few documents, when .txt files are among the inputs: a document of a .txt file ends at a blank line,
    so a file with one sentence (or record) per line and no blank line is a single document."""
    texts = [f for f in files if input_kind(f) == ".txt"]
    if not texts:
        return ""
    whole = [f for f in texts if "\n\n" not in f.read_text(encoding="utf-8", errors="replace").strip()]
    named = ", ".join(str(f) for f in whole[:3]) + (f" and {len(whole) - 3} more" if len(whole) > 3 else "")
    return (f" ({documents} found: in .txt files documents are separated by blank lines"
            + (f", and {named} {'has' if len(whole) == 1 else 'have'} none, so each is one document" if whole else "")
            + "; put a blank line between documents, or write JSONL with one {\"text\": ...} per line)")


def input_files(inputs: list[Path]) -> list[Path]:
    """The files to tokenize: the files named, and every supported file under the directories named, sorted."""
    files: list[Path] = []
    for item in map(Path, inputs):
        if item.is_dir():
            files.extend(sorted(p for p in item.rglob("*") if p.is_file() and input_kind(p)))
        elif item.is_file():
            if not input_kind(item):
                raise DataError(f"{item}: unsupported input type: expected {', '.join(INPUT_SUFFIXES)}")
            files.append(item)
        else:
            raise DataError(f"input {item} does not exist")
    if not files:
        raise DataError(f"no {', '.join(INPUT_SUFFIXES)} files in {', '.join(map(str, inputs))}")
    return files


def prepare(
    inputs: list[Path],
    tokenizer_path: str,
    out_dir: Path,
    *,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    text_field: str = "text",
    progress_seconds: float = 10.0,
    validation_fraction: float = 0.0,
    allow_empty: bool = False,
) -> dict:
    """Tokenize text/JSONL files into sequential shards plus index.json; returns the index. Progress (documents,
    tokens, rate) is logged every `progress_seconds`. With `validation_fraction` > 0, the documents whose
    `validation_share` is below it go to `out_dir/validation/` instead (prompt masks kept). Inputs without a
    single document are refused, unless `allow_empty` (one instance's part of a preparation job, which the merge
    checks as a whole)."""
    if shard_bytes < 1024:
        raise DataError(f"shard_bytes={shard_bytes} is invalid: expected at least 1024")
    if not 0 <= validation_fraction < 1:
        raise DataError(f"validation_fraction={validation_fraction!r} is invalid: expected a number in [0, 1)")
    files = input_files(inputs)
    tokenizer = load_tokenizer(tokenizer_path)
    eos = tokenizer.eos_token_id
    if eos is None:
        raise DataError(f"tokenizer at {tokenizer_path} has no eos_token_id; documents could not be separated")
    dtype = np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max + 1 else np.uint32
    tokens_per_shard = max(1, shard_bytes // np.dtype(dtype).itemsize)

    out_dir.mkdir(parents=True, exist_ok=True)
    train = _ShardWriter(out_dir, dtype, tokens_per_shard)
    held_out = _ShardWriter(out_dir / VALIDATION_DIR, dtype, tokens_per_shard)
    started = last_report = time.monotonic()
    chats = 0
    for where, doc in _iter_documents(files, text_field):
        if isinstance(doc, list):
            if tokenizer.chat_template is None:
                raise DataError(f"{where}: chat messages need a chat template, and the tokenizer at "
                                f"{tokenizer_path} has none (add one: a chat_template.jinja file beside "
                                "the tokenizer, as transformers saves it, or chat_template in its "
                                "tokenizer_config.json)")
            ids, doc_mask = chat_tokens(tokenizer, doc, where)
            chats += 1
        else:
            ids = tokenizer(doc, add_special_tokens=False)["input_ids"]
            doc_mask = [1] * len(ids)
        writer = held_out if validation_fraction and validation_share(doc) < validation_fraction else train
        writer.add(ids, doc_mask, eos)
        now = time.monotonic()
        if now - last_report >= progress_seconds:
            tokens = train.tokens + held_out.tokens
            log.info("prepare: %d documents (%d chats), %d tokens, %.0f tokens/s, at %s",
                     train.documents + held_out.documents, chats, tokens, tokens / max(now - started, 1e-9), where)
            last_report = now

    documents = train.documents + held_out.documents
    if not allow_empty and (not documents or not train.tokens + held_out.tokens):
        raise DataError(f"{', '.join(map(str, inputs))}: no documents ({documents} documents, 0 tokens): the files "
                        "are empty or hold only blank lines; a dataset needs text to train on")
    identity = directory_tokenizer_identity(tokenizer_path)  # None: a name from the local cache, not a directory
    index = {**train.index(eos, len(tokenizer)), DatasetIndex.DOCUMENTS: train.documents,
             DatasetIndex.TOKENIZER: identity}
    if validation_fraction:
        if not held_out.documents or not train.documents:
            raise DataError(f"validation_fraction={validation_fraction} put {held_out.documents} of {documents} "
                            "documents in the validation set: both sets need at least one; use more documents or "
                            "another fraction" + _one_document_files(files, documents))
        held_out_index = {**held_out.index(eos, len(tokenizer)), DatasetIndex.DOCUMENTS: held_out.documents,
                          DatasetIndex.TOKENIZER: identity}
        (out_dir / VALIDATION_DIR / DatasetIndex.FILE).write_text(json.dumps(held_out_index, indent=2))
        index[DatasetIndex.VALIDATION] = {"dir": VALIDATION_DIR, "fraction": validation_fraction,
                                          "documents": held_out.documents}
    tokenizer.save_pretrained(out_dir / "tokenizer")  # exported beside the trained model
    (out_dir / DatasetIndex.FILE).write_text(json.dumps(index, indent=2))
    log.info("prepared %d tokens (%d documents, %d chats) in %d shards under %s", index[DatasetIndex.TOTAL_TOKENS],
             train.documents, chats, len(index[DatasetIndex.SHARDS]), out_dir)
    return index


def read_index(data_dir: Path) -> dict:
    path = Path(data_dir) / DatasetIndex.FILE
    if not path.is_file():
        raise DataError(f"{path} not found: run `python -m spotrun_trainer prepare` to create the dataset")
    try:
        index = json.loads(path.read_text())
        if index.get("format") != DatasetIndex.FORMAT or index.get("dtype") not in ("uint16", "uint32"):
            raise DataError(f"{path}: unsupported format/dtype {index.get('format')!r}/{index.get('dtype')!r}")
        for shard in index[DatasetIndex.SHARDS]:
            size = (Path(data_dir) / shard["file"]).stat().st_size
            if size != shard["tokens"] * np.dtype(index["dtype"]).itemsize:
                raise DataError(f"{shard['file']}: {size} bytes on disk, index says {shard['tokens']} tokens")
            if "mask" in shard and (Path(data_dir) / shard["mask"]).stat().st_size != shard["tokens"]:
                raise DataError(f"{shard['mask']}: not one byte per token of {shard['file']}")
    except (KeyError, TypeError, json.JSONDecodeError, FileNotFoundError) as exc:
        raise DataError(f"{path} is damaged or does not match its shards: {exc}") from None
    return index


def total_steps(index: dict, *, seq_len: int, samples_per_step: int, epochs: float, max_steps: int) -> int:
    """The run's optimizer steps: `max_steps`, or `epochs` passes over the dataset's samples of `seq_len` tokens
    (each shard's tokens packed on their own), `samples_per_step` at a time (the trainer's and `spotrun local`'s
    one rule)."""
    samples = sum(int(s["tokens"]) // seq_len for s in index[DatasetIndex.SHARDS])
    return max_steps or max(1, int(epochs * samples // samples_per_step))


@dataclass
class LoaderState:
    """Where the data stream stands: samples consumed in the current epoch, and the epoch."""

    epoch: int = 0
    position: int = 0


class TokenShardLoader:
    """Deterministic, resumable packed-sample reader over memory-mapped shards for one data-parallel rank."""

    def __init__(self, data_dir: Path, *, seq_len: int, micro_batch: int, dp_rank: int, dp_size: int, seed: int):
        self.index = read_index(data_dir)
        dtype = np.dtype(self.index["dtype"])
        self.shards = [np.memmap(Path(data_dir) / s["file"], dtype=dtype, mode="r")
                       for s in self.index[DatasetIndex.SHARDS]]
        self.masks = [np.memmap(Path(data_dir) / s["mask"], dtype=np.uint8, mode="r") if "mask" in s else None
                      for s in self.index[DatasetIndex.SHARDS]]
        self.loss_mask = bool(self.index.get("loss_mask", False))
        self.samples_per_shard = [len(s) // seq_len for s in self.shards]
        self.samples_per_epoch = sum(self.samples_per_shard)
        self.global_batch = micro_batch * dp_size
        if self.samples_per_epoch < self.global_batch:
            raise DataError(
                f"dataset has {self.samples_per_epoch} samples of seq_len={seq_len}; one step needs "
                f"micro_batch*dp_size={self.global_batch}: use more data or a shorter seq_len"
            )
        self.seq_len, self.micro_batch, self.dp_rank, self.seed = seq_len, micro_batch, dp_rank, seed
        self.state = LoaderState()
        self._order_epoch = -1
        self._order: list[tuple[int, int]] = []

    def _epoch_order(self, epoch: int) -> list[tuple[int, int]]:
        if self._order_epoch != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            order = []
            for shard in rng.permutation(len(self.shards)).tolist():
                order.extend((shard, i) for i in range(self.samples_per_shard[shard]))
            self._order, self._order_epoch = order, epoch
        return self._order

    def _next_rows(self) -> list[tuple[int, int]]:
        if self.state.position + self.global_batch > self.samples_per_epoch:
            self.state = LoaderState(epoch=self.state.epoch + 1, position=0)
        order = self._epoch_order(self.state.epoch)
        start = self.state.position + self.dp_rank * self.micro_batch
        self.state = LoaderState(self.state.epoch, self.state.position + self.global_batch)
        return order[start : start + self.micro_batch]

    def next_batch(self) -> np.ndarray:
        """The next micro-batch of this rank, shape (micro_batch, seq_len), as int64."""
        return self._tokens(self._next_rows())

    def _tokens(self, rows: list[tuple[int, int]]) -> np.ndarray:
        span = self.seq_len
        return np.stack([np.asarray(self.shards[s][i * span : (i + 1) * span], dtype=np.int64) for s, i in rows])

    def next_inputs(self) -> dict[str, np.ndarray]:
        """The next micro-batch as the model's keyword arguments: input_ids and labels (the same tokens, -100
        where the loss is masked). How the loss is normalised (the step's trained tokens) is the trainer's
        business: see loss.StepTokens."""
        return self.inputs_for(self._next_rows())

    def inputs_for(self, rows: list[tuple[int, int]]) -> dict[str, np.ndarray]:
        """The samples `rows` ((shard, sample) pairs) as input_ids and labels (see next_inputs)."""
        ids = self._tokens(rows)
        if not self.loss_mask:
            return {"input_ids": ids, "labels": ids}
        span = self.seq_len
        keep = np.stack([np.ones(span, dtype=bool) if self.masks[s] is None
                         else np.asarray(self.masks[s][i * span : (i + 1) * span], dtype=bool) for s, i in rows])
        return {"input_ids": ids, "labels": np.where(keep, ids, -100)}

    def state_dict(self) -> dict:
        return {"epoch": self.state.epoch, "position": self.state.position, "global_batch": self.global_batch}

    def load_state_dict(self, sd: dict) -> None:
        epoch, position = int(sd["epoch"]), int(sd["position"])
        if int(sd.get("global_batch", self.global_batch)) != self.global_batch:
            # A different world size changes the batch; the sample position (not the step) is what carries over.
            log.warning("data: global batch was %s, now %s; resuming at sample %d of epoch %d",
                        sd.get("global_batch"), self.global_batch, position, epoch)
        self.state = LoaderState(epoch, position)
