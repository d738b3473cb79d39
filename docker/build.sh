#!/usr/bin/env bash
# Builds p2prl's images where a Docker Engine runs, also with no image registry reachable:
#   bash docker/build.sh cpu     -> p2prl:cpu
#   bash docker/build.sh gpu     -> p2prl:gpu (vLLM's CUDA build; built, and started without a GPU, anywhere)
#   bash docker/build.sh base    -> only the base image (see below)
#
# Base image: the official python:3.11-slim-bookworm when it is present or can be pulled; otherwise
# a Debian bookworm root made with debootstrap (python3, venv, CA certificates) and `docker import`ed
# as p2prl-base:bookworm. The root's tarball is cached, so the next build on a fresh engine imports it
# in seconds. P2PRL_BASE_IMAGE=<image> forces a base; P2PRL_BASE_IMAGE=local forces the debootstrap one.
#
# Wheels: the CPU torch wheel is collected by the host's pip into a cached wheel directory and handed
# to the build (docker/wheels/, git-ignored); the other packages come from the package index, which
# pip inside the build reaches with the host's CA bundle as a BuildKit secret (P2PRL_CA_BUNDLE,
# default /etc/ssl/certs/ca-certificates.crt: for TLS-inspecting proxies). P2PRL_WHEELS=all instead
# builds every dependency as a wheel on the host, pins their versions, and installs from them alone.
#
# Cache: P2PRL_DOCKER_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/p2prl/docker).
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-cpu}
TAG=${P2PRL_TAG:-p2prl:$what}
CACHE=${P2PRL_DOCKER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/p2prl/docker}
OFFICIAL=python:3.11-slim-bookworm
CUDA_OFFICIAL=nvidia/cuda:13.0.2-base-ubuntu24.04
LOCAL_BASE=p2prl-base:bookworm
SUITE=bookworm
MIRROR=${P2PRL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
TORCH_VERSION=${P2PRL_TORCH_VERSION:-2.13.0}
CA=${P2PRL_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
# Debian's 20.10 client speaks BuildKit natively (a newer client would need buildx).
DOCKER=${DOCKER:-$(command -v /usr/bin/docker || command -v docker)}
export DOCKER_BUILDKIT=1

say() { echo "build.sh: $*" >&2; }

have_image() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

local_base() {
  # A minimal bookworm root with what python:3.11-slim-bookworm offers the Dockerfile.
  if have_image "$LOCAL_BASE"; then return; fi
  local tarball="$CACHE/base-$SUITE.tar"
  if [ ! -s "$tarball" ]; then
    command -v debootstrap >/dev/null || { say "debootstrap is not installed (apt-get install debootstrap)"; exit 1; }
    local root
    root=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    say "debootstrap $SUITE into $root (a few minutes, once)"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
      "$SUITE" "$root" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
      || { tail -20 "$CACHE/debootstrap.log" >&2; rm -rf "$root"; exit 1; }
    ln -sf /usr/bin/python3 "$root/usr/local/bin/python"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
  fi
  say "importing $tarball as $LOCAL_BASE"
  "$DOCKER" import --change 'CMD ["python3"]' "$tarball" "$LOCAL_BASE" >/dev/null
}

pick_base() {
  case "${P2PRL_BASE_IMAGE:-}" in
    local) local_base; echo "$LOCAL_BASE"; return ;;
    "") ;;
    *) echo "$P2PRL_BASE_IMAGE"; return ;;
  esac
  if have_image "$OFFICIAL" || timeout 60 "$DOCKER" pull -q "$OFFICIAL" >/dev/null 2>&1; then
    echo "$OFFICIAL"
  else
    say "$OFFICIAL cannot be pulled: using a debootstrap base"
    local_base
    echo "$LOCAL_BASE"
  fi
}

pick_gpu_base() {
  # The GPU image needs no CUDA toolkit in its base (torch's wheels carry the CUDA runtime, the
  # NVIDIA container toolkit mounts the driver): NVIDIA's CUDA base when present or pullable, else
  # the debootstrap one. P2PRL_CUDA_IMAGE=<image> forces a base, P2PRL_CUDA_IMAGE=local the debootstrap one.
  case "${P2PRL_CUDA_IMAGE:-}" in
    local) local_base; echo "$LOCAL_BASE"; return ;;
    "") ;;
    *) echo "$P2PRL_CUDA_IMAGE"; return ;;
  esac
  if have_image "$CUDA_OFFICIAL" || timeout 60 "$DOCKER" pull -q "$CUDA_OFFICIAL" >/dev/null 2>&1; then
    echo "$CUDA_OFFICIAL"
  else
    say "$CUDA_OFFICIAL cannot be pulled: using a debootstrap base (the CUDA runtime comes with torch's wheels)"
    local_base
    echo "$LOCAL_BASE"
  fi
}

