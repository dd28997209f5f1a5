#!/usr/bin/env bash
# Start or stop a Docker daemon for the image tests (tests/image): Debian's docker.io (and docker-compose, which the
# SageMaker SDK's local mode drives), as root, on its own socket, data root and pid file, so it never touches a
# daemon someone else runs. The data root is kept between runs (it caches the stand-in base image, tagged by a
# hash of its inputs); `stop` kills only the daemon this script started (by its pid file) and removes the bridges
# and iptables chains it created.
#   .ci/dockerd.sh start   -> prints `export DOCKER_HOST=...` on success; exit 1 if the daemon does not answer
#   .ci/dockerd.sh stop
set -euo pipefail
RUN_DIR=/run/spotrun-docker
DATA_ROOT=${SPOTRUN_DOCKER_DATA_ROOT:-/var/lib/spotrun-docker}
SOCK=unix://$RUN_DIR/docker.sock
PIDFILE=$RUN_DIR/dockerd.pid
LOG=$RUN_DIR/dockerd.log

start() {
  # docker-compose: the SageMaker Python SDK's local mode runs its containers with it
  # (tests/image/test_sagemaker_local.py).
  if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null || ! command -v docker-compose >/dev/null; then
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io debootstrap \
      debian-archive-keyring docker-compose >/dev/null
  fi
  mkdir -p "$RUN_DIR" "$DATA_ROOT"
  if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    echo "export DOCKER_HOST=$SOCK"; return 0
  fi
  # Its own containerd too (under the exec root), so nothing outlives `stop`.
  dockerd --host "$SOCK" --data-root "$DATA_ROOT" --exec-root "$RUN_DIR/exec" --pidfile "$PIDFILE" \
    >"$LOG" 2>&1 </dev/null &
  for _ in $(seq 60); do
    if DOCKER_HOST=$SOCK /usr/bin/docker version >/dev/null 2>&1; then
      echo "export DOCKER_HOST=$SOCK"; return 0
    fi
    sleep 1
  done
  echo "dockerd did not answer within 60 s; its log:" >&2
  tail -20 "$LOG" >&2
  return 1
}

stop() {
  if [ -f "$PIDFILE" ]; then
    pid=$(cat "$PIDFILE")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$PIDFILE"
  fi
  # What dockerd leaves behind when stopped: its bridges and its iptables chains (jumps first, then the chains).
  for link in $(ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}' | grep -E '^(docker0|br-)' || true); do
    ip link delete "$link" 2>/dev/null || true
  done
  for table in filter nat; do
    if iptables-save -t "$table" 2>/dev/null | grep -q DOCKER; then
      iptables-save -t "$table" | grep -v -E 'DOCKER|docker0|-i br-|-o br-' | iptables-restore
    fi
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
