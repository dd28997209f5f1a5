"""`make demo` (`spotrun demo`): the example run shipped in examples/demo/, through `spotrun local`, twice.

1. Assets, built here and nothing downloaded: a corpus of this Python's standard library sources (raw JSONL
   text: the pipeline prepares it), a byte-level BPE tokenizer trained on it, and a Llama-shaped model saved
   from examples/demo/model.json with save_pretrained (as a pretrained model directory would be).
2. The run, with one spot interruption (SIGTERM: the trainer saves on the notice) and an automatic restart on
   the same checkpoint directory, 2 CPU worker processes under the container's launcher.
3. The same run, uninterrupted.
4. Whether the two registered models' weights (and the per-step training and validation losses) are bitwise
   identical, the validation loss against the base model's and the registry gate's verdict, and where the plot,
   the report and the registered models are. The run holds out 10% of the documents (data.validation_fraction),
   evaluates every 16 steps, keeps and exports the checkpoint with the lowest validation loss (eval.keep_best,
   export.from=best) and registers it only if its validation loss beats the base model's by
   registry.gate.min_improvement (5%).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Callable

from ..contract.runfile import DEMO_DIR
from .examples import save_model, train_tokenizer, write_stdlib_corpus
from .harness import loss_records, val_history
from .pipeline import InterruptAt, LocalOptions, run_local

CORPUS_BYTES = 200_000  # ~65k tokens: ~64 steps of 8 x 128 tokens, under a minute of training per run
VOCAB = 1024
INTERRUPT_AT = InterruptAt(step=30)  # about halfway
OVERRIDES = {"optim.warmup_steps": "5"}  # a smoother start of the loss curve; the same in both runs


def build_assets(root: Path, emit: Callable[[str], None] = print) -> dict:
    """assets/corpus (raw text), assets/tokenizer, assets/model under root; reused when present."""
    corpus = root / "corpus" / "stdlib.jsonl"
    model_dir = root / "model"
    if not (model_dir / "config.json").is_file():
        emit(f"[demo] building assets under {root}: stdlib corpus, tokenizer, model")
        write_stdlib_corpus(corpus, max_bytes=CORPUS_BYTES)
        train_tokenizer(corpus, root / "tokenizer", vocab_size=VOCAB)
        spec = json.loads((DEMO_DIR / "model.json").read_text())
        save_model(spec, model_dir, vocab_size=VOCAB, seed=0, tokenizer_dir=root / "tokenizer")
    return {"corpus": corpus.parent, "model": model_dir}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def weights_identical(a: Path, b: Path) -> bool:
    """Bitwise: every safetensors file of two model directories has the same bytes."""
    names = sorted(p.name for p in Path(a).glob("*.safetensors"))
    return bool(names) and names == sorted(p.name for p in Path(b).glob("*.safetensors")) and all(
        _sha256(Path(a) / n) == _sha256(Path(b) / n) for n in names)


def run_demo(out: Path, *, interrupt_at: InterruptAt = INTERRUPT_AT, progress: str = "auto",
             emit: Callable[[str], None] = print) -> dict:
    out = Path(out).resolve()
    t0 = time.monotonic()
    build_assets(out / "assets", emit)
    run_path = out / "run.json"
    shutil.copyfile(DEMO_DIR / "run.json", run_path)  # its sources are relative: assets/ beside it
    stamp = time.strftime("%Y%m%d-%H%M%S")

    emit(f"[demo] 1/2: {run_path.name} with a spot interruption at {interrupt_at}")
    interrupted = run_local(run_path, LocalOptions(out=out, interrupts=(interrupt_at,), overrides=OVERRIDES,
                                                   job_name=f"interrupted-{stamp}", progress=progress), emit=emit)
    emit("[demo] 2/2: the same run, uninterrupted")
    reference = run_local(run_path, LocalOptions(out=out, job_name=f"uninterrupted-{stamp}", overrides=OVERRIDES,
                                                 progress=progress), emit=emit)

    a, b = Path(interrupted["model_data_url"]), Path(reference["model_data_url"])
    same_weights = weights_identical(a, b)
    outputs = [Path(r["files"]["report"]).parent / "sm" / "model" for r in (interrupted, reference)]
    same_losses = dict(loss_records(outputs[0])) == dict(loss_records(outputs[1]))
    same_val = val_history(outputs[0]) == val_history(outputs[1]) and bool(val_history(outputs[0]))
    summary = {
        "interruptions": interrupted["interruptions"],
        "steps": interrupted["actual"]["steps"],
        "steps_redone": interrupted["actual"]["steps_redone"],
        "lost_seconds": interrupted["actual"]["lost_seconds"],
        "final_loss": interrupted["final_loss"],
        "weights_bitwise_identical": same_weights,
        "losses_bitwise_identical": same_losses,
        "val_losses_bitwise_identical": same_val,
        "base_val_loss": interrupted.get("base_val_loss"),
        "exported_val_loss": interrupted.get("exported_val_loss"),
        "gate_passed": (interrupted.get("gate") or {}).get("passed"),
        "gate": (interrupted.get("gate") or {}).get("cause", "no registry.gate"),
        "plot": interrupted["files"]["plot"],
        "report": interrupted["files"]["report"],
        "summary": interrupted["files"]["summary"],
        "registered_model": interrupted.get("model_package"),
        "uninterrupted_model": reference.get("model_package"),
        "demo_seconds": round(time.monotonic() - t0, 1),
    }
    (out / "demo.json").write_text(json.dumps(summary, indent=2))
    emit("")
    emit(Path(summary["summary"]).read_text().rstrip())
    emit("")
    first = (interrupted["interruption_log"] or [{}])[0]
    emit(f"[demo] signal sent at step {first.get('signalled_at_step', '-')}, saved at step "
         f"{first.get('checkpoint_step', '-')} and resumed: {summary['steps']} steps, "
         f"{summary['steps_redone']} redone")
    emit(f"[demo] registered weights bitwise identical to the uninterrupted run: {'yes' if same_weights else 'NO'}"
         f" (per-step losses identical: {'yes' if same_losses else 'NO'})")
    emit(f"[demo] validation losses identical too: {'yes' if same_val else 'NO'}; {summary['gate']}")
    emit(f"[demo] loss curve:        {summary['plot']}")
    emit(f"[demo] report:            {summary['report']} (summary {summary['summary']})")
    emit(f"[demo] registered model:  {summary['registered_model']}")
    emit(f"[demo] finished in {summary['demo_seconds']:.0f} s")
    return summary
