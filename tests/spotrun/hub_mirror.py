"""A loopback stand-in for the Hugging Face hub's HTTP API: the routes huggingface_hub's `snapshot_download` and
`model_info` call (huggingface_hub 2.x: hf_api.py `repo_info`/`list_repo_tree`, file_download.py `hf_hub_download`),
serving model directories built here. Strict: any other route, method, repository, revision or file is a 404
(with the hub's X-Error-Code, so huggingface_hub raises its own RepositoryNotFound/RevisionNotFound/EntryNotFound),
and every request is recorded so a test can say what was fetched.

A repository is one commit of a directory's top-level files, reachable by its 40-digit sha and by its branches.
Regular files get the git blob id as their ETag; .safetensors are LFS files (ETag the SHA-256 of their bytes), as
on the hub.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin")


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str
    branches: dict[str, str] = field(default_factory=dict)  # branch -> commit

    def resolve(self, revision: str) -> str | None:
        return revision if revision == self.commit else self.branches.get(revision)


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubMirror:
    """`with HubMirror() as hub: hub.add("org/name", model_dir)`; `hub.endpoint` is the HF_ENDPOINT to use."""

    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path)
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                mirror._serve(self, body=True)

            def do_HEAD(self):  # noqa: N802
                mirror._serve(self, body=False)

            def log_message(self, *args):  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(self, repo: str, directory: Path, *, branch: str = "main") -> str:
        """Serve `directory`'s top-level files as `repo` at a commit named by their content; returns the commit."""
        files = {p.name: p.read_bytes() for p in sorted(Path(directory).iterdir()) if p.is_file()}
        commit = hashlib.sha1(repr(sorted((k, _blob_id(v)) for k, v in files.items())).encode()).hexdigest()
        self.repos[repo] = Repo(files, commit, {branch: commit})
        return commit

    def downloads(self) -> list[str]:
        return [path for method, path in self.requests if method == "GET" and "/resolve/" in path]

    def __enter__(self) -> HubMirror:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    # ---- the routes ----

    def _serve(self, req: BaseHTTPRequestHandler, *, body: bool) -> None:
        path = unquote(urlsplit(req.path).path)
        self.requests.append((req.command, path))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and body:
            repo, kind, revision = "/".join(parts[2:4]), parts[4], "/".join(parts[5:])
            if kind == "revision":
                return self._repo_info(req, repo, revision)
            if kind == "tree":
                return self._tree(req, repo, revision)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._file(req, "/".join(parts[:2]), parts[3], "/".join(parts[4:]), body)
        self._error(req, 404, "EntryNotFound", f"no route {req.command} {path}")

    def _lookup(self, req, repo: str, revision: str) -> tuple[Repo, str] | None:
        found = self.repos.get(repo)
        if found is None:
            self._error(req, 404, "RepoNotFound", f"Repository {repo} not found")
            return None
        commit = found.resolve(revision)
        if commit is None:
            self._error(req, 404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return found, commit

    def _repo_info(self, req, repo: str, revision: str) -> None:
        found = self._lookup(req, repo, revision)
        if found:
            self._json(req, {"id": repo, "modelId": repo, "sha": found[1], "private": False,
                             "siblings": [{"rfilename": name} for name in found[0].files]})

    def _tree(self, req, repo: str, revision: str) -> None:
        found = self._lookup(req, repo, revision)
        if found:
            entries = []
            for name, data in found[0].files.items():
                entry = {"type": "file", "oid": _blob_id(data), "size": len(data), "path": name}
                if name.endswith(LFS_SUFFIXES):
                    entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
                entries.append(entry)
            self._json(req, entries)

    def _file(self, req, repo: str, revision: str, name: str, body: bool) -> None:
        found = self._lookup(req, repo, revision)
        if not found:
            return
        data = found[0].files.get(name)
        if data is None:
            return self._error(req, 404, "EntryNotFound", f"{name} does not exist at {revision}")
        lfs = name.endswith(LFS_SUFFIXES)
        etag = hashlib.sha256(data).hexdigest() if lfs else _blob_id(data)
        req.send_response(200)
        req.send_header("Content-Length", str(len(data)))
        req.send_header("Content-Type", "application/octet-stream")
        req.send_header("ETag", f'"{etag}"')
        if lfs:
            req.send_header("X-Linked-Etag", f'"{etag}"')
            req.send_header("X-Linked-Size", str(len(data)))
        req.send_header("X-Repo-Commit", found[1])
        req.end_headers()
        if body:
            req.wfile.write(data)

    def _json(self, req, value) -> None:
        data = json.dumps(value).encode()
        req.send_response(200)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)

    def _error(self, req, status: int, code: str, message: str) -> None:
        data = json.dumps({"error": message}).encode()
        req.send_response(status)
        req.send_header("X-Error-Code", code)
        req.send_header("X-Error-Message", message)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        if req.command != "HEAD":
            req.wfile.write(data)
