"""The planner page's table of plans (docs/planner.md): Llama 3.1 8B full, 70B full and 70B LoRA at 2,048 and
8,192 tokens per sample.

`python -m spotrun.planner.plans` prints the markdown table from the shipped catalog; tests/spotrun/test_memory_plans.py
checks the same plans (memory under the usable fraction with activations, 70B full on several EFA nodes).
Each run: 100M tokens, one epoch, 8 samples per GPU and optimizer step (micro_batch x grad_accum), managed spot.
"""

from __future__ import annotations

from ..contract.spec import parse_run
from .estimate import Estimate, estimate

# config.json of meta-llama/Llama-3.1-8B and -70B (the fields the parameter count and memory model read)
LLAMA_31_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
               "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
               "tie_word_embeddings": False}
LLAMA_31_70B = {**LLAMA_31_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                "num_attention_heads": 64}
MODELS = {"Llama 3.1 8B full": (LLAMA_31_8B, "full"), "Llama 3.1 70B full": (LLAMA_31_70B, "full"),
          "Llama 3.1 70B LoRA": (LLAMA_31_70B, "lora")}
PLAN_RUNS = [(name, seq) for name in MODELS for seq in (2048, 8192)]


def plan_run(name: str, seq_len: int, catalog: dict | None = None) -> Estimate:
    config, method = MODELS[name]
    training = {"method": method, "micro_batch": 1, "grad_accum": 8}
    if method == "lora":
        training["lora"] = {"rank": 16, "target_modules": "all-linear"}
    run = parse_run({"version": 1, "name": "plan", "model": {"config": config},
                     "data": {"tokens": 100_000_000, "seq_len": seq_len}, "training": training,
                     "budget": {"max_usd": 1_000_000}})
    return estimate(run, catalog=catalog)


def table(catalog: dict | None = None) -> str:
    rows = ["| run | tokens/sample | plan | micro-batch x accum, AC | per-GPU memory (GB): state + gathered + "
            "activations + logits = total / usable | compute / comm per micro-batch | wall | spot cost | "
            "checkpoint |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name, seq in PLAN_RUNS:
        e = plan_run(name, seq, catalog)
        m = {k: v / 1e9 for k, v in e.memory_per_gpu.items()}
        sharding = e.sharding if e.sharding == "full" else f"hybrid, groups of {e.shard_group_nodes} node(s)"
        rows.append(
            f"| {name} | {seq:,} | {e.instance_count} x {e.instance_type}, {sharding} | {e.micro_batch} x "
            f"{e.grad_accum}, {'on' if e.activation_checkpointing else 'off'} | {m['state']:.1f} + "
            f"{m['gathered']:.1f} + {m['activations']:.1f} + {m['logits']:.1f} = {m['total']:.1f} / "
            f"{m['usable']:.1f} | {e.seconds_per_micro_batch['compute']:.2f} s / "
            f"{e.seconds_per_micro_batch['communication']:.2f} s | {e.wall_seconds / 3600:.1f} h | "
            f"${e.cost_usd['spot']:,.0f} | {e.checkpoint_bytes / 1e9:,.0f} GB, "
            f"{e.checkpoint_policy.replace('_', ' ')} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
