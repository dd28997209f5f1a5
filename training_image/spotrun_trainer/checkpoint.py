"""CheckpointManager: sharded DCP saves with a manifest commit protocol that survives S3 mirroring.

Layout under the checkpoint dir (SageMaker mirrors it to one S3 prefix shared by every instance; the names are
spotrun.seams' CHECKPOINT_STEP_DIR / checkpoint_step_dir and CHECKPOINT_MANIFEST, which the cost guard lists too):

    step-00000120/__0_0.distcp, __1_0.distcp, ...   one file per rank (global rank in the name: unique across
    step-00000120/.metadata                          instances), plus DCP's metadata from rank 0
    step-00000120/manifest.json                      written last, by rank 0: step, world size, the small
                                                     stateful objects' state (loop counters, data position,
                                                     LR scheduler) and every file with its size and sha256

What is saved where. The CheckpointManager is handed the stateful objects once: the FSDP2 model and optimizer go
through DCP (sharded tensors, one file per rank), as does each rank's RNG state (under a per-rank key); the
other objects (anything with `state_dict()` returning JSON-able values and `load_state_dict()`) are small and the
same on every rank, so their state is stored once, in the manifest, readable with any JSON tool.

Commit protocol. A checkpoint exists when its manifest exists and every file it lists has the listed size and
hash. Nothing is renamed: on an S3-mirrored directory a rename is an upload of new objects plus deletions, not an
atomic step, so the manifest alone proves completeness. Each rank hashes the files it wrote (in the background
for periodic saves), rank 0 gathers the lists and writes the manifest (tmp file, fsync, os.replace). A directory
without a verifying manifest - torn by SIGKILL, half uploaded, truncated, flipped bytes, a leftover `.tmp` -
is skipped with a log line and the previous checkpoint loads; DCP itself does not checksum.

"Is wrong" is not "can't read": a permission or I/O error while verifying the newest checkpoint stops the run
(CheckpointError) instead of falling back, because the fallback would redo the work after the older checkpoint
and then prune the newer one for good. A save that fails (a full disk, DCP's BaseException-derived
CheckpointException included) stops the run with a message that names the cause and the newest intact
checkpoint; so does a save of non-finite weights, which is refused (a diverged run never overwrites good state).

Retention keeps the newest `keep` (>= 2) committed checkpoints, so the one being written never replaces the
only good one. Each node's local rank 0 deletes only on its own disk (the deletion is mirrored to S3), and only
checkpoints every rank agreed to drop (see _prune).

Across hosts (docs/checkpoints.md): SageMaker copies the one S3 prefix to every host only when a job starts, so
during a job each host sees only its own writes. Nothing here reads a file after the start that another host
wrote: load() runs at the start, commits use each rank's own file list, and only checkpoints that were complete
at the start can be loaded again (load_model); this job's best weights are kept in memory (best.py).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import socket
import stat
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from spotrun.seams import (
    CHECKPOINT_MANIFEST,
    CHECKPOINT_STEP_DIR,
    CHECKPOINT_STEP_PREFIX,
    StopNotice,
    checkpoint_step_dir,
)
from spotrun.settings.sections import CheckpointConfig

log = logging.getLogger(__name__)

FORMAT = 2  # 2: the stateful objects' state by name under "train_state" (1 kept the loop's dict flat)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read or written, or would hold non-finite weights: the run must stop. The message
    names the cause and the newest intact checkpoint."""


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / checkpoint_step_dir(step)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(8 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every element of every tensor is finite.

    A sum is NaN or Inf whenever an element is (both propagate), so one reduction per tensor decides the common
    case without isfinite's full-size boolean copy (~10x faster: this runs on the training thread before every
    save). Finite values can also overflow a sum; a non-finite sum is therefore confirmed element by element.
    """
    if not tensors:
        return True
    if bool(torch.isfinite(torch.stack([t.sum().float() for t in tensors]).sum())):
        return True
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def files_written_by(directory: Path, rank: int) -> list[dict]:
    """Size and hash of the files this rank wrote into a DCP checkpoint directory (`__{rank}_*.distcp`, and
    `.metadata` for rank 0)."""
    names = sorted(p.name for p in directory.iterdir() if p.name.startswith(f"__{rank}_"))
    if rank == 0:
        names.append(".metadata")
    out = []
    for name in names:
        path = directory / name
        out.append({"path": name, "size": path.stat().st_size, "sha256": _sha256(path)})
    return out


def _referenced_files(metadata) -> set[str]:
    """Relative paths of the data files DCP's metadata points into (save returns it on every rank)."""
    storage = getattr(metadata, "storage_data", None) or {}
    return {info.relative_path for info in storage.values() if hasattr(info, "relative_path")}


