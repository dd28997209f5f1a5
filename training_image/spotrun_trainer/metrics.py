"""The trainer's metric log line, the matching SageMaker MetricDefinitions, and MFU.

One form, written every `log_every` steps by rank 0 and parsed by CloudWatch (through MetricDefinitions) and by
the tests and benchmarks:

    step=120 loss=2.3100 lr=1.9e-05 grad_norm=0.82 tokens_per_s=3150 mfu=0.41 mem_gb=61.2

`mfu` is `na` when the device's peak is unknown (no guess). The infrastructure imports `METRIC_DEFINITIONS`
from here (through spotrun.contract, which copies it verbatim and is checked by a test) so that the regexes and
the line cannot drift apart.
"""

from __future__ import annotations

import re

# bf16 dense peak FLOP/s per device, from the vendors' data sheets (no sparsity).
DEVICE_PEAK_FLOPS: dict[str, float] = {
    "NVIDIA A10G": 70e12,  # g5 (KNOWLEDGE.md figure)
    "NVIDIA L4": 121e12,  # g6
    "NVIDIA L40S": 362e12,  # g6e
    "NVIDIA A100-SXM4-40GB": 312e12,  # p4d
    "NVIDIA A100-SXM4-80GB": 312e12,  # p4de
    "NVIDIA H100 80GB HBM3": 989e12,  # p5
    "NVIDIA H200": 989e12,  # p5e/p5en (same compute as H100 SXM)
}

METRIC_FIELDS = ("loss", "lr", "grad_norm", "tokens_per_s", "mfu", "mem_gb")
_NUMBER = r"([0-9.eE+-]+)"

# SageMaker MetricDefinitions: Name + Regex with one capture group.
METRIC_DEFINITIONS: list[dict[str, str]] = [
    {"Name": f"train:{name}", "Regex": rf"step=\d+ .*\b{name}={_NUMBER}"} for name in METRIC_FIELDS
]

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
