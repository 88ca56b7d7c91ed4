#!/usr/bin/env bash
# Example: GPT pretraining with Megatron-LM and the Zephon loader on a GPU cluster.
#
# One torchrun per node (SLURM shown; adapt the rendezvous to your scheduler). Needs on every
# node: this repository installed (pip install -e ".[megatron-training]"), Transformer Engine,
# and a Megatron-LM checkout at the tag of the installed megatron-core (core_v0.16.1 with
# Python 3.11; core_v0.19.x with Python 3.12).
#
# The masking flags must match the data recipe (pretrain_packed.toml fixes all three); a
# mismatch stops the launch before any GPU work, as do evaluation without validation data and
# a validation recipe too small for one evaluation. The loader state is written into every
# checkpoint ($CKPT/iter_N/mp_rank_*/train_dataloader_dprank*.pt) and read back on resume.
# Lanes: 8 per data-parallel reader of the first launch (DP = 4 x nodes here: 96 lanes on 3
# nodes), kept by every resume, which works at any data-parallel size dividing them (1, 2, 3,
# 4, 6 or 12 nodes after a 3-node start). Set LANES to choose them yourself. Keep
# --global-batch-size a multiple of --micro-batch-size times the data-parallel size.
set -euo pipefail

MEGATRON_LM=${MEGATRON_LM:?set MEGATRON_LM to a Megatron-LM checkout (core_v0.16.1 or core_v0.19.x)}
REPO=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}
CKPT=${CKPT:-$PWD/checkpoints/gpt-zephon}
RECIPE=${RECIPE:-$REPO/recipes/megatron/pretrain_packed.toml}
# Held-out data: one evaluation reads EVAL_ITERS x 480 rows of 4,097 tokens (10: about 20M
# tokens); the provider refuses a validation recipe that cannot fill it. Empty: no evaluation.
VALID_RECIPE=${VALID_RECIPE-$REPO/recipes/megatron/validation.toml}
EVAL_ITERS=${EVAL_ITERS:-10}
# 480 rows of 4,097 tokens: divisible by micro batch x DP on 1-6, 10, 12, 15 or 20 nodes (DP = 4
# x nodes), so a resume on another node count keeps the same global batches.
GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-480}
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
  --micro-batch-size 2 --global-batch-size "$GLOBAL_BATCH_SIZE" --train-iters 50000
  --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2000
  --weight-decay 0.1 --clip-grad 1.0 --use-distributed-optimizer
  --calculate-per-token-loss
)
DATA=(
  --dataloader zephon --zephon-recipe "$RECIPE"
  --reset-position-ids --reset-attention-mask --eod-mask-loss
)
if [[ -n "$VALID_RECIPE" ]]; then
  DATA+=(--zephon-valid-recipe "$VALID_RECIPE" --eval-iters "$EVAL_ITERS")
else
  DATA+=(--eval-iters 0)
fi
if [[ -n "${LANES:-}" ]]; then
  DATA+=(--zephon-lanes "$LANES")
fi
CHECKPOINTS=(--save "$CKPT" --load "$CKPT" --save-interval 1000 --eval-interval 1000 --log-interval 10)

exec python -m torch.distributed.run \
  --nproc-per-node "$GPUS_PER_NODE" --nnodes "$NNODES" --node-rank "$NODE_RANK" \
  --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
  -m zephon_megatron.pretrain_gpt \
  "${MODEL[@]}" "${PARALLEL[@]}" "${TRAINING[@]}" "${DATA[@]}" "${CHECKPOINTS[@]}" "$@"
