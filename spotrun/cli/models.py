"""A Hugging Face model directory, checked before it is uploaded, and its upload to `models/<name>/`.

What the trainer's `model` channel needs (spotrun_trainer/model.py loads it with from_pretrained): config.json with
a `model_type` transformers knows as a causal LM, the weights as safetensors, either one `model.safetensors` or the
shards its `model.safetensors.index.json` names (every shard present, every tensor of the weight map in its shard,
every file as long as its header says: a truncated copy is caught here, not in the job), and a tokenizer that
transformers loads offline. Headers are read as the safetensors format defines them (8 bytes of little-endian
header length, then a JSON header with each tensor's `data_offsets`), without torch.

The upload writes the directory's top-level files (subfolders are not what from_pretrained loads), the weights and
the tokenizer first and config.json last: the estimate reads config.json, so a
half-uploaded model is not taken for a whole one. A prefix that already holds a config.json is refused rather
than mixed (choose another --name).
"""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..contract.json_text import JsonSyntaxError, loads, with_excerpt
from ..contract.strict_json import show

INDEX = "model.safetensors.index.json"
MAX_HEADER = 100 * 1024 * 1024  # safetensors caps its header at 100 MB


class ModelDirError(ValueError):
    """The directory is not a loadable model; the message names the file and what is wrong."""


@dataclass
class CheckedModel:
    path: Path
    model_type: str
    weight_files: list[str]
    tensors: int
    parameters: int
    tokenizer_files: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{self.model_type}, {self.parameters:,} parameters in {self.tensors} tensors, "
                f"{len(self.weight_files)} safetensors file(s), tokenizer {', '.join(self.tokenizer_files)}")

    def to_json(self) -> dict:
        return {"model_type": self.model_type, "weight_files": self.weight_files, "tensors": self.tensors,
                "parameters": self.parameters, "tokenizer_files": self.tokenizer_files}