def verify(directory: Path) -> tuple[dict | None, str]:
    """(manifest, "") when the checkpoint is complete and undamaged, else (None, the reason).

    Raises CheckpointError when it cannot be read (permission or I/O error): that is not evidence of damage."""
    m = CHECKPOINT_STEP_DIR.match(directory.name)
    if not m:
        return None, "not a step-NNNNNNNN directory"
    try:
        return _verify(directory, int(m.group(1)))
    except (FileNotFoundError, NotADirectoryError) as exc:  # vanished while being checked: incomplete
        return None, f"{Path(exc.filename or '?').name} is missing"
    except OSError as exc:
        raise CheckpointError(f"checkpoint {directory.name} cannot be read ({exc.strerror or exc}: {exc.filename}); "
                              "not falling back to an older checkpoint, which would redo and then delete the work "
                              f"after it: restore access to the storage, or remove {directory.name} to resume from "
                              "the previous checkpoint") from exc


def _regular_file(path: Path) -> bool:
    """Whether path is a regular file; False when missing. Other OSErrors (EACCES, EIO) propagate: from
    Python 3.12 on, Path.is_file() reports them as False, which would read as "incomplete" here."""
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def _verify(directory: Path, step: int) -> tuple[dict | None, str]:
    path = directory / CHECKPOINT_MANIFEST
    if not _regular_file(path):
        return None, "no manifest (the save did not finish)"
    try:
        manifest = json.loads(path.read_bytes().decode())
        files = manifest["files"]
        if manifest.get("format") != FORMAT or manifest["step"] != step:
            return None, f"manifest format/step {manifest.get('format')}/{manifest.get('step')} do not match"
        entries = [(str(f["path"]), f["size"], f["sha256"]) for f in files]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # ValueError: bad JSON or bad UTF-8
        return None, f"manifest unreadable ({type(exc).__name__}: {exc})"
    if not any(name == ".metadata" for name, _, _ in entries):
        return None, "manifest lists no .metadata"
    for name, expected_size, expected_hash in entries:
        if "/" in name or name in ("", ".", ".."):
            return None, f"manifest lists {name!r}, not a file of this directory"
        file = directory / name
        if not _regular_file(file):
            return None, f"{name} is missing"
        size = file.stat().st_size
        if size != expected_size:
            return None, f"{name} has {size} bytes, manifest says {expected_size}"
        if _sha256(file) != expected_hash:
            return None, f"{name} content hash differs from the manifest"
    return manifest, ""


def committed_checkpoints(root: Path) -> list[tuple[int, dict]]:
    """Every verified checkpoint under root as (step, manifest), newest first; damaged ones are logged.

    An unreadable checkpoint newer than every verified one raises CheckpointError; an unreadable older one is
    skipped with a warning (a newer checkpoint makes it irrelevant)."""
    root = Path(root)
    try:
        children = sorted(root.iterdir(), reverse=True)
    except FileNotFoundError:
        return []
    except OSError as exc:  # an unreadable checkpoint dir must not look empty (a fresh start would follow)
        raise CheckpointError(f"checkpoint directory {root} cannot be read ({exc.strerror or exc})") from exc
    found = []
    for child in children:
        if not CHECKPOINT_STEP_DIR.match(child.name) and not child.is_dir():
            continue  # a step-named entry goes to verify(), which tells missing from unreadable
        try:
            manifest, reason = verify(child)
        except CheckpointError as exc:
            if not found:
                raise
            log.warning("checkpoint %s skipped (a newer one verified): %s", child.name, exc)
            continue
        if manifest is None:
            log.warning("checkpoint %s skipped: %s", child.name, reason)
        else:
            found.append((manifest["step"], manifest))
    return found


