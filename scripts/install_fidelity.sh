#!/usr/bin/env bash
# Build (or reuse) the scheduler-fidelity venv: vLLM 0.19.1's real Scheduler/KVCacheManager on a
# CPU-only machine, beside an editable install of this checkout (see docs/fidelity.md).
#
#   venv="$(bash scripts/install_fidelity.sh)" && "$venv/bin/python" -m fidelity.run
#   bash scripts/install_fidelity.sh --print-path    # only print where the venv lives
#
# Standard output is the venv path and nothing else (progress and pip go to standard error).
#
# The venv lives outside the checkout (it is about 3.5 GB):
# ${FIDELITY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/servesweep/venv-fidelity-<vLLM version>}.
# A venv whose stamp file records the same Python and pins (the list below) is reused; any
# other is rebuilt from scratch (`venv --clear`). This checkout is installed into it (editable,
# --no-deps) on every run, so a venv reused from another checkout imports this one.
#
# - torch first, pinned: the pin resolves to the CPU build (an unpinned torch would pull a
#   multi-GB CUDA build).
# - vLLM with --no-deps (its metadata pins a CUDA torch), then only the modules the
#   scheduler import path needs.
# - this project with --no-deps (its compiled core built by pip in an isolated build env),
#   plus the few runtime modules engine/ and workloads/ import.
set -euo pipefail

VLLM_VERSION="0.19.1"
TORCH_VERSION="2.13.0"
# What vLLM 0.19.1's scheduler path (vllm.config, vllm.v1.core.*, vllm.v1.request,
# vllm.v1.outputs, the structured-output manager) imports; ranges are those vLLM 0.19.1's
# metadata accepts. triton comes without any CUDA runtime (vLLM disables it: no driver).
VLLM_RUNTIME=(
  "transformers>=4.56,<4.58" huggingface_hub tokenizers safetensors sentencepiece
  msgspec cbor2 blake3 pybase64 "pydantic>=2.12" pyyaml regex psutil py-cpuinfo
  "pyzmq>=25" cloudpickle "prometheus_client>=0.18" "openai>=2" "openai-harmony>=0.0.3"
  "llguidance>=1.3,<1.4" "xgrammar>=0.1.32,<1" "gguf>=0.17" einops "diskcache==5.6.3"
  cachetools setproctitle uvloop "aiohttp>=3.13.3" requests pillow tqdm numpy triton
)
# engine/ and workloads/ need numpy and pandas only; the differential tests need pytest.
PROJECT_RUNTIME=("pandas>=2.2,<4" "pytest>=8" "pytest-timeout>=2.3")

VENV="${FIDELITY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/servesweep/venv-fidelity-$VLLM_VERSION}"
case "${1:-}" in
  --print-path) echo "$VENV"; exit 0 ;;
  "") ;;
  *) echo "usage: bash scripts/install_fidelity.sh [--print-path]" >&2; exit 2 ;;
esac

exec 3>&1 1>&2  # fd 3: the one line of standard output (the venv path)

REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3.11}"
STAMP="$VENV/servesweep-fidelity.stamp"
PY_VERSION="$("$PY" -c 'import platform; print(platform.python_version())')"
want_stamp="python $PY_VERSION
torch==$TORCH_VERSION
vllm==$VLLM_VERSION
${VLLM_RUNTIME[*]}
${PROJECT_RUNTIME[*]}"

PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)

build() {
  if [ -e "$VENV" ] && [ ! -f "$VENV/pyvenv.cfg" ] && [ -n "$(ls -A "$VENV")" ]; then
    echo "$VENV exists and is not a venv; refusing to clear it." \
      "Remove it or point FIDELITY_VENV elsewhere." >&2
    exit 1
  fi
  echo "building the fidelity venv at $VENV (a few minutes)" >&2
  mkdir -p "$(dirname "$VENV")"
  "$PY" -m venv --clear "$VENV"
  "${PIP[@]}" --upgrade pip setuptools wheel
  "${PIP[@]}" "torch==$TORCH_VERSION"
  "${PIP[@]}" --no-deps "vllm==$VLLM_VERSION"
  "${PIP[@]}" "${VLLM_RUNTIME[@]}"
  "${PIP[@]}" "${PROJECT_RUNTIME[@]}"
}

# This checkout, without its (heavy: ray, mlflow, ...) dependency list, then the check that
# counts: CPU torch, vLLM's schedulers import, engine/ and fidelity/ come from this checkout.
# Run from / so that the imports come from the installed package, not from the current folder.
install_and_check() {
  # With build isolation: pip fetches what pyproject.toml's [build-system] lists (setuptools,
  # Cython) to compile the engine's core for this venv's Python.
  "${PIP[@]}" --no-deps -e "$REPO" || return 1
  (cd / && REPO="$REPO" VLLM_VERSION="$VLLM_VERSION" "$VENV/bin/python" - <<'PY'
import os
from pathlib import Path

import torch

assert not torch.version.cuda, f"a CUDA torch got installed: {torch.version.cuda}"
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: F401
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: F401
import vllm, engine, fidelity  # noqa: E401,F401

assert vllm.__version__ == os.environ["VLLM_VERSION"], vllm.__version__
repo = Path(os.environ["REPO"]).resolve()
for mod in (engine, fidelity):
    where = Path(mod.__file__).resolve()
    assert where.is_relative_to(repo), f"{mod.__name__} imports from {where}, not {repo}"
print(f"fidelity venv ready: vllm {vllm.__version__}, torch {torch.__version__}")
PY
  )
}

if [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want_stamp" ]; then
  echo "reusing the fidelity venv at $VENV (its stamp matches the pins)" >&2
  if ! install_and_check; then
    echo "the reused venv fails its check; rebuilding it" >&2
    rm -f "$STAMP"
    build
    install_and_check
  fi
else
  build
  install_and_check
fi
printf '%s\n' "$want_stamp" > "$STAMP"
echo "$VENV" >&3
