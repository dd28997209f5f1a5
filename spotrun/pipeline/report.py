"""The run report: what was estimated against what happened, the cost, and the loss curve.

One builder for both paths (`run_report`, from the run's plan: the cost guard's report on AWS, spotrun.handlers.
cost_guard, and `build_local_report` here): run, job_name, status, method, instance_type, instance_count, spot,
billable_seconds, training_seconds, interruptions, spot_savings_pct, cost_usd, price_basis, cost_basis,
price_region, price_as_of, cap_usd, estimated_cost_usd, final_loss, model_data_url, data_source,
worst_case_lost_usd, artifact, base_val_loss, exported_val_loss, gate and, with validation data, samples_file (the
trainer's sample generations in the model artifact, spotrun.seams.SAMPLES_FILE). The AWS report adds region,
segments and metadata; a local run adds `samples` (that file's generations, base vs fine-tuned),
`estimate`, `actual` (measured on this machine: steps, tokens, wall, trainer and restart seconds, time lost to
interruptions, steps redone), `interruption_log` (when each interruption was asked for and really sent) and
`priced`: this machine's time at the planned instance's catalog rates, which is not a measurement and is labelled
so in `price_basis` and in the text.

A local run's files (report.json, report.txt, loss.png) are written by spotrun/local/report_files.py: the cost
guard's Lambda imports this module, and the plot needs matplotlib.
"""

from __future__ import annotations

from ..seams import SAMPLES_FILE, Plan
from .gate import check_gate

_NO_GATE = check_gate(None, base=None, final=None).cause


def artifact_kind(method: str) -> str:
    return "lora-adapter" if method == "lora" else "full-model"


def run_report(plan: Plan, *, job_name: str, spot: bool, billable_seconds: float, training_seconds: float,
               interruptions: int, spot_savings_pct: float, cost_usd: float, price_basis: str, cost_basis: str,
               price_region: str, price_as_of: str, final_loss: float | None, model_data_url: str,
               worst_case_lost_usd: float, base_val_loss: float | None, exported_val_loss: float | None) -> dict:
    """The report both paths make, from the run's plan (spotrun.seams.Plan, as spotrun.pipeline.plan.plan made it) and
    what the run came to: the keys the registry's metadata and `summary_text` read, and the gate's verdict
    (spotrun/pipeline/gate.py on the exported weights' and the base model's validation losses)."""
    report = {
        "run": plan.run_name, "job_name": job_name, "status": "Completed", "method": plan.method,
        "instance_type": plan.instance_type, "instance_count": plan.instance_count, "spot": spot,
        "billable_seconds": billable_seconds, "training_seconds": training_seconds, "interruptions": interruptions,
        "spot_savings_pct": spot_savings_pct, "cost_usd": cost_usd,
        "price_basis": price_basis, "cost_basis": cost_basis, "price_region": price_region,
        "price_as_of": price_as_of, "cap_usd": plan.max_usd, "estimated_cost_usd": plan.estimate.cost_usd,
        "final_loss": final_loss, "model_data_url": model_data_url, "data_source": plan.data_source,
        # An interruption at the worst moment seen would have repeated this much work (at the on-demand price).
        "worst_case_lost_usd": worst_case_lost_usd,
        "artifact": artifact_kind(plan.method),
        # The exported weights' and the base model's validation losses (the trainer's run_completed line).
        "base_val_loss": base_val_loss, "exported_val_loss": exported_val_loss,
        # The trainer writes its sample generations beside the model whenever it has validation data.
        "samples_file": SAMPLES_FILE if exported_val_loss is not None else None,
    }
    gate = check_gate(plan.gate, base=base_val_loss, final=exported_val_loss)
    report["gate"] = {"passed": gate.passed, "cause": gate.cause}
    return report


