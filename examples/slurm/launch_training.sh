#!/bin/bash
# Seed 003's launcher script, runnable: start examples/production_train.py on this node through the
# neural_arch launcher.
#
#     ./launch_training.sh WORLD_SIZE STRATEGY BATCH_SIZE [production_train.py options...]
#
#     ./launch_training.sh 4 ddp 32                          # one node, 4 ranks (processes on CPU)
#     ./launch_training.sh 8 fsdp 64 --epochs 2 --mixed-precision
#
#     # two nodes, 8 ranks each: the same line on each node (seed 003's multi-node recipe)
#     export MASTER_ADDR=<node0 address> NODE_RANK=0 NEURAL_ARCH_AUTH_TOKEN=<one secret for the job>
#     NPROC_PER_NODE=8 ./launch_training.sh 16 ddp 32        # node 1: the same with NODE_RANK=1
#
#     # under Slurm: one task per node, each runs this script (node rank and master from SLURM_*)
#     sbatch --nodes=2 --ntasks-per-node=1 --wrap \
#         'export NEURAL_ARCH_AUTH_TOKEN=$(python -c "import secrets; print(secrets.token_hex(16))");
#          srun examples/slurm/launch_training.sh 16 ddp 32'
#
# WORLD_SIZE counts ranks (the seed's "GPUs"; CPU processes here). Environment: NPROC_PER_NODE (default:
# WORLD_SIZE / SLURM_NNODES under Slurm, else WORLD_SIZE), NODE_RANK (default SLURM_NODEID, else 0),
# MASTER_ADDR (default: Slurm's first node, else 127.0.0.1), MASTER_PORT (default 15000 + job id % 20000
# under Slurm, else 29500; one node without it: a free port), BACKEND (gloo), PYTHON (python), CHECKPOINT_DIR (./checkpoints). Several nodes
# need NEURAL_ARCH_AUTH_TOKEN exported, the same on every node. Each node's output goes to stdout with
# [rankN]: prefixes. The script finds production_train.py next to its own folder, so run it from its
# place in a checkout (sbatch copies a batch script away: start this one with srun, as above).
set -euo pipefail

if [ $# -lt 3 ]; then
    echo "usage: $0 WORLD_SIZE STRATEGY BATCH_SIZE [production_train.py options...]" >&2
    exit 2
fi
WORLD_SIZE=$1
STRATEGY=$2
BATCH_SIZE=$3
shift 3

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TRAIN=$HERE/../production_train.py
PYTHON=${PYTHON:-python}
BACKEND=${BACKEND:-gloo}
PORT_OPTION=()

if [ -n "${SLURM_JOB_ID:-}" ]; then
    NNODES=${SLURM_NNODES:-1}
    NODE_RANK=${NODE_RANK:-${SLURM_NODEID:-0}}
    MASTER_ADDR=${MASTER_ADDR:-$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)}
    MASTER_PORT=${MASTER_PORT:-$((15000 + SLURM_JOB_ID % 20000))}
    NPROC_PER_NODE=${NPROC_PER_NODE:-$((WORLD_SIZE / NNODES))}
else
    NPROC_PER_NODE=${NPROC_PER_NODE:-$WORLD_SIZE}
    NODE_RANK=${NODE_RANK:-0}
    MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
    NNODES=$((WORLD_SIZE / NPROC_PER_NODE))
    if [ "$NNODES" -eq 1 ] && [ -z "${MASTER_PORT:-}" ]; then
        PORT_OPTION=(--standalone)      # one node, no port given: the launcher picks a free one
    fi
    MASTER_PORT=${MASTER_PORT:-29500}
fi
if [ $((NNODES * NPROC_PER_NODE)) -ne "$WORLD_SIZE" ]; then
    echo "$0: WORLD_SIZE=$WORLD_SIZE is not $NNODES nodes x NPROC_PER_NODE=$NPROC_PER_NODE" >&2
    exit 2
fi
if [ "$NNODES" -gt 1 ] && [ -z "${NEURAL_ARCH_AUTH_TOKEN:-}" ]; then
    echo "$0: $NNODES nodes need the same NEURAL_ARCH_AUTH_TOKEN exported on every node:" >&2
    echo "  export NEURAL_ARCH_AUTH_TOKEN=\$($PYTHON -c 'import secrets; print(secrets.token_hex(16))')" >&2
    exit 2
fi

SHOWN_PORT=$MASTER_PORT
[ ${#PORT_OPTION[@]} -eq 0 ] || SHOWN_PORT="<a free port>"
echo "launch_training: node $NODE_RANK of $NNODES, $NPROC_PER_NODE ranks here, world $WORLD_SIZE," \
     "strategy $STRATEGY, batch $BATCH_SIZE, master $MASTER_ADDR:$SHOWN_PORT"
exec "$PYTHON" -m neural_arch.distributed.launcher \
    --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "$NPROC_PER_NODE" \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" "${PORT_OPTION[@]}" --backend "$BACKEND" \
    "$TRAIN" --strategy "$STRATEGY" --batch-size "$BATCH_SIZE" \
    --checkpoint-dir "${CHECKPOINT_DIR:-./checkpoints}" "$@"
