#!/bin/sh
# zrun against the real libraries, on this machine's CPU: every check_*.py of tests/golden (torch.save files,
# DeepSpeed's checkpoints, zero_to_fp32 and universal checkpoints, resumes of real DeepSpeed and transformers
# runs, the README's recipe next to run_clm.py's pipeline, DeepSpeed's and the Trainer's defaults, the Trainer over a matrix of arguments, what it writes (trainer_state.json, metrics, callback events) and
# on 2 ranks (mpirun next to torchrun), SFT curves next to TRL's SFTTrainer, LoRA adapters next to PEFT's, save_pretrained read back
# by transformers) and the golden
# writers' diff (TRL's SFT rows, chat templates, DeepSpeed's engine runs). The GPU machine is not needed for these: torch 2.11,
# transformers 5.17, DeepSpeed 0.19.8 (its CPU accelerator, ops built on demand), TRL 1.10, PEFT 0.21 and datasets run on
# the CPU in a virtual environment made the first time (~5 GB: torch's wheel brings its CUDA libraries; pip
# needs the network, which the GPU machine lacks). Not part of `make test` (no Python there).
#     sh tests/golden/reference.sh [VENV]       (default /tmp/zrun-ref; prints each check's PASS / FAIL lines)
# Run from the repository root after `make`. Ends with "reference: N checks failed" (0: all passed).
set -u
VENV=${1:-/tmp/zrun-ref}
ROOT=$(pwd)
[ -x ./zrun ] || { echo "reference.sh: ./zrun not built here; run make first (from the repository root)"; exit 2; }
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV" || { echo "reference.sh: python3 -m venv failed (apt-get install python3-venv)"; exit 2; }
  "$VENV/bin/pip" install -q "torch==2.11.0" "transformers==5.17.0" "trl==1.10.0" "datasets==5.2.0" "accelerate==1.16.0" "peft==0.21.2" \
    hjson py-cpuinfo msgpack ninja nvidia-ml-py einops pydantic wheel setuptools || exit 2
  DS_BUILD_OPS=0 "$VENV/bin/pip" install -q --no-deps --no-build-isolation "deepspeed==0.19.8" || exit 2
fi
PY="$VENV/bin/python"
# (a venv made before the LoRA check: PEFT added to it)
"$PY" -c "import peft" 2> /dev/null || "$VENV/bin/pip" install -q --no-deps "peft==0.21.2" || exit 2
# (each check makes its one process its own world on a free port: check_torch_files.one_process_world)
export ZRUN_HOME="$ROOT" CHECK_NO_FIGURE=1 PYTHONWARNINGS=ignore HF_DATASETS_DISABLE_PROGRESS_BARS=1
DATA=${ZRUN_TEST_DATA:-../shared/data}
OUT=$(mktemp -d)
failed=0
run() { # name, command...: its PASS / FAIL lines; a failure when it exits non-zero or prints FAIL
  name=$1
  shift
  "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  grep -a "^PASS\|^FAIL" "$OUT/$name.log" | cut -c1-300
  if [ $rc -ne 0 ] || grep -aq "^FAIL" "$OUT/$name.log"; then
    failed=$((failed + 1))
    echo "reference: $name FAILED (rc $rc; log $OUT/$name.log)"
  fi
}
run torch_files "$PY" tests/golden/check_torch_files.py "$OUT/tc" ./zrun
run ds_defaults "$PY" tests/golden/check_ds_defaults.py "$OUT/dd" ./zrun
run ds_matrix "$PY" tests/golden/check_ds_matrix.py "$OUT/dm" ./zrun
run trainer_defaults "$PY" tests/golden/check_trainer_defaults.py "$OUT/td" ./zrun
run trainer_matrix "$PY" tests/golden/check_trainer_matrix.py "$OUT/tm" ./zrun
run trainer_state "$PY" tests/golden/check_trainer_state.py "$OUT/ts" ./zrun
[ -d "$DATA/wikitext-2-raw" ] && run recipe_clm "$PY" tests/golden/check_recipe_clm.py "$OUT/rc" ./zrun "$DATA"
command -v mpirun > /dev/null && run trainer_ranks "$PY" tests/golden/check_trainer_ranks.py "$OUT/tr" ./zrun
[ -d "$DATA/tokenizers" ] && run sft_trl "$PY" tests/golden/check_sft_trl.py "$OUT/st" ./zrun "$DATA"
[ -d "$DATA/tokenizers" ] && run sft_recipe "$PY" tests/golden/check_sft_recipe.py "$OUT/sr" ./zrun "$DATA"
[ -d "$DATA/tokenizers" ] && run peft "$PY" tests/golden/check_peft.py "$OUT/pf" ./zrun "$DATA"
./zrun tests/golden/save_for_hf_check.lua "$OUT/hfsave" > "$OUT/save.log" 2>&1 &&
  run hf_save "$PY" tests/golden/check_hf_save.py "$OUT/hfsave"
run phi3 "$PY" tests/golden/check_phi3.py "$OUT/phi3" ./zrun
./zrun tests/golden/save_zero_for_hf_check.lua "$OUT/zsave" > "$OUT/zsave.log" 2>&1 &&
  run zero_to_fp32 "$PY" tests/golden/check_zero_to_fp32.py "$OUT/zsave"