def build_local_report(*, plan: Plan, spot: bool, job_name: str, metrics: dict, losses: list[tuple[int, float]],
                       history: dict, spot_discount: float, model_data_url: str,
                       evaluation: dict | None = None, samples: dict | None = None) -> dict:
    """The report of a local run (`run_report` with this machine's figures) from its plan (spotrun.local.pipeline:
    the estimate Lambda's plan with local settings), the trainer's metrics.json and loss history, and the
    timeline of starts and interruptions kept by the local pipeline (spotrun/local/supervisor.py).

    `actual` is what was measured on this machine; `priced` (and the cost keys at the top level, which the
    registry's metadata carries) is this machine's launcher time priced at the planned instance's catalog rates
    (the plan's `usd_per_hour`): not measured, and said so in `price_basis` and in the text. `evaluation`: the
    export metadata's (which weights were exported and the validation losses; None without validation data);
    `samples`: the trainer's samples.json (spotrun_trainer/samples.py), None without one."""
    usd_per_hour = plan.usd_per_hour
    training_s = sum(s["ended_s"] - s["started_s"] for s in history["starts"])
    on_demand = training_s / 3600 * usd_per_hour
    spot_usd = on_demand * (1 - spot_discount)
    interruptions = history["interruptions"]
    basis = (f"priced, not measured: the {training_s:.1f} s the launcher ran on this machine at "
             f"{plan.instance_count} x {plan.instance_type}'s catalog on-demand price (${usd_per_hour:.4f}/h)"
             + (f"; spot: billable time scaled by the catalog's {spot_discount:.0%} spot discount" if spot else ""))
    priced = {
        "basis": basis, "usd_per_hour": usd_per_hour, "spot_discount": spot_discount,
        "billable_seconds": round(training_s * (1 - spot_discount) if spot else training_s, 3),
        "training_seconds": round(training_s, 3),
        "spot_savings_pct": round(spot_discount * 100, 2) if spot else 0.0,
        "cost_usd": round(spot_usd if spot else on_demand, 6),
        "cost_usd_at_rates": {"spot": round(spot_usd, 6), "on_demand": round(on_demand, 6)},
        # The most work one interruption cost here (at the on-demand price), as the AWS report's worst case.
        "worst_case_lost_usd": round(max((i["lost_s"] for i in interruptions), default=0.0) / 3600
                                     * usd_per_hour, 6),
    }
    report = run_report(
        plan, job_name=job_name, spot=spot, billable_seconds=priced["billable_seconds"],
        training_seconds=priced["training_seconds"], interruptions=len(interruptions),
        spot_savings_pct=priced["spot_savings_pct"], cost_usd=priced["cost_usd"], price_basis=basis,
        # The registry's structured cost fields (cost_guard.REGISTRY_METADATA_KEYS), as on AWS.
        cost_basis="wall time measured here x catalog on-demand price", price_region="local", price_as_of="none",
        final_loss=metrics["final_loss"], model_data_url=model_data_url,
        worst_case_lost_usd=priced["worst_case_lost_usd"], base_val_loss=(evaluation or {}).get("base_val_loss"),
        exported_val_loss=(evaluation or {}).get("val_loss"))
    est = plan.estimate
    report.update({
        "local": True, "cost_usd_at_rates": priced["cost_usd_at_rates"], "priced": priced,
        "estimate": {
            "wall_seconds": round(est.wall_seconds, 1), "tokens": est.tokens,
            "samples_per_step": est.global_batch_samples or None,  # None: a plan of an older spotrun
            "expected_interruptions": round(est.expected_interruptions, 4),
            "expected_overhead_seconds": round(est.expected_overhead_seconds, 1),
            "checkpoint_policy": est.checkpoint_policy,
            "checkpoint_interval_s": est.checkpoint_interval_s,
        },
        "actual": {
            "basis": "measured on this machine",
            "steps": metrics["steps"], "tokens": metrics["tokens"], "wall_seconds": history["wall_s"],
            "samples_per_step": metrics.get("samples_per_step"),  # the trainer's (None: an older trainer's)
            "trainer_seconds": round(metrics["wall_s"], 3), "starts": len(history["starts"]),
            "restart_seconds": round(sum(s.get("restart_s", 0.0) for s in history["starts"]), 3),
            "lost_seconds": round(sum(i["lost_s"] for i in interruptions), 3),
            "steps_redone": len(losses) - len({step for step, _ in losses}),
            "tokens_per_s_per_device": round(metrics["tokens_per_s_per_device"], 1),
            "user_stops": len(history.get("user_stops", [])),
        },
        "interruption_log": interruptions,
        "interruptions_not_injected": history.get("not_injected", []),
        "evaluation": evaluation,
        "samples": samples,
        "estimated_evaluation_seconds": round(est.evaluation_seconds, 1),
    })
    return report


