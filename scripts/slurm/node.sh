#!/bin/bash
# One node's part of a scripts/slurm/train.slurm job (one srun step a node). train.slurm
# sets the roles and the rendezvous in TIDER_* variables; the arguments are the stage, the
# recipe, the accelerate config and the trainer's extra arguments.
#
# The node's GPUs (CUDA_VISIBLE_DEVICES as SLURM set it, else 0..GPUS_PER_NODE-1) are split
# here, inside one step, so no two SLURM steps have to share a node:
#   vllm    the first TIDER_VLLM_TP GPUs serve the policy to GRPO's server mode
#   reader  the last TIDER_READER_GPUS GPUs serve the answer_correct reader
#   trainer the first TIDER_TRAIN_GPUS of the rest run `accelerate launch`, one rank each
# A node without the trainer role serves until train.slurm stops it; servers end with the
# node's step. Server logs go to TIDER_LOG_DIR (JOBNAME-JOBID/ beside the job's log).
set -euo pipefail
STAGE=$1 RECIPE=$2 ACCEL=$3
shift 3
ROLES=+${TIDER_ROLES:?}+
has() { [[ "$ROLES" == *"+$1+"* ]]; }

if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then IFS=, read -ra GPUS <<< "$CUDA_VISIBLE_DEVICES"
else mapfile -t GPUS < <(seq 0 $((${GPUS_PER_NODE:-8} - 1))); fi
take() { local IFS=,; echo "${GPUS[*]:$1:$2}"; }  # GPUs from index $1, $2 of them

run() {  # run (or, in a dry run, print) a command with CUDA_VISIBLE_DEVICES=$1, in the background if $2 is bg
    local devices=$1 mode=$2; shift 2
    if [[ "${TIDER_DRY_RUN:-0}" == 1 ]]; then echo "CUDA_VISIBLE_DEVICES=$devices $*"; return; fi
    if [[ "$mode" == bg ]]; then CUDA_VISIBLE_DEVICES=$devices "$@" & else CUDA_VISIBLE_DEVICES=$devices "$@"; fi
}
# Servers started here stop with this step: on exit and when SLURM or train.slurm sends TERM.
stop_servers() { local status=$? pids; pids=$(jobs -p); if [[ -n "$pids" ]]; then kill $pids 2>/dev/null || true; wait || true; fi; exit $status; }
trap stop_servers EXIT
trap 'exit 143' TERM

# Networking from SLURM: vLLM and NCCL bind to this node's address as SLURM resolves its
# name (set VLLM_HOST_IP, NCCL_SOCKET_IFNAME or GLOO_SOCKET_IFNAME in the submitting shell
# to choose another interface; srun passes the environment on).
if [[ -z "${VLLM_HOST_IP:-}" && -n "${SLURMD_NODENAME:-}" ]]; then
    VLLM_HOST_IP=$(getent hosts "$SLURMD_NODENAME" | awk '{print $1; exit}') || true
    if [[ -n "$VLLM_HOST_IP" ]]; then export VLLM_HOST_IP; fi
fi
if [[ "${TIDER_DRY_RUN:-0}" == 1 ]]; then  # as the node's processes see them (a child shell)
    bash -c 'echo "network: VLLM_HOST_IP=${VLLM_HOST_IP:-unset (the node name did not resolve)} NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-unset}" \
        "GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-unset}"'
fi
first=0  # next free GPU for vllm/trainer
SERVERS=()  # "role pid" of the servers this step started
if has vllm; then
    # The recipe's vllm_max_model_length, as the colocated engine gets it (else tider serve's 4096).
    run "$(take 0 "$TIDER_VLLM_TP")" bg tider serve --for-trl --model "$TIDER_VLLM_MODEL" --host 0.0.0.0 \
        --port "$TIDER_VLLM_PORT" --tensor-parallel-size "$TIDER_VLLM_TP" --startup-timeout 1800 \
        ${TIDER_VLLM_MAX_LEN:+--max-model-len "$TIDER_VLLM_MAX_LEN"} --log "$TIDER_LOG_DIR/vllm.log"
    SERVERS+=("vllm $!")
    first=$TIDER_VLLM_TP
fi
if has reader; then
    # The served name is the recipe's reader_model, which the trainer sends as `model`.
    run "$(take $((${#GPUS[@]} - TIDER_READER_GPUS)) "$TIDER_READER_GPUS")" bg tider serve --skip-check \
        --model "$TIDER_READER_MODEL" --served-model-name "$TIDER_READER_MODEL" --host 0.0.0.0 \
        --port "$TIDER_READER_PORT" --tensor-parallel-size "$TIDER_READER_GPUS" \
        --max-model-len "$TIDER_READER_MAX_LEN" --startup-timeout 1800 --log "$TIDER_LOG_DIR/reader.log"
    SERVERS+=("reader $!")
fi
# The step dies whole: a server that exits while this node still needs it (a model missing,
# out of memory, a crash) ends the step with its name and log, instead of leaving the
# trainer to time out on it (up to vllm_server_timeout / reader_wait_timeout).
watch() {  # watch PID: return when PID ends (its status); exit 1 naming the server when one ends first
    local pid=$1 entry role spid status
    while kill -0 "$pid" 2>/dev/null; do
        for entry in "${SERVERS[@]}"; do
            read -r role spid <<< "$entry"
            if ! kill -0 "$spid" 2>/dev/null; then
                status=0; wait "$spid" || status=$?
                echo "node.sh: the $role server on ${SLURMD_NODENAME:-$(hostname)} exited (status $status)" \
                    "while the job needed it; stopping the job. Its log: $TIDER_LOG_DIR/$role.log" >&2
                [[ "$pid" == "$$" ]] || kill "$pid" 2>/dev/null || true
                exit 1
            fi
        done
        sleep "${TIDER_WATCH_INTERVAL:-5}"
    done
    status=0; wait "$pid" || status=$?
    return "$status"
}
if ! has trainer; then
    if [[ "${TIDER_DRY_RUN:-0}" != 1 ]]; then watch $$; fi  # serve until stopped, or fail naming the server
    exit 0
fi
# The trainer waits (bounded) for the servers: TRL's client for vLLM (vllm_server_timeout),
# tider's reader probe for the reader (reader_wait_timeout); no sleep here. Static
# rendezvous: node i is machine rank i and global rank 0 sits on the first node, which hosts
# the store (c10d would ignore --machine_rank and let any node that resolves
# MASTER_ADDR as its own host the store).
run "$(take "$first" "$TIDER_TRAIN_GPUS")" bg accelerate launch \
    --config_file "configs/accelerate/${ACCEL}.yaml" \
    --num_machines "$TIDER_NUM_MACHINES" \
    --num_processes $((TIDER_NUM_MACHINES * TIDER_TRAIN_GPUS)) \
    --machine_rank "$TIDER_MACHINE_RANK" \
    --main_process_ip "$TIDER_MASTER_ADDR" \
    --main_process_port "$TIDER_MASTER_PORT" \
    --rdzv_backend static \
    -m tider.cli "$STAGE" --config "$RECIPE" "$@"
if [[ "${TIDER_DRY_RUN:-0}" != 1 ]]; then watch $!; fi
