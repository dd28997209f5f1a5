"""Exact parameter counts of decoder LMs from their Hugging Face config (no torch, no transformers).

Supported shapes: Llama, Mistral, Qwen2 (and Qwen2-style q/k/v biases), GPT-2. The counts match what
`AutoModelForCausalLM.from_config(config)` builds (checked in tests against transformers itself), including tied
input/output embeddings. LoRA adapters: rank r on a linear layer of shape (in, out) adds r * (in + out).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..contract.spec import ABSENT, RunValidationError

LLAMA_LIKE = ("llama", "mistral", "qwen2")
SUPPORTED = LLAMA_LIKE + ("gpt2",)


@dataclass(frozen=True)
class Linear:
    name: str
    fan_in: int
    fan_out: int
    bias: bool


@dataclass(frozen=True)
class Shape:
    """What a decoder LM is made of: the linear layers of one block, and everything else; read once from its config
    (`shape_of`), then passed down (the parameter count, the memory model's dimensions, the measured shape's key)."""

    layers: int
    block_linears: tuple[Linear, ...]
    block_other: int  # norms etc. per block
    outside_blocks: int  # embeddings, final norm, untied head
    model_type: str  # the config's: llama, mistral, qwen2 or gpt2
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool  # input and output embeddings shared

    @property
    def total(self) -> int:
        per_block = sum(lin.fan_in * lin.fan_out + (lin.fan_out if lin.bias else 0) for lin in self.block_linears)
        return self.layers * (per_block + self.block_other) + self.outside_blocks


MAX_DIMENSION = 1 << 24  # larger than any real model's; keeps every count a finite float in the planner


def _get(cfg: dict, key: str, default=None, *, required: bool = True):
    value = cfg.get(key)
    if value is None:  # absent or null: the HF default
        value = default
    if required and value is None:
        raise RunValidationError(f"model.config.{key}", ABSENT if key not in cfg else None,
                                 "a value (needed to count parameters)")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_DIMENSION):
        raise RunValidationError(f"model.config.{key}", value, f"a positive integer <= {MAX_DIMENSION:,}")
    return value


def _flag(cfg: dict, key: str, default: bool) -> bool:
    """A boolean the count depends on; "false" (a string) is refused rather than read as true."""
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RunValidationError(f"model.config.{key}", value, "true or false (a JSON boolean: the parameter "
                                 "count depends on it)")
    return value


def shape_of(cfg: dict) -> Shape:
    model_type = cfg.get("model_type")
    if model_type in LLAMA_LIKE:
        return _llama_like(cfg, model_type)
    if model_type == "gpt2":
        return _gpt2(cfg)
    raise RunValidationError("model.config.model_type", model_type,
                             f"one of {', '.join(SUPPORTED)} (or give model.parameters)")


def _llama_like(cfg: dict, model_type: str) -> Shape:
    h = _get(cfg, "hidden_size")
    heads = _get(cfg, "num_attention_heads")
    kv = _get(cfg, "num_key_value_heads", heads)
    head_dim = _get(cfg, "head_dim", h // heads)
    inter = _get(cfg, "intermediate_size")
    vocab = _get(cfg, "vocab_size")
    layers = _get(cfg, "num_hidden_layers")
    tied = _flag(cfg, "tie_word_embeddings", False)  # the HF default of all three configs
    attention_bias = _flag(cfg, "attention_bias", False)
    qkv_bias = model_type == "qwen2" or attention_bias
    o_bias = model_type != "qwen2" and attention_bias
    mlp_bias = _flag(cfg, "mlp_bias", False)
    linears = (
        Linear("q_proj", h, heads * head_dim, qkv_bias),
        Linear("k_proj", h, kv * head_dim, qkv_bias),
        Linear("v_proj", h, kv * head_dim, qkv_bias),
        Linear("o_proj", heads * head_dim, h, o_bias),
        Linear("gate_proj", h, inter, mlp_bias),
        Linear("up_proj", h, inter, mlp_bias),
        Linear("down_proj", inter, h, mlp_bias),
    )
    outside = vocab * h + h + (0 if tied else vocab * h)  # embeddings, final RMSNorm, lm_head
    return Shape(layers=layers, block_linears=linears, block_other=2 * h, outside_blocks=outside,
                 model_type=model_type, hidden=h, heads=heads, kv_heads=kv, head_dim=head_dim, intermediate=inter,
                 vocab=vocab, tied=tied)


def _gpt2(cfg: dict) -> Shape:
    e = _get(cfg, "n_embd", 768)
    heads = _get(cfg, "n_head", 12)
    layers = _get(cfg, "n_layer", 12)
    vocab = _get(cfg, "vocab_size", 50257)
    positions = _get(cfg, "n_positions", 1024)
    inner = _get(cfg, "n_inner", None, required=False) or 4 * e
    tied = _flag(cfg, "tie_word_embeddings", True)
    linears = (  # GPT-2's Conv1D layers are linear layers (LoRA/peft treats them so)
        Linear("c_attn", e, 3 * e, True),
        Linear("c_proj", e, e, True),
        Linear("c_fc", e, inner, True),
        Linear("c_proj", inner, e, True),
    )
    outside = vocab * e + positions * e + 2 * e + (0 if tied else vocab * e)  # wte, wpe, ln_f, head
    return Shape(layers=layers, block_linears=linears, block_other=4 * e, outside_blocks=outside, model_type="gpt2",
                 hidden=e, heads=heads, kv_heads=heads, head_dim=e // heads, intermediate=inner, vocab=vocab,
                 tied=tied)


def lora_parameters(shape: Shape, rank: int, targets: tuple[str, ...] | str) -> int:
    """Adapter parameters for rank r on the targeted linear layers of every block (`all-linear`: all of them)."""
    names = {lin.name for lin in shape.block_linears}
    chosen = [lin for lin in shape.block_linears if targets == "all-linear" or lin.name in targets]
    if targets != "all-linear":
        unknown = sorted(set(targets) - names)
        if unknown:
            raise RunValidationError("training.lora.target_modules", unknown[0],
                                     f"a linear layer of the blocks: {', '.join(sorted(names))}")
    return shape.layers * sum(rank * (lin.fan_in + lin.fan_out) for lin in chosen)
