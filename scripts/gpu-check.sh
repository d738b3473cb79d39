#!/usr/bin/env bash
# One command that checks a GPU machine runs p2prl's miner honestly, and prints one table:
# honest CUDA miner against a CUDA and a CPU validator, verification's cost against generation on a
# Qwen2.5-0.5B shape, a version switch in place (p2prl/bench/gpu.py says what each check does).
#
#   bash scripts/gpu-check.sh                      # a CUDA machine: the full check (minutes)
#   bash scripts/gpu-check.sh --vllm               # also a version switch inside a running vLLM
#   bash scripts/gpu-check.sh --device cpu --quick # no GPU: the same checks, small, on the CPU
#
# It runs in an existing CUDA environment (torch and transformers installed) from this checkout,
# without installing p2prl and whatever its typer: it calls the benchmark functions, not the CLI.
# What the proof code needs beyond that (pynacl, blake3, zstandard, trio) it reports when missing.
# On a machine with no package index, bring them as wheels:
#   bash scripts/gpu-check.sh --download-wheels DIR [--python 3.12]   # where PyPI is reachable
#   bash scripts/gpu-check.sh --wheels DIR ...                        # there: installed into a private
#                                                                     # folder, only filling gaps
# Exit status: 0 all checks passed, 1 a check failed, 3 no CUDA device (one line says so), 4 missing
# packages. $OUT (or --out DIR) receives each check's JSON record as it ends.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
# what the proof, patch and engine code import that a CUDA image may lack (trio's own dependencies too)
EXTRA_WHEELS=(pynacl cffi pycparser blake3 zstandard trio outcome sniffio attrs sortedcontainers idna)

wheels=""
pyver=""
download=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) wheels=${2:?--wheels DIR}; shift 2 ;;
    --download-wheels) download=${2:?--download-wheels DIR}; shift 2 ;;
    --python) pyver=${2:?--python X.Y}; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exec "$PY" -m p2prl.bench.gpu --help ;;
    *) args+=("$1"); shift ;;
  esac
done

if [ -n "$download" ]; then
  pyver=${pyver:-$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')}
  mkdir -p "$download"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$download" "${EXTRA_WHEELS[@]}"
  echo "gpu-check: wheels for Python $pyver in $download: carry them over and run with --wheels $download"
  exit 0
fi

export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
site=""
if [ -n "$wheels" ]; then
  site=${P2PRL_WHEELS_SITE:-${TMPDIR:-/tmp}/p2prl-gpu-check-site}
  if [ ! -d "$site" ]; then
    "$PY" -m pip install -q --no-index --no-deps --target "$site.tmp" "$wheels"/*.whl
    mv "$site.tmp" "$site"
  fi
fi
# The carried packages go at the end of sys.path: those the environment already has win.
exec "$PY" -c 'import runpy, sys
site = sys.argv.pop(1)
if site:
    sys.path.append(site)
sys.argv[0] = "gpu-check"
runpy.run_module("p2prl.bench.gpu", run_name="__main__")' "$site" ${args[@]+"${args[@]}"}
