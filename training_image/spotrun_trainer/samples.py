"""Sample generations a user reads beside the loss: `samples.json` beside the exported model.

After the export, rank 0 loads the exported weights from output_dir (the files a user gets, not the training
copy) and the base model (model.path), and generates greedily from the same fixed prompts: the first
`eval.samples` validation samples' first `eval.sample_prompt_tokens` tokens (chat data: a conversation of the
sample from its start up to an assistant turn, see `prompts`), at most `eval.sample_new_tokens` new
tokens each, ending at the model's end-of-sequence token as a user's `generate` does (its generation config's
`eos_token_id`: a chat model's end of turn), without sampling: the same tokens on every machine that computes the
same logits. The file
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

import numpy as np
import torch

from spotrun.seams import SAMPLES_FILE, Method
from spotrun.settings.tree import TrainConfig

from .data import TokenShardLoader

log = logging.getLogger(__name__)

SAMPLES_FORMAT = 1


CHAT_CONTEXT = 4  # chat prompts keep up to this many times prompt_tokens before the assistant's turn


def prompts(validation_dir: Path, *, seq_len: int, count: int, prompt_tokens: int) -> tuple[list[list[int]], bool]:
    """The first `count` validation samples' first `prompt_tokens` tokens (fewer samples if the set is smaller).
    Chat data (a loss mask) is asked as a user would: each prompt is a conversation from its first token up to an
    assistant turn in the sample (after the template's generation prompt; `chat_prompt`); a sample with no turn
    beginning in it falls back to its first tokens. Returns the prompts and whether any ends at an assistant turn."""
    reader = TokenShardLoader(validation_dir, seq_len=seq_len, micro_batch=1, dp_rank=0, dp_size=1, seed=0)
    rows = [(s, i) for s, n in enumerate(reader.samples_per_shard) for i in range(n)][:count]
    if not rows:
        return [], False
    batch = reader.inputs_for(rows)
    out, at_turns = [], False
    for (shard, sample), row, labels in zip(rows, batch["input_ids"], batch["labels"], strict=True):
        turns = [sample * seq_len + i for i in range(1, len(row)) if labels[i] != -100 and labels[i - 1] == -100]
        starts = reader.index["shards"][shard].get("starts")
        found = chat_prompt(reader.shards[shard], turns, CHAT_CONTEXT * prompt_tokens,
                            None if starts is None else np.fromfile(Path(validation_dir) / starts, dtype="<i8"))
        if found:  # a fixed window would start mid-turn and ask the model to continue someone else's words
            out.append(found)
            at_turns = True
        else:
            out.append([int(t) for t in row[:prompt_tokens]])
    return out, at_turns


def chat_prompt(tokens, turns: list[int], most: int, starts) -> list[int]:
    """The prompt of a chat sample: its conversation from its first token up to the beginning of an assistant turn,
    [] when `turns` (offsets in the shard `tokens` where a trained run begins) holds none. The first turn whose
    conversation begins in the shard at most `most` tokens before it is taken, else the first whose conversation
    begins in the shard, with its last `most` tokens, else the first: never a token of the conversation before
    (packed shards hold them back to back). `starts`: the offsets of the documents that begin in the shard
    (data.py's `.starts`; None in shards prepared before they were recorded, where the context is the `most`
    tokens before the first turn, whichever conversation they are of)."""
    spans = []  # (first token of the context, the turn, whether that is its conversation's first token)
    for at in turns:
        if starts is None:
            spans.append((max(0, at - most), at, False))
            continue
        i = int(np.searchsorted(starts, at, side="right")) - 1
        begin = int(starts[i]) if i >= 0 else 0  # begun in an earlier shard: every token before `at` is its own
        if begin < at:  # a trained run at a document's first token is plain text that follows, not a turn
            spans.append((begin, at, i >= 0))
    if not spans:
        return []
    # the first whole conversation that fits, else the first whole one, else the first (min keeps the first)
    begin, at, _ = min(spans, key=lambda span: (not span[2], span[1] - span[0] > most))
    return [int(t) for t in tokens[max(begin, at - most):at]]


def generate(model, prompt_ids: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Greedy continuations (new tokens only, the end-of-sequence token included where the model says it) of each
    prompt, one at a time (no padding to get wrong). NOTE: no `min_new_tokens`: it suppresses the end-of-sequence
    token, and a new user read a fine-tuned chat model's answer run on past its end of turn ('... Contact support if
    it fails. Contact support if it') where their own `generate` stopped."""
    model.eval()
    out = []
    with torch.no_grad():
        for ids in prompt_ids:
            tokens = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                    max_new_tokens=new_tokens, do_sample=False,
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
