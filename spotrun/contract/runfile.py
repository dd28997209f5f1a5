"""The one loader of run files: every command that reads a run JSON (validate, estimate, simulate, start, local,
demo) reads it with `load_run_file`.

In order: the file's size (at most 256 KiB, Step Functions' input limit, checked before reading it), the strict
decoder (spotrun.contract.spec.decode_run: a UTF-8 BOM is dropped, UTF-16/32 and non-UTF-8 bytes are refused, duplicate
keys and huge integers are kept to be refused by field), the contract (parse_run), then local sources made
absolute: a relative `model.source`, `data.source` or `data.validation` is read relative to the run file's
directory, wherever the command runs from. s3:// URIs and hub ids (hf://) are left as they are; a model.source
written as a bare hub name (`Qwen/Qwen2-0.5B`) with nothing at its path is refused naming `hf://Qwen/Qwen2-0.5B`.
Every problem is a RunValidationError naming the field (`run` for the file itself).
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .hub_id import HUB_SCHEME, meant_hub_id
from .spec import MAX_RUN_BYTES, RunSpec, RunValidationError, decode_run, parse_run

SOURCE_FIELDS = (("model", "source"), ("data", "source"), ("data", "validation"))
DEMO_DIR = Path(__file__).resolve().parents[2] / "examples" / "demo"  # `make demo`'s run file, its assets beside


@dataclass(frozen=True)
class RunFile:
    path: Path
    """The run file as given."""
    raw: dict
    """The decoded run JSON with local sources made absolute (what a pipeline is given)."""
    run: RunSpec
    """The validated run (of `raw`)."""
    written: dict
    """The decoded run JSON as written (relative sources relative): what errors about a source quote."""


def read_run_bytes(path: Path) -> bytes:
    """The file's bytes, refused by size before reading (a 10 MB file is not read whole)."""
    try:
        info = Path(path).stat()
        stream = stat.S_ISFIFO(info.st_mode) or stat.S_ISCHR(info.st_mode) or stat.S_ISSOCK(info.st_mode)
        # a pipe (`cat run.json | spotrun estimate /dev/stdin`) has no size: read at most one byte over the limit
        data = _read_stream(Path(path)) if stream else b""
        size = len(data) if stream else info.st_size
        if size > MAX_RUN_BYTES:
            raise RunValidationError("run", str(path), f"a file of at most {MAX_RUN_BYTES:,} bytes (Step Functions' "
                                     f"input limit); this one has {size:,}{' or more' if stream else ''}")
        return data if stream else Path(path).read_bytes()
    except (OSError, ValueError) as exc:
        if isinstance(exc, RunValidationError):
            raise
        raise RunValidationError("run", str(path), f"a readable file ({_unreadable(exc)})") from None


def _read_stream(path: Path) -> bytes:
    """A pipe's or device's bytes, at most one over the limit: opened without waiting for a writer (a FIFO nobody
    writes to would block `open` for ever: a new user's `mkfifo fifo.json; spotrun validate fifo.json` hung), then
    read waiting for the writer's data; with no writer the read ends at once, empty."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        os.set_blocking(fd, True)
        chunks, size = [], 0
        while size <= MAX_RUN_BYTES and (chunk := os.read(fd, MAX_RUN_BYTES + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _unreadable(exc: Exception) -> str:
    """Why the run file cannot be read, in the words the other inputs use (a source's 'nothing is there'), not the
    operating system's text ('No such file or directory', a new user's `simulate missing.json`)."""
    if isinstance(exc, FileNotFoundError):
        return "nothing is there"
    if isinstance(exc, IsADirectoryError):
        return "it is a directory"
    if isinstance(exc, PermissionError):
        return "you may not read it: permission denied"
    if isinstance(exc, NotADirectoryError):
        return "a part of the path is a file, not a directory"
    if isinstance(exc, ValueError):  # a NUL in the path
        return "not a usable path: it holds a NUL character"
    if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:
        return "its name is too long for the system"
    return "the system could not read it"


def resolve_sources(raw: dict, base: Path) -> dict:
    """A copy of a parsed run's JSON with each local source (not s3:// or hf://) absolute, relative ones read from
    `base`."""
    out = {**raw}
    for section, key in SOURCE_FIELDS:
        source: Any = (raw.get(section) or {}).get(key)
        if isinstance(source, str) and source and not source.startswith(("s3://", HUB_SCHEME)):
            try:
                out[section] = {**out[section], key: str((base / source).resolve())}
            except (OSError, ValueError) as exc:  # a NUL in the path, a name too long for the system
                raise RunValidationError(f"{section}.{key}", source, f"a path ({exc})") from None
    return out


def load_run_file(path: Path | str) -> RunFile:
    """The run file decoded strictly, checked against the contract, with its local sources absolute."""
    path = Path(path)
    raw = decode_run(read_run_bytes(path), str(path))
    parse_run(raw)  # the contract first, on the values as written: its errors name the field and that value
    resolved = resolve_sources(raw, path.parent)
    _demo_before_its_assets(path, raw, resolved)
    _hub_name_as_a_path(raw, resolved)
    return RunFile(path=path, raw=resolved, run=parse_run(resolved), written=raw)


def _demo_before_its_assets(path: Path, written: dict, resolved: dict) -> None:
    """The demo's shipped run file read before `make demo` built the sources it names (assets/ beside the copy
    the demo makes): said so, rather than a missing directory or a hub id it never meant."""
    if path.resolve().parent != DEMO_DIR:
        return
    for section, key in SOURCE_FIELDS:
        source = (written.get(section) or {}).get(key)
        where = (resolved.get(section) or {}).get(key)
        if isinstance(source, str) and where != source and not Path(where).exists():
            raise RunValidationError(f"{section}.{key}", source, "a source that exists: this file is the demo's "
                                     f"template, and {source} is built by `make demo` (`spotrun demo --out "
                                     "demo-output`) beside its copy, demo-output/run.json: run `make demo`, then "
                                     "`spotrun estimate demo-output/run.json`")


def _hub_name_as_a_path(written: dict, resolved: dict) -> None:
    """A model.source written `org/name` (a hub name without hf://) that is no local path: refused naming the hub
    id it probably meant, quoting what was written rather than the path it was made into."""
    source = (written.get("model") or {}).get("source")
    meant = meant_hub_id(source)
    where = Path(resolved["model"]["source"]) if meant else None
    if where is not None and not where.exists():
        raise RunValidationError("model.source", source, f"a local model directory (nothing is at {where}), an "
                                 f"s3:// URI or a hub id: did you mean {meant}?")