def _money(value) -> str:
    return f"${value:,.4f}" if isinstance(value, (int, float)) else str(value)


def _event_line(i: int, event: dict) -> str:
    late = event.get("late")
    unit = "s" if event["trigger"].endswith("s") else " steps"
    sent = (f"sent at step {event['signalled_at_step']}, {event['at_s']:.1f} s into the job ({late:g}{unit} late)"
            if late is not None else f"sent {event['at_s']:.1f} s into the job")
    # step 0: no checkpoint was committed before it (a hard kill before the first save): the run started again
    resumed = (f"resumed from checkpoint step {event['checkpoint_step']}" if event["checkpoint_step"] else
               "started again from the beginning (no checkpoint was committed before it)")
    return (f"      {i}. {event['kind']} asked at {event['trigger']}: {sent}; stopped at step {event['step']}, "
            f"{resumed}; {event['lost_s']:.1f} s lost")


def _batch_text(act: dict, est: dict) -> str:
    """The samples per optimizer step the trainer ran, beside the plan's ('' when either is not known)."""
    ran, planned = act.get("samples_per_step"), est.get("samples_per_step")
    if not ran or not planned:
        return ""
    return f" of {ran} samples" + (", as planned" if ran == planned else f", not the plan's {planned}")


def _local_lines(report: dict) -> list[str]:
    est, act, priced = report["estimate"], report["actual"], report["priced"]
    lines = [
        "  measured here:",
        f"    steps            {act['steps']} ({act['steps_redone']} redone){_batch_text(act, est)}, "
        f"{act['tokens']:,} tokens (estimated {est['tokens']:,.0f})",
        f"    wall time        {act['wall_seconds']:.1f} s over {act['starts']} start(s); trainer "
        f"{act['trainer_seconds']:.1f} s; restarts {act.get('restart_seconds', 0.0):.1f} s",
        f"    interruptions    {report['interruptions']} (estimate {est['expected_interruptions']:.3f}); "
        f"time lost to them and the restarts {act['lost_seconds']:.1f} s",
    ]
    lines += [_event_line(i, event) for i, event in enumerate(report.get("interruption_log", []), 1)]
    if act.get("user_stops"):
        lines.append(f"    stopped by Ctrl-C {act['user_stops']} time(s), resumed with --resume (the time between "
                     "sessions is not counted)")
    for left in report.get("interruptions_not_injected", []):
        if isinstance(left, dict):
            lines.append(f"      not injected: {left['trigger']} ({left['reason']})")
    lines += [
        f"  priced, not measured: the {priced['training_seconds']:.1f} s the launcher ran here (of the wall time "
        f"above) at {report['instance_count']} x "
        f"{report['instance_type']}'s catalog rates (${priced['usd_per_hour']:.4f}/h on-demand"
        + (f", spot {priced['spot_discount']:.0%} off)" if report["spot"] else ")") + ":",
        f"    billable/training {priced['billable_seconds']:.1f} s / {priced['training_seconds']:.1f} s"
        f" (spot savings {priced['spot_savings_pct']:.1f}%: the catalog's discount)",
        f"    cost             {_money(priced['cost_usd'])} of cap {_money(report['cap_usd'])}; at the rates: spot "
        f"{_money(priced['cost_usd_at_rates']['spot'])}, on-demand {_money(priced['cost_usd_at_rates']['on_demand'])}",
        f"    the estimate     {est['wall_seconds']:.0f} s on {report['instance_count']} x {report['instance_type']}: "
        f"spot {_money(report['estimated_cost_usd']['spot'])} / on-demand "
        f"{_money(report['estimated_cost_usd']['on_demand'])}",
    ]
    return lines


