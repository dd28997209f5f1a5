"""Sample generations a user reads beside the loss: `samples.json` beside the exported model.

After the export, rank 0 loads the exported weights from output_dir (the files a user gets, not the training
copy) and the base model (model.path), and generates greedily from the same fixed prompts: the first
`eval.samples` validation samples' first `eval.sample_prompt_tokens` tokens (chat data: the sample's context up to
its first assistant turn, see `prompts`), `eval.sample_new_tokens` new tokens
each (no sampling, no early stop: the same tokens on every machine that computes the same logits). The file
(spotrun.seams.SAMPLES_FILE):

    {"format": 1, "prompt_tokens": P, "new_tokens": T, "base": "model.path" | null,
     "prompt_ends": "assistant turn" (chat data) | "first tokens",
     "samples": [{"prompt_ids", "prompt", "base_ids", "base", "tuned_ids", "tuned"}, ...]}

Text fields are null without a tokenizer in the export; `base`/`base_ids` are null when the model was built from
a config (no pretrained base to compare with). The report (spotrun/pipeline/report.py) prints them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from spotrun.seams import SAMPLES_FILE, Method
from spotrun.settings.tree import TrainConfig

from .data import TokenShardLoader

log = logging.getLogger(__name__)

SAMPLES_FORMAT = 1


CHAT_CONTEXT = 4  # chat prompts keep up to this many times prompt_tokens before the assistant's turn


def prompts(validation_dir: Path, *, seq_len: int, count: int, prompt_tokens: int) -> tuple[list[list[int]], bool]:
    """The first `count` validation samples' first `prompt_tokens` tokens (fewer samples if the set is smaller).
    Chat data (a loss mask) is asked as a user would: each prompt ends where the sample's first assistant turn
    begins (after the template's generation prompt) and keeps at most CHAT_CONTEXT x prompt_tokens tokens before
    it; a sample with no turn beginning in it falls back to its first tokens. Returns the prompts and whether any
    ends at an assistant turn."""
    reader = TokenShardLoader(validation_dir, seq_len=seq_len, micro_batch=1, dp_rank=0, dp_size=1, seed=0)
    rows = [(s, i) for s, n in enumerate(reader.samples_per_shard) for i in range(n)][:count]
    if not rows:
        return [], False
    batch = reader.inputs_for(rows)
    out, at_turns = [], False
    for (shard, sample), row, labels in zip(rows, batch["input_ids"], batch["labels"], strict=True):
        starts = [i for i in range(1, len(row)) if labels[i] != -100 and labels[i - 1] == -100]
        if starts:  # a fixed window would start mid-turn and ask the model to continue someone else's words
            at = sample * seq_len + starts[0]  # in the shard: the context may begin before the window
            out.append([int(t) for t in reader.shards[shard][max(0, at - CHAT_CONTEXT * prompt_tokens):at]])
            at_turns = True
        else:
            out.append([int(t) for t in row[:prompt_tokens]])
    return out, at_turns


def generate(model, prompt_ids: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Greedy continuations (new tokens only) of each prompt, one at a time (no padding to get wrong)."""
    model.eval()
    out = []
    with torch.no_grad():
        for ids in prompt_ids:
            tokens = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                    max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                    pad_token_id=0)
            out.append([int(t) for t in tokens[0, len(ids):]])
    return out


def load_exported(cfg: TrainConfig, out: Path):
    """The exported model as a user loads it: the merged or full weights, or the base with the adapter."""
    # Imported here: only rank 0 at the end of a run needs the loaders (transformers/peft import in seconds).
    from transformers import AutoModelForCausalLM

    if cfg.training.method != Method.LORA:
        return AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    from peft import PeftModel  # LoRA only (see load_exported)

    return PeftModel.from_pretrained(load_base(cfg), out)


def load_base(cfg: TrainConfig):
    from transformers import AutoModelForCausalLM  # see load_exported

    return AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=torch.float32)


def _tokenizer(out: Path):
    from transformers import AutoTokenizer  # see load_exported

    return AutoTokenizer.from_pretrained(out) if (out / "tokenizer_config.json").exists() else None


def write_samples(cfg: TrainConfig, out: Path) -> Path | None:
    """samples.json in `out` (rank 0, after the export); None without validation data or with eval.samples 0."""
    if not cfg.data.validation_path or cfg.eval.samples == 0:
        return None
    asked, at_turns = prompts(Path(cfg.data.validation_path), seq_len=cfg.data.seq_len, count=cfg.eval.samples,
                    prompt_tokens=min(cfg.eval.sample_prompt_tokens, cfg.data.seq_len))
    new = cfg.eval.sample_new_tokens
    tuned = generate(load_exported(cfg, out), asked, new)
    base = generate(load_base(cfg), asked, new) if cfg.model.path else [None] * len(asked)
    tok = _tokenizer(out)

    def text(ids):
        return tok.decode(ids) if tok is not None and ids is not None else None

    doc = {"format": SAMPLES_FORMAT, "prompt_tokens": min(cfg.eval.sample_prompt_tokens, cfg.data.seq_len),
           "new_tokens": new, "base": "model.path" if cfg.model.path else None,
           "prompt_ends": "assistant turn" if at_turns else "first tokens",
           "samples": [{"prompt_ids": p, "prompt": text(p), "base_ids": b, "base": text(b),
                        "tuned_ids": t, "tuned": text(t)} for p, b, t in zip(asked, base, tuned, strict=True)]}
    path = out / SAMPLES_FILE
    path.write_text(json.dumps(doc, indent=2) + "\n")
    log.info("samples: %d generations from the exported weights in %s", len(asked), path)
    return path