def safetensors_header(path: Path) -> dict:
    """The tensors of one safetensors file ({name: {dtype, shape, data_offsets}}), checked against its size."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                raise ModelDirError(f"{path}: {len(raw)} bytes: not a safetensors file")
            (length,) = struct.unpack("<Q", raw)
            if length > MAX_HEADER:
                raise ModelDirError(f"{path}: header length {length} is not a safetensors header")
            header = json.loads(fh.read(length))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelDirError(f"{path}: not a readable safetensors file ({exc})") from None
    header.pop("__metadata__", None)
    end = max((int(t["data_offsets"][1]) for t in header.values()), default=0)
    size = path.stat().st_size
    if size < 8 + length + end:
        raise ModelDirError(f"{path}: {size:,} bytes, its header needs {8 + length + end:,}: the file is truncated "
                            "(an incomplete download or copy)")
    return header


def _weights(root: Path) -> tuple[list[str], dict]:
    index_path = root / INDEX
    if index_path.is_file():
        try:
            weight_map = loads(index_path.read_text(encoding="utf-8"))["weight_map"]
        except JsonSyntaxError as exc:
            raise ModelDirError(with_excerpt(f"{index_path}: not valid JSON ({exc.where_what}): expected a "
                                             "safetensors index with a weight_map", exc.excerpt)) from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ModelDirError(f"{index_path}: not a safetensors index with a weight_map ({exc})") from None
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (root / f).is_file()]
        if missing:
            raise ModelDirError(f"{index_path} names {len(files)} shard(s); missing: {', '.join(missing[:5])}")
        headers = {f: safetensors_header(root / f) for f in files}
        for tensor, file in weight_map.items():
            if tensor not in headers[file]:
                raise ModelDirError(f"{index_path}: tensor {tensor} is mapped to {file}, which does not hold it")
        return files, {k: v for h in headers.values() for k, v in h.items()}
    if (root / "model.safetensors").is_file():
        return ["model.safetensors"], safetensors_header(root / "model.safetensors")
    other = sorted(p.name for p in root.glob("*.bin")) or sorted(p.name for p in root.glob("*.pt*"))
    hint = f" (found {', '.join(other[:3])}: save it with save_pretrained(safe_serialization=True))" if other else ""
    raise ModelDirError(f"{root}: no model.safetensors or {INDEX}{hint}")


def check_weights(root: Path) -> list[str]:
    """The safetensors files the trainer will load from `root`; raises ModelDirError when one is missing or
    truncated (a copy or download that stopped early), as check_model_dir does."""
    return _weights(root)[0]


def check_model_dir(path: Path) -> CheckedModel:
    """Raises ModelDirError unless `path` holds a model the trainer can load (see the module docstring)."""
    root = Path(path)
    if not root.is_dir():
        raise ModelDirError(f"{root} is not a directory (expected a Hugging Face model directory)")
    try:
        config = loads((root / "config.json").read_text(encoding="utf-8"))
    except OSError:
        raise ModelDirError(f"{root}: no config.json (expected save_pretrained's layout)") from None
    except JsonSyntaxError as exc:
        raise ModelDirError(with_excerpt(f"{root / 'config.json'}: not valid JSON ({exc.where_what})", exc.excerpt)
                            ) from None
    except (UnicodeDecodeError, RecursionError, ValueError):
        raise ModelDirError(f"{root / 'config.json'}: not a JSON text in UTF-8 (expected a model's config.json)"
                            ) from None
    # transformers is optional for the CLI (OPTIONAL_MODULES in main.py) and takes ~5 s to import
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type not in CONFIG_MAPPING_NAMES or model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelDirError(f"{root / 'config.json'}: model_type={show(model_type)} is not a causal LM transformers "
                            "knows")
    files, tensors = _weights(root)
    parameters = 0
    for t in tensors.values():
        n = 1
        for d in t["shape"]:
            n *= int(d)
        parameters += n
    tokenizer = sorted(p.name for p in root.iterdir() if p.name in ("tokenizer.json", "tokenizer_config.json",
                                                                     "tokenizer.model", "chat_template.jinja"))
    if not {"tokenizer.json", "tokenizer_config.json"} & set(tokenizer):
        raise ModelDirError(f"{root}: no tokenizer (tokenizer.json or tokenizer_config.json): the run's raw text and "
                            "the exported model need it")
    # the trainer package (numpy, transformers) is optional for the CLI: OPTIONAL_MODULES in main.py
    from spotrun_trainer.data import DataError, load_tokenizer

    try:
        load_tokenizer(str(root))
    except DataError as exc:
        raise ModelDirError(f"{root}: the tokenizer does not load ({exc})") from None
    return CheckedModel(root, model_type, files, len(tensors), parameters, tokenizer)


def model_uri(bucket: str, name: str) -> str:
    return f"s3://{bucket}/models/{name}/"


def upload_model(s3: Any, path: Path, bucket: str, name: str, *, emit: Callable[[str], None] = print) -> dict:
    """Every top-level file of the (checked) directory to models/<name>/, config.json last; {"uri", "uploaded",
    "bytes"}."""
    prefix = f"models/{name}/"
    uri = model_uri(bucket, name)
    if s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "config.json").get("KeyCount", 0):
        raise ModelDirError(f"{uri} already holds a model (its config.json): choose another --name")
    root = Path(path)
    # The top level only, as from_pretrained reads it: `hf download --local-dir` leaves .cache/ in the directory,
    # and hub repositories carry other formats in subfolders (original/*.pth, as large as the model).
    files = sorted(p for p in root.iterdir() if p.is_file() and p.name != "config.json")
    skipped = sorted(f"{p.name}/" for p in root.iterdir() if p.is_dir())
    if skipped:
        emit(f"[upload-model] left out (subfolders the trainer does not load): {', '.join(skipped)}")
    t0, total = time.monotonic(), 0
    for file in [*files, root / "config.json"]:
        s3.upload_file(str(file), bucket, prefix + file.relative_to(root).as_posix())
        total += file.stat().st_size
    seconds = time.monotonic() - t0
    emit(f"[upload-model] {len(files) + 1} files, {total / 1e6:.1f} MB in {seconds:.1f} s to {uri}")
    return {"uri": uri, "uploaded": True, "bytes": total}