def describe_failure(exc: BaseException) -> str:
    """One line for a failed save: "no space left on device" when any rank's cause is ENOSPC, else the first
    cause. DCP wraps every rank's exception in a CheckpointException (`failures`: rank -> (exception, trace))."""
    causes: list[tuple[int | None, BaseException]] = []
    if isinstance(exc, CheckpointException):
        causes = [(rank, failure[0]) for rank, failure in sorted(exc.failures.items())]
    causes = causes or [(None, exc)]
    for rank, cause in causes:
        chain = [cause, cause.__cause__, cause.__context__]
        if any(isinstance(c, OSError) and c.errno == errno.ENOSPC for c in chain):
            where = f" on rank {rank}" if rank is not None else ""
            return f"no space left on device{where} ({cause})"
    rank, cause = causes[0]
    where = f"rank {rank}: " if rank is not None else ""
    text = " ".join(f"{where}{type(cause).__name__}: {cause}".split())
    return text[:500]


class Stateful(Protocol):
    """What the manager needs of a small stateful object (data loader, LR scheduler, the loop's counters)."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


def verify_ahead(cfg: CheckpointConfig, local_rank: int) -> Future | None:
    """Start hashing this node's checkpoints in a thread (each node's local rank 0), so a resume verifies while the
    model is being built instead of after it: hashing reads every byte and needs nothing from the model."""
    if not cfg.dir or cfg.resume == "never" or local_rank != 0:
        return None
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-verify")
    future = pool.submit(committed_checkpoints, Path(cfg.dir))
    pool.shutdown(wait=False)  # the thread ends with the hashing
    return future


@dataclass(frozen=True)
class NodeView:
    """What one node's local rank 0 sees in the checkpoint directory: its host name and every `step-*` entry."""

    host: str
    rank: int  # the global rank of the node's local rank 0
    files: frozenset[str]  # "step-00000120/__0_0.distcp", ...; a step-* entry that is not a directory as itself

    @classmethod
    def of(cls, root: Path, rank: int) -> "NodeView":
        files: set[str] = set()
        if Path(root).is_dir():
            for child in Path(root).iterdir():
                if not child.name.startswith(CHECKPOINT_STEP_PREFIX):
                    continue
                if child.is_dir():
                    files.update(f"{child.name}/{f.name}" for f in child.iterdir())
                else:
                    files.add(child.name)
        return cls(host=socket.gethostname(), rank=rank, files=frozenset(files))


def describe_mismatch(views: list[NodeView], root: Path) -> str:
    """"" when every node sees the same checkpoint files, else why the run must stop.

    SageMaker copies the one checkpoint S3 prefix, holding every host's files, into every instance at start (and
    a shared file system shows every node the same files): nodes that see different files are not looking at one
    checkpoint directory. Then no node can verify a checkpoint whose shards other nodes wrote, a fresh start would
    follow, and its first save would prune on each node the files of checkpoints complete only in the union."""
    if len({v.files for v in views}) <= 1:
        return ""
    union = frozenset().union(*(v.files for v in views))
    lacking = [(v, sorted(union - v.files)) for v in views if union - v.files]
    parts = [f"host {v.host} (rank {v.rank}) lacks {len(missing)} file(s) another host has "
             f"(e.g. {', '.join(missing[:2])})" for v, missing in lacking[:3]]
    if len(lacking) > 3:  # the failure file holds 1,024 characters: the advice below must fit
        parts.append(f"and {len(lacking) - 3} more hosts")
    return (f"checkpoint directory {root} differs between hosts: {'; '.join(parts)}. Every host must see every "
            "host's checkpoint files (SageMaker's one checkpoint S3 prefix gives them to each instance at start; a "
            "shared file system does the same). Not resuming and deleting nothing: starting fresh here would prune "
            "checkpoints that are complete in the union. Merge the hosts' checkpoint directories (or point every "
            "host at the same storage) and start again")


@dataclass
class Restored:
    """What load() found: the step of the checkpoint loaded (every stateful object is already restored)."""

    step: int


@dataclass
class PendingSave:
    """A periodic save staged and being written in the background, not yet committed."""

    step: int
    states: dict  # the small objects' state at the save's step (goes into the manifest at commit)
    written: Future  # -> (files this rank wrote with sizes and hashes, files DCP's metadata references)
    started: float  # time.monotonic() when the save began
    blocked_s: float  # how long training was blocked (staging)