wheels() {
  # The wheel directory in the build context: torch's CPU wheel, and the dependencies' wheels.
  local dir="$CACHE/wheels" ctx=docker/wheels
  mkdir -p "$dir" "$ctx"
  if ! ls "$dir"/torch-"$TORCH_VERSION"*.whl >/dev/null 2>&1; then
    say "collecting the CPU torch $TORCH_VERSION wheel"
    python3 -m pip download -q --no-deps -d "$dir" "torch==$TORCH_VERSION" \
      ${P2PRL_TORCH_INDEX:+--index-url "$P2PRL_TORCH_INDEX"} \
      || python3 -m pip download -q --no-deps -d "$dir" --index-url https://download.pytorch.org/whl/cpu "torch==$TORCH_VERSION"
  fi
  if [ "${P2PRL_WHEELS:-torch}" = all ] && { [ ! -s "$dir/constraints.txt" ] || [ pyproject.toml -nt "$dir/constraints.txt" ]; }; then
    say "building the dependencies' wheels"
    # with the package's build requirements: the build installs from these wheels alone
    python3 -m pip wheel -q -w "$dir" "$dir"/torch-"$TORCH_VERSION"*.whl . "setuptools>=77" wheel
    rm -f "$dir"/p2prl-*.whl
    # pin each wheel's version, so pip in the build takes these and not newer ones from the index
    (cd "$dir" && for w in *.whl; do
      n=${w%%-[0-9]*}; rest=${w#"$n"-}; echo "${n//_/-}==${rest%%-*}"
    done | sort -u >constraints.txt.tmp && mv constraints.txt.tmp constraints.txt)
  fi
  # hard links (or copies across file systems) keep the context in step with the cache
  find "$ctx" -mindepth 1 -name '*.whl' -delete
  rm -f "$ctx/constraints.txt"
  for f in "$dir"/*.whl "$dir"/constraints.txt; do
    [ -e "$f" ] && { ln -f "$f" "$ctx/" 2>/dev/null || cp "$f" "$ctx/"; }
  done
  if [ "${P2PRL_WHEELS:-torch}" != all ]; then rm -f "$ctx"/constraints.txt; find "$ctx" -name '*.whl' ! -name 'torch-*' -delete; fi
}

mkdir -p "$CACHE"
case "$what" in
  base) pick_base ;;
  cpu)
    base=$(pick_base)
    wheels
    secret=()
    [ -s "$CA" ] && secret=(--secret "id=ca,src=$CA")
    say "building $TAG on $base"
    only=0
    [ "${P2PRL_WHEELS:-torch}" = all ] && only=1
    "$DOCKER" build -f docker/Dockerfile -t "$TAG" --build-arg "PYTHON_IMAGE=$base" \
      --build-arg "TORCH_VERSION=$TORCH_VERSION" --build-arg "WHEELS_ONLY=$only" "${secret[@]}" .
    "$DOCKER" image ls "$TAG" --format '{{.Repository}}:{{.Tag}} {{.Size}}'
    ;;
  gpu)
    base=$(pick_gpu_base)
    vllm=$(sed -n 's/^vllm = \["vllm==\([^"]*\)".*/\1/p' pyproject.toml)
    [ -n "$vllm" ] || { say "no vllm pin in pyproject.toml's vllm extra"; exit 1; }
    secret=()
    [ -s "$CA" ] && secret=(--secret "id=ca,src=$CA")
    say "building $TAG on $base (vLLM $vllm and its CUDA torch from the package index: several GB, once)"
    "$DOCKER" build -f docker/Dockerfile.gpu -t "$TAG" --build-arg "CUDA_IMAGE=$base" \
      --build-arg "VLLM_VERSION=$vllm" "${secret[@]}" .
    "$DOCKER" image ls "$TAG" --format '{{.Repository}}:{{.Tag}} {{.Size}}'
    ;;
  *) echo "usage: $0 cpu|gpu|base" >&2; exit 2 ;;
esac
