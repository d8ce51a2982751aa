#!/bin/sh
# The real launchers on the GPU machine (where torch, hence torchrun, is installed): the recipe on 2
# CPU ranks (CUDA_VISIBLE_DEVICES= so both ranks share no GPU) started by `torchrun --no-python`,
# by `python3 -m torch.distributed.run`, by DeepSpeed's launcher and by `accelerate launch` when
# they are importable (Accelerate's `--cpu` runs one process unless under mpirun: --multi_gpu is its
# torchrun path, which needs no GPU), each checked to learn and compared loss for loss with `mpirun -np 2`.
#   sh tests/bench/launchers_gpu.sh [ZRUN] [DATA_FILE]
Z=${1:-./zrun}; D=${2:-.gpu/wiki.valid.raw}
export CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=4 ZRUN_COMM_TIMEOUT=120
tmp=$(mktemp -d)
A="recipes/finetune_llama.lua data=$D max_steps=20 logging_steps=1 learning_rate=3e-3 save_strategy=no eval_strategy=no --config configs/zero2.json"
losses() { grep -o '"loss":[^,}]*' "$1/metrics.jsonl" | tr '\n' ' '; }
TR=$(command -v torchrun || echo /opt/torch/.venv/bin/torchrun)
run() { # NAME CMD...
  name=$1; shift; echo "### $name: $*"
  timeout 300 "$@" output_dir="$tmp/$name" >"$tmp/$name.log" 2>&1; rc=$?
  grep -v "it/s\]" "$tmp/$name.log" | grep "zrun\]\|finetune_llama\] done\|zrun:\|rror" | tail -4; echo "exit $rc"
  [ $rc -eq 0 ] && $Z tests/mpi/learn_check.lua "$tmp/$name/metrics.jsonl" "$name learns" 0.5
}
. tests/mpi/mpi_env.sh; export OMP_NUM_THREADS=4
run mpirun mpirun $MPI_FLAGS -np 2 $Z $A
run torchrun "$TR" --nproc_per_node 2 --master_port 29535 --no-python $Z $A
run torch_distributed_run python3 -m torch.distributed.run --nproc_per_node 2 --master_port 29545 --no-python $Z $A
if python3 -c "import deepspeed" 2>/dev/null; then
  # with no GPU visible DeepSpeed picks its CPU accelerator, which sets CUDA_VISIBLE_DEVICES=0,1 for
  # its 2 "devices": device=cpu keeps both ranks on the CPU as under the other launchers
  run deepspeed_launcher python3 -m deepspeed.launcher.runner --num_nodes 1 --num_gpus 2 --master_port 29555 --no_python --no_local_rank $Z $A device=cpu
  # without device=cpu both ranks find the one GPU of this machine: expect a one-line refusal
  run deepspeed_launcher_one_gpu python3 -m deepspeed.launcher.runner --num_nodes 1 --num_gpus 2 --master_port 29575 --no_python --no_local_rank $Z $A
else echo "### deepspeed launcher: not importable here"; fi
if python3 -c "import accelerate" 2>/dev/null; then
  run accelerate_launch accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --main_process_port 29565 --no_python $Z $A
else echo "### accelerate launch: not importable here"; fi
ref=$(losses "$tmp/mpirun")
for n in torchrun torch_distributed_run deepspeed_launcher accelerate_launch; do
  [ -f "$tmp/$n/metrics.jsonl" ] || continue
  if [ "$(losses "$tmp/$n")" = "$ref" ]; then echo "SAME $n = mpirun -np 2, loss for loss"
  else echo "DIFFERENT $n: $(losses "$tmp/$n" | cut -c1-200) vs mpirun $(echo "$ref" | cut -c1-200)"; fi
done
rm -rf "$tmp"
