"""Local assets for runs without a hub: a corpus, a tokenizer trained on it, a small model saved from a config.

Used by `make demo`, the tests and the benchmarks: nothing is downloaded; a model directory is written with
`save_pretrained` and read back with `from_pretrained`, exactly as the image reads the `model` channel.
Two corpora: short synthetic sentences (tests: a model learns them quickly), and the Python standard library's
own sources (the demo: real text present on every machine with Python).
"""

from __future__ import annotations

import json
import random
import sysconfig
from pathlib import Path

from ..seams import DatasetIndex

ARCHITECTURES = {
    "llama": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
              "tie_word_embeddings": False},
    "qwen2": {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
              "tie_word_embeddings": True},
    "gpt2": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256,
             "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1},
}

_SUBJECTS = ["the cat", "a dog", "the spot instance", "our model", "the checkpoint", "a node", "the budget"]
_VERBS = ["saves", "loads", "trains", "watches", "resumes", "shards", "exports"]
_OBJECTS = ["the weights", "a shard", "the optimizer", "every step", "the manifest", "its data", "the loss"]


def write_corpus(path: Path, *, documents: int = 400, seed: int = 0) -> Path:
    """A JSONL corpus of short, regular sentences (a model can learn them, so loss falls)."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for _ in range(documents):
            sentences = [f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}."
                         for _ in range(rng.randint(3, 8))]
            fh.write(json.dumps({"text": " ".join(sentences)}) + "\n")
    return path


def write_stdlib_corpus(path: Path, *, max_bytes: int = 2_000_000) -> Path:
    """A JSONL corpus of this Python's standard library sources, one document per module, in path order.

    Test suites and vendored packages are left out; files are taken in sorted order while they fit in
    `max_bytes`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "__pycache__"}
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with path.open("w") as fh:
        for source in sorted(root.rglob("*.py")):
            if skip & set(source.relative_to(root).parts):
                continue
            try:
                text = source.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if written + len(text) > max_bytes:
                continue  # too big for what is left: smaller modules may still fit
            fh.write(json.dumps({"text": text}) + "\n")
            written += len(text)
    if not written:
        raise FileNotFoundError(f"no Python sources found under {root}")
    return path


def train_tokenizer(corpus: Path, out_dir: Path, vocab_size: int = 256):
    """A byte-level BPE tokenizer trained on a JSONL corpus, saved as a HF fast tokenizer."""
    # tokenizers and transformers are optional for the CLI: only building the demo's assets needs them
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [json.loads(line)["text"] for line in corpus.read_text().splitlines() if line.strip()]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")
    fast.save_pretrained(out_dir)
    return fast


def save_model(spec: dict, out_dir: Path, *, vocab_size: int, seed: int = 0, tokenizer_dir: Path | None = None) -> Path:
    """A model of the HF config `spec` (with `model_type`), randomly initialised from `seed` and saved with
    save_pretrained (plus the tokenizer): a directory shaped exactly like a pretrained model's."""
    # torch and transformers (~6-8 s to import) are optional for the CLI: only building the demo's assets needs them
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a one-shard save: the bar says nothing
    spec = dict(spec)
    model_type = spec.pop("model_type")
    config = AutoConfig.for_model(model_type, vocab_size=vocab_size, bos_token_id=0, eos_token_id=0, **spec)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(out_dir)
    if tokenizer_dir is not None:
        AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out_dir)
    return Path(out_dir)


def save_tiny_model(arch: str, out_dir: Path, *, vocab_size: int, seed: int = 0, tokenizer_dir: Path | None = None,
                    **overrides) -> Path:
    """A small model of one of ARCHITECTURES (with overrides), saved like a pretrained one."""
    return save_model(dict(ARCHITECTURES[arch], **overrides), out_dir, vocab_size=vocab_size, seed=seed,
                      tokenizer_dir=tokenizer_dir)


def build_example(root: Path, arch: str = "llama", *, documents: int = 400, shard_bytes: int = 16 * 1024,
                  validation_fraction: float = 0.1) -> dict:
    """Corpus, tokenizer, model dir and prepared shards under root (with `validation_fraction` of the documents
    held out in data/validation, which the launcher evaluates on); returns their paths."""
    # the trainer package is optional for the CLI (OPTIONAL_MODULES in cli/main.py)
    from spotrun_trainer.data import prepare

    root = Path(root)
    corpus = write_corpus(root / "corpus" / "train.jsonl", documents=documents)
    tok = train_tokenizer(corpus, root / "tokenizer")
    model_dir = save_tiny_model(arch, root / f"model-{arch}", vocab_size=len(tok), tokenizer_dir=root / "tokenizer")
    data_dir = root / "data"
    if not (data_dir / DatasetIndex.FILE).exists():
        prepare([corpus], str(root / "tokenizer"), data_dir, shard_bytes=shard_bytes,
                validation_fraction=validation_fraction)
    return {"corpus": corpus, "tokenizer": root / "tokenizer", "model": model_dir, "data": data_dir}
