#!/bin/bash
# The EAGLE-3 drafter trained on several nodes with torchrun (DDP; NCCL on GPUs). Run this on every
# node with its NODE_RANK; node 0's address is MASTER_ADDR. Only rank 0 writes events and
# checkpoints; --resume continues from the latest checkpoint after a failure (run the same command
# again with the same number of processes). The daemon on node 0 watches the training:
#   hsmon daemon --job train --kind train --events "$OUT/events.jsonl" --out "$OUT"
#
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=gpu-node-01 examples/torchrun-train.sh
set -euo pipefail

NNODES=${NNODES:-2}
NODE_RANK=${NODE_RANK:?set NODE_RANK (0 on the first node)}
MASTER_ADDR=${MASTER_ADDR:?set MASTER_ADDR (the first node)}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
DATA=${DATA:-/data/hsmon/prompts}
OUT=${OUT:-/data/hsmon/drafter}
MODEL=${MODEL:-/models/target}
export PYTHONUNBUFFERED=1

exec torchrun \
    --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$GPUS_PER_NODE" \
    --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:29500" --rdzv-id hsmon-train \
    -m hsmon train "$DATA" --out "$OUT" --target-model "$MODEL" --events "$OUT/events.jsonl" --resume
