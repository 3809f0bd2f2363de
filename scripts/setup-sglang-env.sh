#!/bin/bash
# Builds a separate environment in which one SGLang release imports and builds models on CPU:
# .sglang-venv (the newest tested release, 0.5.23) by default, or .sglang-venv-X for
# SGLANG_VERSION=X (the capture plugin's matrix, docs/extract.md "Supported SGLang releases").
# The export test (tests/test_export_sglang.py) runs SGLang's own EAGLE-3 weight loading in it.
#
# Why a separate environment: SGLang pins its torch and the CUDA 13 stack, so a plain
# `pip install sglang` pulls gigabytes of CUDA wheels and replaces the CPU torch. Here the CPU torch
# goes in first, and the packages that would drag CUDA torch in go in with --no-deps.
# Idempotent: does nothing when the environment is complete (stamp file), rebuilds when it is not.
# usage: [SGLANG_VERSION=X] scripts/setup-sglang-env.sh [VENV_DIR]
#        (default VENV_DIR: .sglang-venv for the newest, .sglang-venv-X for another release)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
newest=0.5.23
sglang_version=${SGLANG_VERSION:-$newest}
# Per release: the pins that go in with --no-deps (sglang's own pins, CPU-safe), then the pins of
# the import-time dependencies that differ between releases (from each wheel's METADATA).
case "$sglang_version" in
  0.5.23) nodeps="xgrammar==0.2.7"
          pins="transformers==5.19.0 tokenizers==0.23.2 openai==2.8.0 apache-tvm-ffi==0.1.11 llguidance>=1.7.6,<2" ;;
  0.5.22) nodeps="xgrammar==0.2.7"
          pins="transformers==5.19.0 tokenizers==0.23.2 openai==2.6.1 apache-tvm-ffi==0.1.11 llguidance>=1.7.6,<2" ;;
  0.5.18) nodeps="xgrammar==0.2.1"
          pins="transformers==5.12.1 openai==2.6.1 apache-tvm-ffi==0.1.11 llguidance>=1.7.6,<2" ;;
  0.5.14) nodeps="xgrammar==0.2.1"
          pins="transformers==5.8.1 openai==2.6.1 apache-tvm-ffi==0.1.9 llguidance>=0.7.11,<0.8" ;;
  *) echo "setup-sglang-env: SGLANG_VERSION=$sglang_version has no pins here (known: 0.5.14 0.5.18 0.5.22 0.5.23); add a row to this script's table (docs/extract.md, \"Adding a release\")" >&2
     exit 2 ;;
esac
if [ "$sglang_version" = "$newest" ]; then default_venv=$root/.sglang-venv; else default_venv=$root/.sglang-venv-$sglang_version; fi
venv=${1:-$default_venv}
stamp=$venv/.hsmon-sglang-ready
# bump when this script changes what it installs (the newest's stamp stays "1": no rebuild of .sglang-venv)
version=1
[ "$sglang_version" = "$newest" ] || version="1 sglang==$sglang_version"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version" ]; then
  touch "$stamp"  # newer than this script: make stops asking
  echo "sglang env ready: $venv"
  exit 0
fi
python=${PYTHON:-python3}
rm -rf "$venv"
"$python" -m venv "$venv"
log=$venv/setup.log
echo "building $venv with sglang $sglang_version (about 2 minutes, 2.8 GB; log: $log)"
trap 'echo "setup-sglang-env: failed; last lines of $log:" >&2; tail -20 "$log" >&2' ERR
pip="pip_quiet"
pip_quiet() { "$venv/bin/python" -m pip "$@" >>"$log" 2>&1; }
$pip install -q --upgrade pip
$pip install -q torch==2.13.0
# shellcheck disable=SC2086  # the pins are words
$pip install -q --no-deps "sglang==$sglang_version" torchvision==0.28.0 compressed-tensors==0.18.0 $nodeps
# What sglang needs to import its server and model modules on CPU (its own list pulls CUDA).
# shellcheck disable=SC2086
$pip install -q $pins sentencepiece==0.2.1 \
  blobfile==3.0.0 openai-harmony==0.0.4 soundfile==0.13.1 \
  'mistral_common>=1.11.5' 'uvicorn>=0.51' 'pyzmq>=25.1.2' \
  'prometheus-client>=0.20.0' fastapi uvloop orjson msgspec psutil setproctitle requests aiohttp \
  numpy pydantic python-multipart pybase64 xxhash einops partial_json_parser interegular packaging \
  tqdm safetensors pillow tiktoken regex watchfiles zstandard scipy triton IPython gguf dill loguru \
  jsonschema nvidia-ml-py easydict python-dateutil torch==2.13.0
# torchvision 0.28.0 on PyPI is a CUDA build: its compiled ops cannot load beside CPU torch, and two
# of its fake-op registrations then raise at import. Register them only when the ops loaded.
meta=$(echo "$venv"/lib/python3*/site-packages/torchvision/_meta_registrations.py)
sed -i -E 's/^@torch\.library\.register_fake\("(torchvision::[a-z_]+)"\)/@(torch.library.register_fake("\1") if torchvision.extension._has_ops() else (lambda f: f))/' "$meta"
# sgl-kernel has no CPU wheel; the project's stand-in (tests/sglang_stubs) goes on PYTHONPATH at use.
PYTHONPATH=$root/tests/sglang_stubs SGLANG_USE_CPU_ENGINE=1 "$venv/bin/python" -c \
  "import sglang.srt.models.llama_eagle3, sglang.srt.entrypoints.http_server" >>"$log" 2>&1
echo "$version" > "$stamp"
echo "sglang env ready: $venv"
