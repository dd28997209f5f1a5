"""A local run's report files: report.json, report.txt (the readable summary, spotrun.pipeline.report.summary_text)
and loss.png (matplotlib, headless): the training loss and, with validation data, the validation loss at each
evaluation, each interruption marked at the step its signal was sent, and the best checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

from ..pipeline.report import summary_text


def loss_figure(losses: list[tuple[int, float]], interruptions: list[dict], title: str,
                val: dict[int, float] | None = None, evaluation: dict | None = None):
    """The loss plot as a matplotlib Figure: the per-step loss (the last value of a step that was redone), the
    validation loss at each evaluation (step 0: the base model's), each interruption at the step its signal was
    sent (labelled with the step it saved), and the best checkpoint (`evaluation`: the export metadata's)."""
    # matplotlib is a local-run dependency (requirements-dev.txt), not the CLI's: a missing one fails only here
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on servers and CI
    import matplotlib.pyplot as plt  # after use("Agg"): the backend is chosen before pyplot loads

    final = dict(losses)
    steps = sorted(final)
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.plot(steps, [final[s] for s in steps], color="tab:blue", linewidth=1.5, label="training loss")
    if val:
        at = sorted(val)
        ax.plot(at, [val[s] for s in at], color="tab:orange", marker="o", markersize=4, linewidth=1.5,
                label="validation loss")
    for i, event in enumerate(interruptions, 1):
        sent = event.get("signalled_at_step", event["step"])
        label = (f"{event['kind']} sent at step {sent}, saved step {event['checkpoint_step']}"
                 if i == 1 or len(interruptions) < 5 else None)
        ax.axvline(sent, color="tab:red", linestyle="--", linewidth=1.2, label=label)
        if event["checkpoint_step"] < event["step"]:  # steps after the newest checkpoint were run again
            ax.axvspan(event["checkpoint_step"], event["step"], color="tab:red", alpha=0.12)
    best_step, best = (evaluation or {}).get("best_step"), (evaluation or {}).get("best_val_loss")
    if best_step is not None and best is not None:
        exported = " (exported)" if evaluation.get("weights") == "best" else ""
        ax.plot([best_step], [best], color="tab:green", marker="*", markersize=14, linestyle="none",
                label=f"best checkpoint: step {best_step}, validation loss {best:.4f}{exported}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right")
    fig.tight_layout()
    return fig


def plot_loss(losses: list[tuple[int, float]], interruptions: list[dict], path: Path, title: str,
              val: dict[int, float] | None = None, evaluation: dict | None = None) -> Path:
    """loss.png: `loss_figure`, saved."""
    import matplotlib.pyplot as plt  # see loss_figure (matplotlib is optional; the backend is set there first)

    fig = loss_figure(losses, interruptions, title, val, evaluation)
    fig.savefig(path)
    plt.close(fig)
    return path


def write_report(report: dict, losses: list[tuple[int, float]], out_dir: Path,
                 val: dict[int, float] | None = None) -> dict[str, Path]:
    out_dir = Path(out_dir)
    paths = {"report": out_dir / "report.json", "summary": out_dir / "report.txt", "plot": out_dir / "loss.png"}
    plot_loss(losses, report.get("interruption_log", []), paths["plot"],
              f"{report['run']}: {report['interruptions']} interruption(s)", val=val,
              evaluation=report.get("evaluation"))
    paths["report"].write_text(json.dumps(report, indent=2))
    paths["summary"].write_text(summary_text(report) + "\n")
    for path in paths.values():
        path.chmod(0o644)
    return paths
