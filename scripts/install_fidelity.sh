#!/usr/bin/env bash
# Build the scheduler-fidelity venv: vLLM 0.19.1's real Scheduler/KVCacheManager on a CPU-only
# machine, beside an editable install of this project (see docs/fidelity.md).
#
#   bash scripts/install_fidelity.sh && /work/venv-fidelity/bin/python -m benchmarks.fidelity.run
#
# - torch==2.13.0 first: the pin resolves to the CPU build (an unpinned torch would pull a
#   multi-GB CUDA build).
# - vLLM with --no-deps (its metadata pins a CUDA torch), then only the modules the
#   scheduler import path needs.
# - this project with --no-deps, plus the few runtime modules engine/ and workloads/ import.
# Idempotent: re-running skips what is already installed. FIDELITY_VENV overrides the path.
set -euo pipefail

VENV="${FIDELITY_VENV:-/work/venv-fidelity}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3.11}"

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)

"${PIP[@]}" --upgrade pip setuptools wheel
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" --no-deps "vllm==0.19.1"

# What vLLM 0.19.1's scheduler path (vllm.config, vllm.v1.core.*, vllm.v1.request,
# vllm.v1.outputs, the structured-output manager) imports; ranges are those vLLM 0.19.1's
# metadata accepts. triton comes without any CUDA runtime (vLLM disables it: no driver).
"${PIP[@]}" \
  "transformers>=4.56,<4.58" huggingface_hub tokenizers safetensors sentencepiece \
  msgspec cbor2 blake3 pybase64 "pydantic>=2.12" pyyaml regex psutil py-cpuinfo \
  "pyzmq>=25" cloudpickle "prometheus_client>=0.18" "openai>=2" "openai-harmony>=0.0.3" \
  "llguidance>=1.3,<1.4" "xgrammar>=0.1.32,<1" "gguf>=0.17" einops "diskcache==5.6.3" \
  cachetools setproctitle uvloop "aiohttp>=3.13.3" requests pillow tqdm numpy triton

# This project, without its (heavy: ray, mlflow, ...) dependency list; engine/ and
# workloads/ need numpy and pandas only; the differential test needs pytest.
"${PIP[@]}" "pandas>=2.2,<4" "pytest>=8" "pytest-timeout>=2.3"
"${PIP[@]}" --no-deps -e "$REPO"
# pip may list vLLM's and servesweep's unmet pins above (CUDA torch 2.10, flashinfer, ray,
# mlflow, ...): expected, they are left out on purpose. The check below is what counts.

"$VENV/bin/python" - <<'PY'
import torch
assert not torch.version.cuda, f"a CUDA torch got installed: {torch.version.cuda}"
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: F401
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: F401
import vllm, engine  # noqa: E401,F401
print(f"fidelity venv ready: vllm {vllm.__version__}, torch {torch.__version__}")
PY
