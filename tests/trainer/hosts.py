"""Separate SageMaker hosts on one machine: a network namespace, hostname, PID namespace and /opt/ml per host, and
SageMaker's one checkpoint S3 prefix with each host's checkpoint directory synced to it as SageMaker syncs it.

What each host gets, as a SageMaker instance has it:
- its own network namespace whose only link is `eth0`, one end of a veth pair whose other end is on a bridge in
  a namespace of its own (the switch), with an address in a private /24 that exists only between these
  namespaces (nothing reaches the machine's network);
- `/etc/hosts` listing `algo-1` ... `algo-N` (`ip netns exec` bind-mounts /etc/netns/<ns>/hosts over it) and an
  empty resolver, while its own hostname is not listed (the case where gloo, left to resolve the hostname, binds
  127.0.0.1 and cannot reach its peers);
- `unshare --mount --uts --pid --fork --kill-child --mount-proc`: the launcher is PID 1 of its own PID namespace,
  with its own hostname, and its SageMaker root and checkpoint directory bind-mounted at /opt/ml and
  /opt/ml/checkpoints (when the machine has no /opt/ml, a tmpfs over /opt in that mount namespace holds the
  mount points; nothing outside the namespace sees any of it).

`CheckpointPrefix` is the job's CheckpointConfig.S3Uri: what SageMaker documents and what was seen under its own
local mode. At a job's start the whole prefix is copied into every host's (fresh) checkpoint directory; while
the job runs each host's new and changed files are uploaded and a file it deletes is deleted from the prefix,
but nothing comes down: each host sees only its own writes until the next start.

Needs root, `ip` (iproute2) and `unshare` (util-linux): `unavailable()` says which is missing.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from spotrun.local.harness import write_sagemaker_root

NAMES = ("algo-1", "algo-2")  # the two-host job's; Hosts(count) names algo-1 ... algo-<count>
NETNS_ETC = Path("/etc/netns")
SM_CHECKPOINTS = Path("/opt/ml/checkpoints")  # checkpointconfig.json's LocalPath, as SageMaker sets it
# Inside each host's namespaces: hostname, then the mounts, then the launcher as PID 1 (exec).
ENTRY = """set -e
hostname "$1"
[ -d /opt/ml ] || mount -t tmpfs spotrun-opt /opt
mkdir -p /opt/ml
mount --bind "$2" /opt/ml
mkdir -p /opt/ml/checkpoints
mount --bind "$3" /opt/ml/checkpoints
exec "$4" -m spotrun_trainer.launcher train
"""


def unavailable() -> str:
    """Why these hosts cannot be made here ("" when they can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, mounts)"
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (Debian package {package})"
    return ""


def _run(*cmd: str) -> None:
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {res.stderr.strip()}")


def host_names(count: int) -> tuple[str, ...]:
    return tuple(f"algo-{i + 1}" for i in range(count))


class Hosts:
    """`count` hosts on one bridge; `close()` removes everything `create()` made."""

    def __init__(self, count: int = 2) -> None:
        self.tag = f"spotrun{os.getpid()}"
        self.names = host_names(count)
        self.netns = [f"{self.tag}-{i + 1}" for i in range(count)]
        self.switch = f"{self.tag}-sw"
        octet = random.Random(os.getpid() * 8 + count).randrange(16, 250)
        self.addresses = [f"10.213.{octet}.{i + 1}" for i in range(count)]
        # Not in /etc/hosts: only GLOO_SOCKET_IFNAME makes gloo use eth0's address.
        self.hostnames = [f"ip-10-213-{octet}-{i + 1}" for i in range(count)]
        self._made_etc = False
        self.procs: list[subprocess.Popen] = []

    def create(self) -> "Hosts":
        self._made_etc = not NETNS_ETC.exists()
        hosts_file = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n"
                                                       for a, n in zip(self.addresses, self.names, strict=True))
        _run("ip", "netns", "add", self.switch)
        _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self.switch, "link", "set", "br0", "up")
        for i, (ns, addr) in enumerate(zip(self.netns, self.addresses, strict=True)):
            _run("ip", "netns", "add", ns)
            etc = NETNS_ETC / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file)
            (etc / "resolv.conf").write_text("# no name server: only /etc/hosts resolves\n")
            port = f"port{i + 1}"
            _run("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns",
                 self.switch)
            _run("ip", "-n", self.switch, "link", "set", port, "master", "br0")
            _run("ip", "-n", self.switch, "link", "set", port, "up")
            _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        return self

    def start(self, host: int, sm_root: Path, checkpoint_dir: Path, log: Path,
              env: dict[str, str] | None = None) -> subprocess.Popen:
        """The launcher of host `host` (0: algo-1), PID 1 in its namespaces, output appended to `log`."""
        full_env = {**os.environ, **(env or {}), "OMP_NUM_THREADS": "1"}
        (Path(sm_root) / "checkpoints").mkdir(exist_ok=True)  # the mount point
        cmd = ["ip", "netns", "exec", self.netns[host], "unshare", "--mount", "--uts", "--pid", "--fork",
               "--kill-child", "--mount-proc", "sh", "-c", ENTRY, "sh", self.hostnames[host], str(sm_root),
               str(checkpoint_dir), sys.executable]
        with open(log, "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env,
                                    start_new_session=True)
        self.procs.append(proc)
        return proc

    @staticmethod
    def launcher_pid(proc: subprocess.Popen, timeout: float = 30) -> int:
        """The launcher's pid as seen from here: unshare's one child (PID 1 inside)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            except OSError:
                children = []
            if children:
                return int(children[0])
            time.sleep(0.05)
        raise TimeoutError("the launcher did not start")

    def stop(self, proc: subprocess.Popen) -> None:
        """SageMaker's stop on one host: SIGTERM to its PID 1."""
        os.kill(self.launcher_pid(proc), signal.SIGTERM)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()  # unshare --kill-child then kills PID 1, and with it the whole PID namespace
                proc.wait(timeout=30)
        for ns in [*self.netns, self.switch]:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # also removes the veth pair
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        if self._made_etc:
            try:
                NETNS_ETC.rmdir()
            except OSError:
                pass


