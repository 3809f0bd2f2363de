#!/bin/bash
# Builds .sglang-venv: a separate environment in which SGLang 0.5.23 imports and builds models on CPU.
# The export test (tests/test_export_sglang.py) runs SGLang's own EAGLE-3 weight loading in it.
#
# Why a separate environment: sglang 0.5.23 pins torch 2.14.1 and the CUDA 13 stack, so a plain
# `pip install sglang` pulls gigabytes of CUDA wheels and replaces the CPU torch. Here the CPU torch
# goes in first, and the packages that would drag CUDA torch in go in with --no-deps.
# Idempotent: does nothing when the environment is complete (stamp file), rebuilds when it is not.
# usage: scripts/setup-sglang-env.sh [VENV_DIR]   (default: .sglang-venv at the repository root)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/.sglang-venv}
stamp=$venv/.hsmon-sglang-ready
version=1  # bump when this script changes what it installs
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version" ]; then
  touch "$stamp"  # newer than this script: make stops asking
  echo "sglang env ready: $venv"
  exit 0
fi
python=${PYTHON:-python3}
rm -rf "$venv"
"$python" -m venv "$venv"
log=$venv/setup.log
echo "building $venv (about 2 minutes, 2.8 GB; log: $log)"
trap 'echo "setup-sglang-env: failed; last lines of $log:" >&2; tail -20 "$log" >&2' ERR
pip="pip_quiet"
pip_quiet() { "$venv/bin/python" -m pip "$@" >>"$log" 2>&1; }
$pip install -q --upgrade pip
$pip install -q torch==2.13.0
$pip install -q --no-deps sglang==0.5.23 torchvision==0.28.0 compressed-tensors==0.18.0 xgrammar==0.2.7
# What sglang needs to import its server and model modules on CPU (its own list pulls CUDA).
$pip install -q transformers==5.19.0 tokenizers==0.23.2 sentencepiece==0.2.1 openai==2.8.0 \
  blobfile==3.0.0 openai-harmony==0.0.4 apache-tvm-ffi==0.1.11 soundfile==0.13.1 \
  'llguidance>=1.7.6,<2' 'mistral_common>=1.11.5' 'uvicorn>=0.51' 'pyzmq>=25.1.2' \
  'prometheus-client>=0.20.0' fastapi uvloop orjson msgspec psutil setproctitle requests aiohttp \
  numpy pydantic python-multipart pybase64 xxhash einops partial_json_parser interegular packaging \
  tqdm safetensors pillow tiktoken regex watchfiles zstandard scipy triton IPython gguf dill loguru \
  jsonschema nvidia-ml-py easydict python-dateutil
# torchvision 0.28.0 on PyPI is a CUDA build: its compiled ops cannot load beside CPU torch, and two
# of its fake-op registrations then raise at import. Register them only when the ops loaded.
meta=$(echo "$venv"/lib/python3*/site-packages/torchvision/_meta_registrations.py)
sed -i -E 's/^@torch\.library\.register_fake\("(torchvision::[a-z_]+)"\)/@(torch.library.register_fake("\1") if torchvision.extension._has_ops() else (lambda f: f))/' "$meta"
# sgl-kernel has no CPU wheel; the project's stand-in (tests/sglang_stubs) goes on PYTHONPATH at use.
PYTHONPATH=$root/tests/sglang_stubs SGLANG_USE_CPU_ENGINE=1 "$venv/bin/python" -c \
  "import sglang.srt.models.llama_eagle3" >>"$log" 2>&1
echo "$version" > "$stamp"
echo "sglang env ready: $venv"