def summary_text(report: dict) -> str:
    """A readable summary of a report (local or AWS)."""
    lines = [f"run {report['run']} ({report['job_name']}): {report['status']}"]
    if "priced" in report and "actual" in report:
        lines += _local_lines(report)
    else:
        lines += [
            f"  billable/training {report['billable_seconds']:.1f} s / {report['training_seconds']:.1f} s"
            f" (spot savings {report['spot_savings_pct']:.1f}%)",
            f"  cost             {_money(report['cost_usd'])} of cap {_money(report['cap_usd'])}; estimated "
            f"spot {_money(report['estimated_cost_usd']['spot'])} / on-demand "
            f"{_money(report['estimated_cost_usd']['on_demand'])}",
        ]
        for seg in report.get("segments") or []:  # the AWS run's jobs, each with its exact bill
            lines.append(f"  segment {seg['segment']:<8} {seg['job_name']} ({'spot' if seg['spot'] else 'on-demand'}): "
                         f"{seg['status']}/{seg['secondary_status']}, billable {seg['billable_seconds'] or 0:,} s, "
                         f"{_money(seg['cost_usd'])}")
        prep = report.get("preparation")  # raw text prepared by the pipeline (spotrun/pipeline/preparation.py)
        if prep:
            lines.append(f"  preparation      reused {prep['data_source']} (same inputs and tokenizer), $0" if
                         prep["reused"] else
                         f"  preparation      {prep['job_name']} ({prep['instance_count']} x {prep['instance_type']}):"
                         f" {prep['seconds']:,.0f} s, {_money(prep['cost_usd'])} (in the cost above), "
                         f"{prep['tokens']:,} tokens")
        if "cost_usd_at_rates" in report:
            rates = report["cost_usd_at_rates"]
            lines.append(f"  this wall time at the planned instance's rates: spot {_money(rates['spot'])}, "
                         f"on-demand {_money(rates['on_demand'])}")
    if report.get("final_loss") is not None:
        lines.append(f"  final loss       {report['final_loss']:.4f}")
    if report.get("exported_val_loss") is not None:
        ev = report.get("evaluation") or {}
        chosen = f" ({ev['weights']} weights, step {ev['exported_step']})" if ev.get("weights") else ""
        base = report.get("base_val_loss")
        lines.append(f"  validation loss  {report['exported_val_loss']:.4f}{chosen}; base model "
                     + (f"{base:.4f}" if base is not None else "not measured"))
    lines += _sample_lines(report)
    if report.get("gate") and report["gate"]["cause"] != _NO_GATE:  # a run without registry.gate says nothing
        lines.append(f"  {report['gate']['cause']}")  # the cause begins "registry gate passed|failed"
    if report.get("model_package_arn") or report.get("model_package"):
        lines.append(f"  model package    {report.get('model_package_arn') or report.get('model_package')}")
    return "\n".join(lines)


def _sample_lines(report: dict) -> list[str]:
    """The sample generations (a local run's report holds them; the AWS report points at the artifact's file)."""
    doc = report.get("samples")
    if not doc:
        return ([f"  samples          {report['samples_file']} in the model artifact: base vs fine-tuned "
                 "generations"] if report.get("samples_file") else [])
    asked = "conversation up to an assistant turn" if doc.get("prompt_ends") == "assistant turn" else \
        f"first {doc['prompt_tokens']}"
    lines = [f"  samples          greedy, {doc['new_tokens']} new tokens after each validation sample's {asked} "
             f"(base: {'the base model' if doc['base'] else 'none, built from a config'})"]
    for i, sample in enumerate(doc["samples"], 1):
        lines += [f"    {i}. prompt     {_shown(sample, 'prompt')}",
                  f"       base       {_shown(sample, 'base')}",
                  f"       fine-tuned {_shown(sample, 'tuned')}"]
    return lines


def _shown(sample: dict, key: str) -> str:
    """The text (quoted, escapes visible), or the token ids without a tokenizer."""
    return repr(sample[key]) if sample[key] is not None else str(sample[f"{key}_ids"])