class CheckpointManager:
    """Owns save(step) and load() for the stateful training objects, handed over once here.

    `states` names the small objects (`{"trainer": ..., "loader": ..., "scheduler": ...}`); their state is
    snapshotted at save time and restored in place by load().
    """

    def __init__(self, cfg: CheckpointConfig, *, model, optimizer, local_rank: int,
                 states: Mapping[str, Stateful] | None = None, verified: Future | None = None,
                 model_options: StateDictOptions | None = None):
        """`verified`: from verify_ahead(), started before the model was built (else load() verifies itself).
        `model_options` select what of the model is saved and how it is loaded back (LoRA: the trainable
        parameters only, see lora.checkpoint_options); None saves and strictly loads everything."""
        self.cfg = cfg
        self._verified = verified
        self.root = Path(cfg.dir)
        self.model, self.optimizer, self.states = model, optimizer, dict(states or {})
        self.model_options = model_options
        self.rank, self.world_size, self.local_rank = dist.get_rank(), dist.get_world_size(), local_rank
        self.committed: list[int] = []  # the same list on every rank
        self.at_start: frozenset[int] = frozenset()  # the checkpoints complete on every host at this job's start
        # Steps kept beside the newest `keep` (the best validation loss's: eval.keep_best); read at each prune,
        # after load() restored the states it is derived from.
        self.keep_also: Callable[[], set[int]] = set
        self._pending: PendingSave | None = None
        use_async = cfg.async_save and self.enabled
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt") if use_async else None
        # NOTE: async saves must not share the training group: their collectives would interleave with FSDP's
        # and deadlock (seen with torch 2.13 and gloo). A dedicated gloo group carries them (and the commit's small
        # collectives).
        self._async_group = dist.new_group(backend="gloo") if use_async else None
        # One stager for the whole run: it keeps its CPU staging buffers, so periodic saves after the first do not
        # allocate (and page-fault) a full copy of the state again: that halves the time training is blocked.
        # Safe because a save never starts before the previous one finished (save() waits first).
        self._stager = DefaultStager(StagingOptions(False, False, False, False)) if use_async else None
        self._measured = False
        self.last_save_time = time.monotonic()
        if self.enabled and self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)

    @property
    def enabled(self) -> bool:
        return bool(self.cfg.dir)

    # ---- saving ------------------------------------------------------------------------------------------

    def _snapshot(self) -> dict:
        """The small objects' state now, as plain JSON values (a copy: training goes on while a save finishes)."""
        try:
            return json.loads(json.dumps({name: obj.state_dict() for name, obj in self.states.items()}))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"checkpoint: a stateful object's state_dict() is not JSON-serialisable: {exc}") from None

    def _dcp_state(self) -> dict:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=self.model_options)
        state = {"model": model_sd, "optim": optim_sd}
        # NOTE: RNG is per rank; DCP treats same-key plain tensors as replicated and keeps one, so each rank's
        # state goes under its own key.
        state[f"rng.rank{self.rank}"] = torch.get_rng_state()
        if torch.cuda.is_available():
            state[f"rng_cuda.rank{self.rank}"] = torch.cuda.get_rng_state()
        return state

    def due(self, step: int) -> bool:
        """Whether this rank thinks a periodic save is due after `step` (ranks then agree by all-reduce)."""
        if not self.enabled:
            return False
        by_steps = self.cfg.interval_steps and step % self.cfg.interval_steps == 0
        by_time = self.cfg.interval_s and time.monotonic() - self.last_save_time >= self.cfg.interval_s
        return bool(by_steps or by_time)

    def pending_unfinished(self) -> bool:
        return self._pending is not None and not self._pending.written.done()

    def intact_note(self) -> str:
        """Which checkpoint a restart would resume from, for error messages."""
        if self.committed:
            return f"the newest intact checkpoint is step-{max(self.committed):08d} (a restart resumes from it)"
        return "no checkpoint of this run is intact yet (a restart starts from the beginning)"

    def diverged(self, what: str) -> CheckpointError:
        """The error that stops a run whose loss or weights turned non-finite; a save in flight (of state checked
        finite when it was taken) is committed first. All ranks call it together."""
        self.wait()
        return CheckpointError(f"training diverged: {what}; nothing after it is saved or exported, "
                               f"{self.intact_note()}: lower training.lr or set optim.grad_clip")

    def _require_finite_weights(self, step: int) -> None:
        """Every rank checks its own shards; ranks agree (MIN), so all raise together. O(parameters) per save."""
        local = [p.to_local() if isinstance(p, DTensor) else p for p in self.model.parameters()]
        device = local[0].device if local else torch.device("cpu")
        flag = torch.tensor([1.0 if all_finite(local) else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if flag.item() < 1:
            raise self.diverged(f"the weights after step {step} contain NaN or Inf (step {step} is not saved)")

    def _save_failed(self, step: int, exc: BaseException) -> CheckpointError:
        return CheckpointError(f"checkpoint step-{step:08d} could not be written: {describe_failure(exc)}; "
                               f"{self.intact_note()}")

    def save(self, step: int, *, blocking: bool) -> None:
        """Save after `step`. All ranks call it at the same step. Async saves return once state is staged.

        Raises CheckpointError when the weights are not finite or the save fails (then on every rank)."""
        if not self.enabled or step in self.committed:
            return
        self.wait()  # the previous save finishes before the next starts
        self._require_finite_weights(step)
        directory = step_dir(self.root, step)
        t0 = time.monotonic()
        states = self._snapshot()
        state = self._dcp_state()
        if blocking or self._executor is None:
            try:
                metadata = dcp.save(state, checkpoint_id=str(directory))
                files = files_written_by(directory, self.rank)
            except (Exception, CheckpointException) as exc:  # NOTE: CheckpointException is a BaseException
                raise self._save_failed(step, exc) from None
            blocked = time.monotonic() - t0
            self._commit(PendingSave(step, states, _done((files, _referenced_files(metadata))), t0, blocked),
                         "sync")
            return
        try:
            dcp_future = dcp.async_save(state, checkpoint_id=str(directory), process_group=self._async_group,
                                        async_stager=self._stager)
        except (Exception, CheckpointException) as exc:
            raise self._save_failed(step, exc) from None
        blocked = time.monotonic() - t0

        def finish() -> tuple[list[dict], set[str]]:
            metadata = dcp_future.result()
            # hashing happens here, off the training thread
            return files_written_by(directory, self.rank), _referenced_files(metadata)

        self._pending = PendingSave(step, states, self._executor.submit(finish), t0, blocked)
        self.last_save_time = time.monotonic()

    def finalize_if_done(self, all_done: bool) -> None:
        """Commit a background save once every rank reports it written (`all_done` is the agreed flag)."""
        if self._pending is not None and all_done:
            self.wait()

    def wait(self) -> None:
        if self._pending is None:
            return
        pending, self._pending = self._pending, None
        try:
            pending.written.result()
        except (Exception, CheckpointException) as exc:  # DCP raises the same failure on every rank
            raise self._save_failed(pending.step, exc) from None
        self._commit(pending, "async")

    def _commit(self, save: PendingSave, kind: str) -> None:
        step = save.step
        files, referenced = save.written.result()
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, files, group=self._async_group)
        directory = step_dir(self.root, step)
        all_files = [f for rank_files in gathered for f in rank_files]
        # Every rank gets the same gathered list and DCP's metadata, so every rank raises together (a raise on
        # rank 0 alone would leave the others waiting at the barrier below).
        missing = referenced - {f["path"] for f in all_files}
        if missing:
            # NOTE: files are attributed to ranks by DCP's `__{rank}_` naming; if that ever changes, refuse to
            # commit a manifest that would not cover the checkpoint.
            raise RuntimeError(f"checkpoint step-{step:08d}: DCP wrote {sorted(missing)} which no rank reported; "
                               "the manifest would be incomplete")
        total = sum(f["size"] for f in all_files)
        error = ""
        if self.rank == 0:
            manifest = {"format": FORMAT, "step": step, "world_size": self.world_size,
                        "train_state": save.states, "files": all_files}
            tmp = directory / (CHECKPOINT_MANIFEST + ".tmp")
            try:
                with tmp.open("w") as fh:
                    json.dump(manifest, fh, indent=1)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, directory / CHECKPOINT_MANIFEST)
                _fsync_dir(directory)
            except OSError as exc:  # e.g. the disk filled up after the shards: the others must not wait forever
                error = describe_failure(exc)
        # Rank 0's outcome goes to every rank, so all raise together (the barrier does not carry it).
        outcome = [error]
        dist.broadcast_object_list(outcome, src=0, group=self._async_group)
        if outcome[0]:
            raise CheckpointError(f"checkpoint step-{step:08d} could not be written: the manifest failed: "
                                  f"{outcome[0]}; {self.intact_note()}")
        elapsed = time.monotonic() - save.started
        self.committed.append(step)
        self.last_save_time = time.monotonic()
        if self.rank == 0:
            # One parseable line per save (benchmarks and CloudWatch read it).
            print(f"checkpoint_saved step={step} kind={kind} bytes={total} save_s={elapsed:.3f} "
                  f"blocked_s={save.blocked_s:.3f} mb_per_s={total / max(elapsed, 1e-9) / 1e6:.1f}", flush=True)
            if not self._measured:
                self._warn_if_notice_too_short(total, elapsed)
        self._measured = True
        self._prune()

    def _warn_if_notice_too_short(self, total_bytes: int, save_s: float) -> None:
        budget = self.cfg.notice_seconds - StopNotice.FINISH_S  # the last step and the shutdown need the rest
        if save_s > budget:
            log.warning("checkpoint: a save takes %.1fs for %.2f GB but the stop notice leaves %.0fs: an emergency "
                        "save will not fit; shorten the periodic interval (work since the last periodic save is "
                        "lost on interruption)", save_s, total_bytes / 1e9, budget)

    def _prune(self, *, at_start: bool = False) -> None:
        """Keep the newest `keep` committed checkpoints (and keep_also's); delete the others. Called only when no
        save is in flight.

        NOTE: deleting a file under SageMaker's checkpoint directory deletes it from the one S3 prefix that every
        host's files go to. So a host deletes only checkpoints that every rank agreed are committed and no longer
        kept (`committed` is the same list on every rank), never one that is complete in the prefix and kept: of a
        checkpoint written during this job its directory holds just its own ranks' files (SageMaker copies the
        prefix down only at a start), of one that was in the prefix at the start every host's files, which every
        host then deletes alike. `at_start` (load()): also every other `step-*` entry (torn saves, leftovers):
        every host sees the same files then (load() refuses otherwise) and none of them verifies, so they are not
        complete in the prefix either."""
        newest = sorted(set(self.committed))[-self.cfg.keep:]
        keep = sorted(set(newest) | (set(self.committed) & set(self.keep_also())))
        dropped = {step_dir(self.root, s).name for s in set(self.committed) - set(keep)}
        self.committed = keep
        if self.local_rank != 0 or not self.root.is_dir():
            return
        names = {step_dir(self.root, s).name for s in keep}
        for child in self.root.iterdir():
            if not child.name.startswith(CHECKPOINT_STEP_PREFIX) or child.name in names:
                continue
            if at_start or child.name in dropped:
                shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink(missing_ok=True)

    # ---- loading -----------------------------------------------------------------------------------------

    def load(self) -> Restored | None:
        """Load the newest checkpoint verified on every node; None (start fresh) when there is none."""
        if not self.enabled or self.cfg.resume == "never":
            return None
        verified: dict[int, dict] = {}
        report: list[int] | str | None = None
        seen: NodeView | None = None
        if self.local_rank == 0:
            try:
                # NOTE: a CheckpointError raised in verify_ahead's thread is re-raised here by result()
                verified = dict(self._verified.result() if self._verified else committed_checkpoints(self.root))
                report = sorted(verified)
                seen = NodeView.of(self.root, self.rank)
            except CheckpointError as exc:
                report = str(exc)  # shared below so that every rank stops, not just this node's first
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, (report, seen))
        errors = [r for r, _ in gathered if isinstance(r, str)]
        if errors:
            raise CheckpointError(errors[0])
        # Every rank holds the same gathered views, so every rank raises together.
        mismatch = describe_mismatch([v for _, v in gathered if v is not None], self.root)
        if mismatch:
            raise CheckpointError(mismatch)
        node_lists = [set(steps) for steps, _ in gathered if steps is not None]
        common = set.intersection(*node_lists) if node_lists else set()
        # Complete on every host now; a checkpoint written later in this job will not be (see load_model).
        self.at_start = frozenset(common)
        if not common:
            if self.rank == 0:
                log.info("checkpoint: none found under %s; starting fresh", self.root)
            self._prune(at_start=True)  # torn saves only: nothing verified
            return None
        step = max(common)
        manifest = verified.get(step) or json.loads((step_dir(self.root, step) / CHECKPOINT_MANIFEST).read_text())
        saved_world = manifest["world_size"]
        same_world = saved_world == self.world_size

        saved_states = manifest.get("train_state") or {}
        absent = sorted(set(self.states) - set(saved_states))
        if absent:
            raise CheckpointError(f"checkpoint step-{step:08d} has no saved state for {absent} (it has "
                               f"{sorted(saved_states)}): written by a different trainer?")
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=self.model_options)
        state: dict = {"model": model_sd, "optim": optim_sd}
        if same_world:
            state[f"rng.rank{self.rank}"] = torch.get_rng_state()
            if torch.cuda.is_available():
                state[f"rng_cuda.rank{self.rank}"] = torch.cuda.get_rng_state()
        try:
            dcp.load(state, checkpoint_id=str(step_dir(self.root, step)))
        except (Exception, CheckpointException) as exc:  # NOTE: CheckpointException is a BaseException
            raise CheckpointError(f"checkpoint step-{step:08d} verified but could not be loaded: "
                                  f"{describe_failure(exc)} (an I/O error, or a different model or optimizer "
                                  "than the one that saved it)") from None
        set_model_state_dict(self.model, state["model"], options=self.model_options)
        set_optimizer_state_dict(self.model, self.optimizer, state["optim"])
        for name, obj in self.states.items():
            obj.load_state_dict(saved_states[name])
        if same_world:
            torch.set_rng_state(state[f"rng.rank{self.rank}"])
            if torch.cuda.is_available():
                torch.cuda.set_rng_state(state[f"rng_cuda.rank{self.rank}"])
        elif self.rank == 0:
            log.warning("checkpoint: saved by %d ranks, resuming on %d: model and optimizer are resharded by DCP; "
                        "per-rank RNG streams are reseeded and the data position carries over in samples, so the "
                        "run continues correctly but is not bitwise identical to an uninterrupted one",
                        saved_world, self.world_size)
        # The same list on every rank (every node verified these). Entries newer than the one loaded did not
        # verify: the run writes those steps again, so they go now.
        self.committed = sorted(common)
        self._prune(at_start=True)
        dist.barrier()
        self.last_save_time = time.monotonic()
        if self.rank == 0:
            log.info("checkpoint: resumed from step-%08d", step)
        return Restored(step=step)

    def load_model(self, step: int) -> None:
        """Load only the model weights of committed checkpoint `step` into the model (export of the best one);
        the optimizer and the small states stay as they are. Every rank calls it.

        Only a checkpoint that was complete when this job started: one written during the job is, on SageMaker,
        only partly on each host (each host's files reach the other hosts at the next start), so no host can load
        it (best.BestWeights keeps this job's best in memory instead)."""
        if step not in self.committed:
            raise CheckpointError(f"checkpoint step-{step:08d} is not kept (kept: {sorted(self.committed)})")
        if step not in self.at_start:
            raise CheckpointError(f"checkpoint step-{step:08d} was written during this job: its files are only "
                                  "on the hosts that wrote them until the next start, so it cannot be loaded now")
        model_sd = get_model_state_dict(self.model, options=self.model_options)
        try:
            dcp.load({"model": model_sd}, checkpoint_id=str(step_dir(self.root, step)))
        except (Exception, CheckpointException) as exc:  # NOTE: CheckpointException is a BaseException
            raise CheckpointError(f"checkpoint step-{step:08d} could not be loaded for export: "
                                  f"{describe_failure(exc)}") from None
        set_model_state_dict(self.model, model_sd, options=self.model_options)

    def close(self) -> None:
        self.wait()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if self._stager is not None:
            self._stager.close()


def _done(value) -> Future:
    """A Future already holding `value` (a synchronous save commits through the same path as a background one)."""
    future: Future = Future()
    future.set_result(value)
    return future
