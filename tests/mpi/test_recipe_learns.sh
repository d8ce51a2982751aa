#!/bin/sh
# The fine-tuning recipe learns with every shipped config, in fp32, bf16 and fp16 (the bf16_master
# ones in bf16), on 1 and 2
# ranks (built-in tiny Llama and text sample, CPU): 12 optimizer steps of 2 accumulated
# micro-batches must lower the logged loss by at least 1 nat (5.6 -> ~3.6 in practice), with a
# non-zero gradient norm at every step (tests/mpi/learn_check.lua). configs/ds_config.json fixes
# bf16, a 1B model's learning rate (2e-5) and 8 micro-batches per step; its copy here keeps every
# other setting and takes the tiny model's learning rate and 2 micro-batches.
. "$(dirname "$0")/mpi_env.sh"
Z=${ZRUN_BIN:-./zrun}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
sed -e 's/"lr": 2e-5/"lr": 3e-3/' -e 's/"gradient_accumulation_steps": 8/"gradient_accumulation_steps": 2/' \
  configs/ds_config.json > "$tmp/ds_config.json"
grep -q '"lr": 3e-3' "$tmp/ds_config.json" || echo "FAIL test_recipe_learns: configs/ds_config.json changed shape (lr not found)"
sed -e 's/"lr": 1e-4/"lr": 3e-3/' -e 's/"gradient_accumulation_steps": 1/"gradient_accumulation_steps": 2/' \
  configs/zero3_bf16_master.json > "$tmp/zero3_bf16_master.json"
grep -q '"lr": 3e-3' "$tmp/zero3_bf16_master.json" || echo "FAIL test_recipe_learns: configs/zero3_bf16_master.json changed shape"
run() { # np config precision label [the precision the run must report]
  out="$tmp/run_$4"
  rm -rf "$out"
  if [ "$1" = 1 ]; then launch="$Z"; else launch="mpirun $MPI_FLAGS -np $1 $Z"; fi
  log=$($launch recipes/finetune_llama.lua ${2:+--config "$2"} max_steps=12 logging_steps=1 gradient_accumulation_steps=2 \
    learning_rate=3e-3 save_strategy=no ${3:+precision=$3} output_dir="$out" $EXTRA 2>&1) ||
    { echo "FAIL $4: the recipe exited with an error: $(echo "$log" | tail -2 | tr '\n' ' ')"; return; }
  $Z tests/mpi/learn_check.lua "$out/metrics.jsonl" "$4" 1.0 $5
}
# no --config: the recipe's built-in config has no bf16/fp16 section, and precision= still decides
# (the Hugging Face Trainer adds the section for args.bf16 / args.fp16)
run 1 "" bf16 "recipe learns: built-in config, precision=bf16 trains in bf16" bf16
run 1 "" fp16 "recipe learns: built-in config, precision=fp16 trains in f16" f16
run 1 "" "" "recipe learns: built-in config, no precision= trains in f32" f32
for np in 1 2; do
  for c in configs/zero0.json configs/zero1.json configs/zero2.json configs/zero3.json configs/zero2_offload.json configs/zero3_offload.json; do
    for p in fp32 bf16 fp16; do run $np $c $p "recipe learns: $(basename $c) $p np=$np"; done
  done
  run $np "$tmp/ds_config.json" "" "recipe learns: ds_config.json (bf16, lr 3e-3, 2 micro-batches) np=$np"
  # DeepSpeed's bf16 master weights and optimizer states (bf16 only), offloaded and on the device
  # (zero3_bf16_master.json is DeepSpeedExamples' bf16_full.json: its copy takes lr 3e-3, 2 micro-batches)
  run $np configs/zero2_offload_bf16_master.json bf16 "recipe learns: zero2_offload_bf16_master.json np=$np"
  run $np "$tmp/zero3_bf16_master.json" bf16 "recipe learns: zero3_bf16_master.json np=$np"
  # one row per line, padded (micro-batches of different token counts), label smoothing, rows grouped by length
  EXTRA="packing=false label_smoothing_factor=0.1 train_sampling_strategy=group_by_length"
  run $np configs/zero2.json bf16 "recipe learns: padded rows, label_smoothing_factor 0.1, group_by_length, zero2.json bf16 np=$np"
  EXTRA=
done
