#!/usr/bin/env bash
# Example: GPT pretraining with Megatron-LM and the Zephon loader on a GPU cluster.
#
# One torchrun per node (SLURM shown; adapt the rendezvous to your scheduler). Needs on every
# node: this repository installed (pip install -e ".[megatron]"), Transformer Engine, and a
# Megatron-LM checkout at the tag of the installed megatron-core (core_v0.16.1 here).
#
# The masking flags must match the data recipe (pretrain_packed.toml fixes all three); a
# mismatch stops the launch before any GPU work. Loader state is written with every checkpoint
# under $CKPT/dataloader, one file per data-parallel rank, and read back on resume at any
# data-parallel size that divides the recipe's lanes (8). Keep --global-batch-size a multiple
# of --micro-batch-size times the data-parallel size.
set -euo pipefail

MEGATRON_LM=${MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout (core_v0.16.1)}
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
CKPT=${CKPT:-$PWD/checkpoints/gpt-zephon}
RECIPE=${RECIPE:-$REPO/recipes/megatron/pretrain_packed.toml}
VALID_RECIPE=${VALID_RECIPE:-$REPO/recipes/megatron/validation.toml}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NNODES=${SLURM_NNODES:-1}
NODE_RANK=${SLURM_NODEID:-0}
MASTER_ADDR=${MASTER_ADDR:-$(scontrol show hostnames "${SLURM_JOB_NODELIST:-localhost}" 2>/dev/null | head -n 1 || echo localhost)}
MASTER_PORT=${MASTER_PORT:-29500}

export PYTHONPATH="$MEGATRON_LM${PYTHONPATH:+:$PYTHONPATH}"
export CUDA_DEVICE_MAX_CONNECTIONS=1

MODEL=(
  --num-layers 24 --hidden-size 2048 --num-attention-heads 16 --ffn-hidden-size 8192
  --seq-length 4096 --max-position-embeddings 4096 --position-embedding-type rope
  --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights
  --transformer-impl transformer_engine --bf16
)
PARALLEL=(--tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 --sequence-parallel)
TRAINING=(
  --micro-batch-size 2 --global-batch-size 512 --train-iters 50000
  --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2000
  --weight-decay 0.1 --clip-grad 1.0 --use-distributed-optimizer
  --calculate-per-token-loss
)
DATA=(
  --dataloader zephon --zephon-recipe "$RECIPE" --zephon-valid-recipe "$VALID_RECIPE"
  --reset-position-ids --reset-attention-mask --eod-mask-loss
  --dataloader-save "$CKPT/dataloader"
)
CHECKPOINTS=(
  --save "$CKPT" --load "$CKPT" --save-interval 1000
  --eval-interval 1000 --eval-iters 20 --log-interval 10
)

exec python -m torch.distributed.run \
  --nproc-per-node "$GPUS_PER_NODE" --nnodes "$NNODES" --node-rank "$NODE_RANK" \
  --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
  -m zephon_megatron.pretrain_gpt \
  "${MODEL[@]}" "${PARALLEL[@]}" "${TRAINING[@]}" "${DATA[@]}" "${CHECKPOINTS[@]}" "$@"
