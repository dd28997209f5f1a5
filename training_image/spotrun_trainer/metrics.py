"""The trainer's metric log line, the matching SageMaker MetricDefinitions, and MFU.

One form, written every `log_every` steps by rank 0 and parsed by CloudWatch (through MetricDefinitions) and by
the tests and benchmarks:

    step=120 loss=2.3100 lr=1.9e-05 grad_norm=0.82 tokens_per_s=3150 mfu=0.41 mem_gb=61.2

`mfu` is `na` when the device's peak is unknown (no guess). Each evaluation (evaluate.py) writes one line of its own:

    eval step=120 val_loss=2.4100 val_ppl=11.13 val_tokens=65536 eval_s=3.2
 The field names and the MetricDefinitions' regexes
live in spotrun.seams (installed into the image), which the infrastructure imports too: the regexes and the line
cannot drift apart.
"""

from __future__ import annotations

import re

from spotrun.seams import EVAL_LINE_PREFIX, EVAL_METRIC_FIELDS, METRIC_DEFINITIONS, METRIC_FIELDS

__all__ = ["METRIC_DEFINITIONS", "METRIC_FIELDS", "format_line", "parse_line", "format_eval_line",
           "parse_eval_line", "device_peak_flops", "mfu"]

# bf16 dense peak FLOP/s per device, from the vendors' data sheets (no sparsity).
DEVICE_PEAK_FLOPS: dict[str, float] = {
    "NVIDIA A10G": 70e12,  # g5; NVIDIA A10G data sheet (dense bf16 tensor core)
    "NVIDIA L4": 121e12,  # g6
    "NVIDIA L40S": 362e12,  # g6e
    "NVIDIA A100-SXM4-40GB": 312e12,  # p4d
    "NVIDIA A100-SXM4-80GB": 312e12,  # p4de
    "NVIDIA H100 80GB HBM3": 989e12,  # p5
    "NVIDIA H200": 989e12,  # p5e/p5en (same compute as H100 SXM)
}

LINE_RE = re.compile(r"^step=(?P<step>\d+)" + "".join(rf" {n}=(?P<{n}>\S+)" for n in METRIC_FIELDS) + r"$")


def format_line(step: int, *, loss: float, lr: float, grad_norm: float, tokens_per_s: float,
                mfu: float | None, mem_gb: float) -> str:
    mfu_text = "na" if mfu is None else f"{mfu:.3f}"
    return (f"step={step} loss={loss:.4f} lr={lr:.3e} grad_norm={grad_norm:.4f} "
            f"tokens_per_s={tokens_per_s:.0f} mfu={mfu_text} mem_gb={mem_gb:.2f}")


def parse_line(line: str) -> dict | None:
    """The fields of a metric line as numbers (mfu None when `na`), or None if the line is not one."""
    m = LINE_RE.match(line.strip())
    if not m:
        return None
    out: dict = {"step": int(m["step"])}
    for name in METRIC_FIELDS:
        out[name] = None if m[name] == "na" else float(m[name])
    return out


EVAL_LINE_RE = re.compile(rf"^{EVAL_LINE_PREFIX} step=(?P<step>\d+)"
                          + "".join(rf" {n}=(?P<{n}>\S+)" for n in EVAL_METRIC_FIELDS) + r"$")


def format_eval_line(step: int, *, val_loss: float, val_ppl: float, val_tokens: int, eval_s: float) -> str:
    return (f"{EVAL_LINE_PREFIX} step={step} val_loss={val_loss:.4f} val_ppl={val_ppl:.4g} val_tokens={val_tokens} "
            f"eval_s={eval_s:.2f}")


def parse_eval_line(line: str) -> dict | None:
    """The fields of an evaluation line as numbers, or None if the line is not one."""
    m = EVAL_LINE_RE.match(line.strip())
    if not m:
        return None
    return {"step": int(m["step"]), **{n: float(m[n]) for n in EVAL_METRIC_FIELDS}}


def device_peak_flops(device_name: str) -> float | None:
    """Peak bf16 dense FLOP/s for a CUDA device name, or None when unknown (then no MFU is reported)."""
    for known, peak in DEVICE_PEAK_FLOPS.items():
        if device_name == known or device_name.startswith(known):
            return peak
    return None


def mfu(params: int, tokens_per_s_per_device: float, peak_flops: float | None,
        trainable: int | None = None) -> float | None:
    """Model FLOPs utilisation; None without a known peak. FLOPs per token: 6 per trained parameter (forward,
    input and weight gradients) and 4 per frozen one (forward and input gradients only: a LoRA base), which is
    the 6 * params rule for a full run and the planner's 4·N + 6·N_lora for LoRA."""
    if not peak_flops:
        return None
    trainable = params if trainable is None else trainable
    return (4.0 * (params - trainable) + 6.0 * trainable) * tokens_per_s_per_device / peak_flops