def _files(directory: Path) -> dict[str, str]:
    """Every file under `directory` by relative path, with its sha256."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(directory).rglob("*")) if p.is_file()}


class CheckpointPrefix:
    """SageMaker's one checkpoint S3 prefix as a directory, and every host's checkpoint directory synced with it.

    `download(local)` at a host's start: the prefix copied into an empty directory (a fresh instance). `upload(
    locals)` once the hosts have exited: each host's deletions since its start are deleted from the prefix, then
    its new and changed files are copied in: the state of a sync that kept up with the job, as far as the next
    start can tell (files land as whole files, which SageMaker does not promise). Two hosts writing one name with
    different contents fail the test: file names must be unique per host."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._started: dict[Path, dict[str, str]] = {}

    def download(self, local: Path) -> Path:
        if Path(local).exists():
            shutil.rmtree(local)
        shutil.copytree(self.root, local)
        self._started[Path(local)] = _files(local)
        return Path(local)

    def upload(self, locals_: list[Path]) -> None:
        now = {Path(d): _files(d) for d in locals_}
        for local in now:
            for name in self._started[local].keys() - now[local].keys():
                (self.root / name).unlink(missing_ok=True)
        written: dict[str, tuple[Path, str]] = {}
        for local, files in now.items():
            for name, digest in files.items():
                if self._started[local].get(name) == digest:
                    continue  # as it came down at the start: not uploaded again
                other = written.setdefault(name, (local, digest))
                assert other[1] == digest, f"{name} written differently by two hosts ({other[0]}, {local})"
                (self.root / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(local / name, self.root / name)
        for directory in sorted((p for p in self.root.rglob("*") if p.is_dir()), reverse=True):
            if not any(directory.iterdir()):
                directory.rmdir()  # S3 has no empty folders
        self._started = {}

    def files(self) -> dict[str, str]:
        return _files(self.root)


class Cluster:
    """One job on `hosts`: a SageMaker root per host, the job's checkpoint prefix, and each host's checkpoint
    directory (mounted at /opt/ml/checkpoints) synced with the prefix at each start and after the hosts exit."""

    def __init__(self, hosts: Hosts, root: Path, *, hyperparameters: dict, channels: dict[str, Path]):
        self.hosts, self.root = hosts, Path(root)
        self.prefix = CheckpointPrefix(self.root / "prefix")
        self.roots = [write_sagemaker_root(self.root / name, hyperparameters=hyperparameters,
                                           checkpoint_dir=SM_CHECKPOINTS, channels=channels, hosts=hosts.names,
                                           current_host=name) for name in hosts.names]
        self.locals = [self.root / f"{name}-checkpoints" for name in hosts.names]
        self._synced = False

    @property
    def output(self) -> Path:
        return self.roots[0] / "model"  # global rank 0 (algo-1) writes the losses and the export

    def failure(self, host: int) -> Path:
        return self.roots[host] / "output" / "failure"

    def start(self, ckpt_dirs: list[Path] | None = None) -> list[subprocess.Popen]:
        """Every host's launcher on a fresh copy of the prefix, or on `ckpt_dirs` as they are (no sync)."""
        self._synced = ckpt_dirs is None
        dirs = [self.prefix.download(d) for d in self.locals] if ckpt_dirs is None else ckpt_dirs
        return [self.hosts.start(i, root, d, root / "launcher.log")
                for i, (root, d) in enumerate(zip(self.roots, dirs, strict=True))]

    def finish(self, procs: list[subprocess.Popen], timeout: float = 400) -> list[int]:
        """Wait for every host, then upload what each wrote and delete what each deleted (see CheckpointPrefix)."""
        rcs = [p.wait(timeout=timeout) for p in procs]
        if self._synced:
            self.prefix.upload(self.locals)
        return rcs

    def run(self) -> list[int]:
        return self.finish(self.start())

    def text(self, host: int) -> str:
        return (self.roots[host] / "launcher.log").read_text(errors="replace")

    def texts(self) -> str:
        return "\n".join(f"--- {name}\n{self.text(i)[-3000:]}" for i, name in enumerate(self.hosts.names))
