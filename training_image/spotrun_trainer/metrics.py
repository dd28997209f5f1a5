"""MFU and the devices' peak FLOP/s: the `mfu` field of the trainer's metric line.

The metric line itself (`step=120 loss=2.3100 ... mfu=0.410 mem_gb=61.20`, `mfu=na` when the device's peak is
unknown: no guess), the evaluation line, their parsers and SageMaker's MetricDefinitions for them are
spotrun.seams' (`format_metric_line`/`parse_metric_line`, `format_eval_line`/`parse_eval_line`,
`METRIC_DEFINITIONS`), installed into the image: the trainer, `spotrun status`, local progress and the CDK
definitions use one definition.
"""

from __future__ import annotations

__all__ = ["device_peak_flops", "mfu"]

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
