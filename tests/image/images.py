"""Docker for the image tests: the daemon check, the stand-in base image, the trainer image built from the asset
directory a CDK synth stages, exactly as `cdk deploy` builds it (the asset manifest's Dockerfile, build arguments
and platform; only BASE_IMAGE and TORCH_PIP changed).

The stand-in base (standin/Dockerfile) replaces the SageMaker PyTorch image, which no registry here can serve:
Debian bookworm from `debootstrap` (Debian's own mirror, the tool's default) imported as an image, then Python
with torch's wheel as this machine's pip resolves `torch==<the pin>`. Both are cached in the daemon under tags
keyed by a hash of their inputs, so a second run on the same daemon rebuilds neither; from nothing, both build.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SUITE = "bookworm"  # Debian 12: Python 3.11, the CPython the torch wheel here is built for
DEBIAN_PACKAGES = ("python3", "python3-venv", "ca-certificates")
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # Debian's bundle of this machine's trusted CAs
# The legacy builder: Debian's docker.io 20.10 daemon and any newer CLI agree on it without the buildx plugin.
BUILD_ENV = {"DOCKER_BUILDKIT": "0"}


class DockerError(RuntimeError):
    pass


def docker(*args: str, timeout: float = 600, check: bool = True, env: dict | None = None,
           cwd: Path | None = None) -> str:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise DockerError(f"docker {' '.join(args[:3])} ... exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                          f"{proc.stderr[-3000:]}")
    return proc.stdout


def unavailable() -> str | None:
    """Why the image tests cannot run here (None: they can): they need a Docker daemon, and root for debootstrap."""
    if shutil.which("docker") is None:
        return "no docker CLI on PATH (CI installs Debian's docker.io: .ci/dockerd.sh)"
    try:
        proc = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                              text=True, timeout=30)
    except subprocess.TimeoutExpired:
        proc = None
    if proc is None or proc.returncode != 0:
        said = proc.stderr.strip().splitlines()[-1] if proc is not None and proc.stderr.strip() else "no answer"
        return f"no Docker daemon at DOCKER_HOST={os.environ.get('DOCKER_HOST', '(default)')} ({said}); as root, " \
               "`eval \"$(.ci/dockerd.sh start)\"` starts one"
    if os.geteuid() != 0:
        return "not root: the stand-in base image is made with debootstrap, which needs root"
    if shutil.which("debootstrap") is None:
        return "no debootstrap (apt-get install debootstrap)"
    return None


def _has_image(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def debian_rootfs() -> str:
    """`debootstrap` Debian into a directory and `docker import` it (cached by suite and package list)."""
    tag = f"spotrun-standin-debian:{_key(SUITE, *DEBIAN_PACKAGES)}"
    if _has_image(tag):
        return tag
    with tempfile.TemporaryDirectory(prefix="spotrun-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}", SUITE,
                        str(rootfs)], check=True, capture_output=True, timeout=1200)
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(rootfs / cache, ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(["docker", "import", "-", tag], stdin=tar.stdout, check=True, capture_output=True,
                       timeout=600)
        if tar.wait() != 0:
            raise DockerError("tar of the debootstrap root failed")
    return tag


def torch_pin() -> str:
    lines = (REPO / "training_image" / "requirements.txt").read_text().splitlines()
    return next(line.strip() for line in lines if line.startswith("torch=="))


def standin_base() -> str:
    """The stand-in base image's tag, built when its inputs changed."""
    rootfs = debian_rootfs()
    dockerfile = HERE / "standin" / "Dockerfile"
    with tempfile.TemporaryDirectory(prefix="spotrun-standin-") as tmp:
        context = Path(tmp)
        wheels = context / "wheels"
        # Whatever this machine's pip resolves for the pin (a local wheel directory its config names, or an index).
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "--dest", str(wheels), torch_pin()], check=True, capture_output=True, timeout=1200)
        wheel = next(wheels.glob("torch-*.whl"))
        trust = Path(os.environ.get("SSL_CERT_FILE", HOST_CA_BUNDLE)).read_text()
        key = _key(rootfs, dockerfile.read_text(), trust, wheel.name, str(wheel.stat().st_size))
        tag = f"spotrun-standin-base:{key}"
        if _has_image(tag):
            return tag
        shutil.copy(dockerfile, context / "Dockerfile")
        (context / "ca-certificates.crt").write_text(trust)
        docker("build", "--tag", tag, "--build-arg", f"DEBIAN_ROOTFS={rootfs}", str(context), timeout=1800,
               env=BUILD_ENV)
        docker("image", "prune", "--force")  # the install stage, left untagged
    return tag


@dataclass(frozen=True)
class AssetBuild:
    tag: str
    directory: Path
    seconds: float
    size_bytes: int
    build_args: dict[str, str]


def trainer_asset(cdk_out: Path) -> tuple[Path, dict]:
    """The trainer image's staged directory and its manifest entry (source: directory, dockerFile,
    dockerBuildArgs, platform), from the synthesized assembly's asset manifests: what `cdk deploy` builds."""
    found = []
    for manifest in Path(cdk_out).rglob("*.assets.json"):
        for entry in json.loads(manifest.read_text()).get("dockerImages", {}).values():
            source = entry["source"]
            found.append((manifest.parent / source["directory"], source))
    if len(found) != 1:
        raise AssertionError(f"expected one Docker image asset in {cdk_out}, found {len(found)}: {found}")
    return found[0]


def build_trainer(cdk_out: Path, *, base: str, torch_pip: str, tag: str) -> AssetBuild:
    """`docker build` the staged asset as cdk-assets does, with only BASE_IMAGE and TORCH_PIP replaced."""
    directory, source = trainer_asset(cdk_out)
    args = {**source.get("dockerBuildArgs", {}), "BASE_IMAGE": base, "TORCH_PIP": torch_pip}
    command = ["build", "--tag", tag, "--file", source.get("dockerFile", "Dockerfile")]
    for name, value in args.items():
        command += ["--build-arg", f"{name}={value}"]
    if source.get("platform"):
        command += ["--platform", source["platform"]]
    started = time.monotonic()
    docker(*command, ".", timeout=1800, env=BUILD_ENV, cwd=directory)
    seconds = time.monotonic() - started
    size = int(docker("image", "inspect", "--format", "{{.Size}}", tag).strip())
    return AssetBuild(tag=tag, directory=directory, seconds=seconds, size_bytes=size, build_args=args)