# the golden files TRL and transformers write must come out as committed (the libraries unchanged)
if [ -d "$DATA/tokenizers" ]; then
  for g in sft_trl chat_tinyllama ds_engine; do
    cp "tests/golden/$g.json" "$OUT/$g.committed.json"
  done
  "$PY" tests/golden/make_ds_golden.py > "$OUT/ds_golden.log" 2>&1
  "$PY" tests/golden/make_sft_trl_golden.py "$DATA" > "$OUT/sft_golden.log" 2>&1
  "$PY" tests/golden/make_chat_golden.py "$DATA/tokenizers/tinyllama-1.1b-chat-v1.0" > "$OUT/chat_golden.log" 2>&1
  for g in sft_trl chat_tinyllama ds_engine; do
    if cmp -s "tests/golden/$g.json" "$OUT/$g.committed.json"; then echo "PASS tests/golden/$g.json as the libraries write it"
    else echo "FAIL tests/golden/$g.json differs from what the libraries write now (the new one is in the tree)"; failed=$((failed + 1)); fi
  done
else
  echo "reference: $DATA/tokenizers not found: the golden files' check left out (set ZRUN_TEST_DATA)"
fi
# Mistral's and Qwen2's golden configs and the defaults transformers fills, as transformers writes them now (the
# script also checks that transformers loads its configs back and that Mistral's window masks past its length)
if "$PY" tests/golden/make_golden_models.py "$OUT/models" > "$OUT/models.log" 2>&1; then
  for g in hf_model_defaults.json mistral_tiny.config.json mistral_tiny.legacy_config.json qwen2_tiny.config.json \
    qwen2_tiny.legacy_config.json; do
    if cmp -s "tests/golden/$g" "$OUT/models/$g"; then echo "PASS tests/golden/$g as transformers writes it"
    else echo "FAIL tests/golden/$g differs from what transformers writes now ($OUT/models/$g)"; failed=$((failed + 1)); fi
  done
else
  echo "FAIL tests/golden/make_golden_models.py (log $OUT/models.log)"; failed=$((failed + 1))
fi
# Qwen3's chat templates rendered by transformers, Qwen3 rows and Llama 3 / Phi-3 rows prepared by TRL's SFTTrainer
# (committed tokenizers and templates: no data folder needed), as the libraries write them now
for g in qwen3_chat sft_qwen3 sft_llama3_phi3; do
  cp "tests/golden/$g.json" "$OUT/$g.committed.json"
  if "$PY" "tests/golden/make_$g""_golden.py" > "$OUT/$g.log" 2>&1 && cmp -s "tests/golden/$g.json" "$OUT/$g.committed.json"; then
    echo "PASS tests/golden/$g.json as the libraries write it"
  else echo "FAIL tests/golden/$g.json differs from what the libraries write now (the new one is in the tree; log $OUT/$g.log)"; failed=$((failed + 1)); fi
done
# Phi-3's golden files, generation golden and Phi3Config's defaults, as transformers writes them now
if "$PY" tests/golden/make_phi3_golden.py "$OUT/phi3_golden" > "$OUT/phi3_golden.log" 2>&1; then
  for g in phi3_defaults.json phi3_generate.json phi3_tiny.config.json phi3_partial.config.json phi3_longrope.config.json \
    phi3_longrope_short.legacy_config.json; do
    if cmp -s "tests/golden/$g" "$OUT/phi3_golden/$g"; then echo "PASS tests/golden/$g as transformers writes it"
    else echo "FAIL tests/golden/$g differs from what transformers writes now ($OUT/phi3_golden/$g)"; failed=$((failed + 1)); fi
  done
else
  echo "FAIL tests/golden/make_phi3_golden.py (log $OUT/phi3_golden.log)"; failed=$((failed + 1))
fi
# Qwen3's golden configs and the defaults transformers fills, as transformers writes them now (the script also checks
# that transformers loads its configs back and that qwen3_bias's window masks past its length)
if "$PY" tests/golden/make_golden_qwen3.py "$OUT/qwen3" > "$OUT/qwen3.log" 2>&1; then
  for g in qwen3_defaults.json qwen3_tiny.config.json qwen3_tiny.legacy_config.json qwen3_bias.config.json \
    qwen3_bias.legacy_config.json; do
    if cmp -s "tests/golden/$g" "$OUT/qwen3/$g"; then echo "PASS tests/golden/$g as transformers writes it"
    else echo "FAIL tests/golden/$g differs from what transformers writes now ($OUT/qwen3/$g)"; failed=$((failed + 1)); fi
  done
else
  echo "FAIL tests/golden/make_golden_qwen3.py (log $OUT/qwen3.log)"; failed=$((failed + 1))
fi
# Llama 3.x's and Phi-3's templates rendered by transformers (the Phi-3 tokenizer cut from TinyLlama's in the data
# folder), as transformers writes them now
if [ -d "$DATA/tokenizers" ]; then
  for g in llama3_phi3_chat; do
    cp "tests/golden/$g.json" "$OUT/$g.committed.json"
    if "$PY" "tests/golden/make_$g""_golden.py" "$DATA/tokenizers/tinyllama-1.1b-chat-v1.0" > "$OUT/$g.log" 2>&1 &&
      cmp -s "tests/golden/$g.json" "$OUT/$g.committed.json"; then
      echo "PASS tests/golden/$g.json as the libraries write it"
    else echo "FAIL tests/golden/$g.json differs from what the libraries write now (the new one is in the tree; log $OUT/$g.log)"; failed=$((failed + 1)); fi
  done
fi
echo "reference: $failed checks failed"
[ $failed -eq 0 ]
