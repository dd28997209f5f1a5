"""Separate SageMaker hosts on one machine: a network namespace, hostname, PID namespace and /opt/ml per host.

What each host gets, as a SageMaker instance has it:
- its own network namespace whose only link is `eth0`, one end of a veth pair joining the two hosts, with an
  address in a private /24 that exists only between these namespaces (nothing reaches the machine's network);
- `/etc/hosts` listing `algo-1` and `algo-2` (`ip netns exec` bind-mounts /etc/netns/<ns>/hosts over it) and an
  empty resolver, while its own hostname is not listed (the case where gloo, left to resolve the hostname, binds
  127.0.0.1 and cannot reach its peers);
- `unshare --mount --uts --pid --fork --kill-child --mount-proc`: the launcher is PID 1 of its own PID namespace,
  with its own hostname, and its SageMaker root and checkpoint directory bind-mounted at /opt/ml and
  /opt/ml/checkpoints (when the machine has no /opt/ml, a tmpfs over /opt in that mount namespace holds the
  mount points; nothing outside the namespace sees any of it).

Needs root, `ip` (iproute2) and `unshare` (util-linux): `unavailable()` says which is missing.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

NAMES = ("algo-1", "algo-2")
NETNS_ETC = Path("/etc/netns")
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


class Hosts:
    """Two hosts joined by one veth link; `close()` removes everything `create()` made."""

    def __init__(self) -> None:
        self.tag = f"spotrun{os.getpid()}"
        self.netns = [f"{self.tag}-{i + 1}" for i in range(len(NAMES))]
        octet = random.Random(os.getpid()).randrange(16, 250)
        self.addresses = [f"10.213.{octet}.{i + 1}" for i in range(len(NAMES))]
        # Not in /etc/hosts: only GLOO_SOCKET_IFNAME makes gloo use eth0's address.
        self.hostnames = [f"ip-10-213-{octet}-{i + 1}" for i in range(len(NAMES))]
        self._made_etc = False
        self.procs: list[subprocess.Popen] = []

    def create(self) -> "Hosts":
        self._made_etc = not NETNS_ETC.exists()
        hosts_file = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for a, n in zip(self.addresses, NAMES, strict=True))
        for ns in self.netns:
            _run("ip", "netns", "add", ns)
            etc = NETNS_ETC / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file)
            (etc / "resolv.conf").write_text("# no name server: only /etc/hosts resolves\n")
        a, b = self.netns
        _run("ip", "link", "add", "eth0", "netns", a, "type", "veth", "peer", "name", "eth0", "netns", b)
        for ns, addr in zip(self.netns, self.addresses, strict=True):
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
        for ns in self.netns:
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
