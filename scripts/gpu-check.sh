#!/usr/bin/env bash
# The SGLang capture path on a GPU, end to end (docs/extract.md, "Checking on a GPU").
#
#   scripts/gpu-check.sh            # cuda when nvidia-smi sees a GPU, else the small CPU fallback
#   DEVICE=cpu scripts/gpu-check.sh # force the CPU fallback (what the test runs)
#
# On an NVIDIA GPU: hsmon sglang-serve --device cuda on SmolLM2 (bf16), the daemon with NVML,
# hsmon extract --backend sglang --transport shm over 200 chat rows at concurrency 8, hsmon
# verify-data --backend hf on a sample (bf16 tolerances), tokens/s with and without capture.
# Ends with one RESULT line; exits non-zero when a step fails or the data disagrees.
# Environment: DEVICE, MODEL (a directory or preset), ROWS, CONCURRENCY, SAMPLE, TPS_TOKENS,
# TPS_REQUESTS, WORK (kept when given), DUMP_ROOT (default a fresh directory in /dev/shm), PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [[ -z ${DEVICE:-} ]]; then
    if nvidia-smi -L >/dev/null 2>&1; then DEVICE=cuda; else DEVICE=cpu; fi
fi
if [[ $DEVICE == cuda ]]; then
    defaults=(200 8 16 1024 64)
else
    echo "gpu-check: no NVIDIA GPU here: running the small CPU fallback (the GPU path is not exercised)" >&2
    defaults=(12 4 4 256 8)
fi
work=${WORK:-$(mktemp -d /tmp/hsmon-gpu-check.XXXXXX)}
dump_root=${DUMP_ROOT:-$(mktemp -d /dev/shm/hsmon-gpu-check.XXXXXX)}
cleanup() {
    [[ -n ${DUMP_ROOT:-} ]] || rm -rf "$dump_root"
    [[ -n ${WORK:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
model_args=()
[[ -n ${MODEL:-} ]] && model_args=(--model "$MODEL")
"$PYTHON" scripts/gpu_check.py --device "$DEVICE" "${model_args[@]}" \
    --rows "${ROWS:-${defaults[0]}}" --concurrency "${CONCURRENCY:-${defaults[1]}}" \
    --sample "${SAMPLE:-${defaults[2]}}" --tps-tokens "${TPS_TOKENS:-${defaults[3]}}" \
    --tps-requests "${TPS_REQUESTS:-${defaults[4]}}" --work "$work" --dump-root "$dump_root"
