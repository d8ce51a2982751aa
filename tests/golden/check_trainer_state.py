#!/usr/bin/env python3
"""What zr.Trainer writes and reports next to transformers 5.17's Trainer: trainer_state.json (every field, its
log_history records' keys and values, ints and floats as Python writes them, stateful_callbacks' TrainerControl and
EarlyStoppingCallback), the final train metrics and evaluate()'s (keys, rounding; one evaluation before training), a
resume's train_loss, and every callback event in order with the control's flags as a callback sees them. A tiny Llama
in float32 on the CPU.
Timings are compared by their rounding only; zrun's own extra keys (memory, tokens_per_s, eval_perplexity,
eval_tokens, the ZrunTrainer callback state) are allowed.

usage: python3 tests/golden/check_trainer_state.py OUT_DIR [ZRUN]     (prints PASS/FAIL lines)
"""
import json
import os
import shutil
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_torch_files as C  # noqa: E402
import check_trainer_matrix as M  # noqa: E402

warnings.filterwarnings("ignore")
TIMED = ("_runtime", "_per_second", "_preparation_time")  # (values that differ run to run: their rounding is compared)
ZRUN_ONLY = {"memory", "peak_memory", "tokens_per_s", "eval_perplexity", "eval_tokens", "step"}

SETUPS = [
    ("logging_first_step, logs every 2, eval and save every 3, best by loss, input tokens counted",
     dict(logging_steps=2, logging_first_step=True, eval_strategy="steps", eval_steps=3, save_strategy="steps",
          save_steps=3, save_total_limit=2, metric_for_best_model="loss", include_num_input_tokens_seen=True), {}),
    ("logging, evaluation and saving by epoch, an evaluation before training",
     dict(logging_strategy="epoch", eval_strategy="epoch", save_strategy="epoch"), {"eval_first": True}),
    ("max_steps 12 resumed at checkpoint-4", dict(max_steps=12, logging_steps=5, save_strategy="steps", save_steps=4),
     {"resume_at": 4}),
    ("EarlyStoppingCallback patience 2 threshold 0.01, load_best_model_at_end",
     dict(learning_rate=3e-2, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2,
          metric_for_best_model="loss", load_best_model_at_end=True, num_train_epochs=4),
     {"es": {"early_stopping_patience": 2, "early_stopping_threshold": 0.01}}),
    ("save_only_model, logging_strategy no, save_strategy best", dict(save_only_model=True, logging_strategy="no",
                                                                      eval_strategy="steps", eval_steps=5,
                                                                      save_strategy="best", metric_for_best_model="loss"),
     {}),
]


def decimals_ok(v, n):
    return isinstance(v, float) and abs(v * 10 ** n - round(v * 10 ** n)) < 1e-6


def compare(path, a, b, bad):
    """a: transformers' value, b: zrun's (JSON as written: ints and floats apart)."""
    if isinstance(a, dict):
        if not isinstance(b, dict):
            bad.append(f"{path}: {b!r} is not an object")
            return
        for k in a:
            if k not in b:
                bad.append(f"{path}.{k} missing in zrun")
            else:
                compare(f"{path}.{k}", a[k], b[k], bad)
        return
    if isinstance(a, list):
        if not isinstance(b, list) or len(a) != len(b):
            bad.append(f"{path}: {len(a)} entries vs zrun {b if not isinstance(b, list) else len(b)}")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            compare(f"{path}[{i}]", x, y, bad)
        return
    if type(a) is not type(b):
        bad.append(f"{path}: {a!r} ({type(a).__name__}) vs zrun {b!r} ({type(b).__name__})")
        return
    key = path.rsplit(".", 1)[-1]
    if isinstance(a, float) and key.endswith(TIMED):
        if not decimals_ok(b, 3 if key.endswith("_per_second") else 4):
            bad.append(f"{path}: zrun {b!r} not rounded as speed_metrics")
    elif isinstance(a, str) and path.endswith("best_model_checkpoint"):
        if os.path.basename(a) != os.path.basename(b):
            bad.append(f"{path}: {a} vs zrun {b}")
    elif isinstance(a, float):
        if not M.close(b, a, 1e-4 if key != "grad_norm" else 2e-3, 1e-12):  # (fields; values: check_trainer_matrix)
            bad.append(f"{path}: {a!r} vs zrun {b!r}")
    elif a != b:
        bad.append(f"{path}: {a!r} vs zrun {b!r}")


def run(k, name, extra, resume_at=None, es=None, eval_first=False):
    from transformers import EarlyStoppingCallback, LlamaForCausalLM, Trainer, TrainingArguments
    args = dict(M.BASE, **extra)
    train, evalr = M.rows(700 + k, True), M.rows(800 + k, True)[:8]
    init = f"{C.OUT}/sinit{k}"
    C.tiny_llama(70 + k).save_pretrained(init)
    out, zout = f"{C.OUT}/s{k}_hf", f"{C.OUT}/s{k}_zrun"
    for d in (out, zout):
        shutil.rmtree(d, ignore_errors=True)
    ta = TrainingArguments(output_dir=out, report_to=[], use_cpu=True, disable_tqdm=True, **args)

    def hf_trainer():
        return Trainer(model=LlamaForCausalLM.from_pretrained(init), args=ta, train_dataset=M.Rows(train),
                       eval_dataset=M.Rows(evalr), data_collator=M.pad,
                       callbacks=[EarlyStoppingCallback(**es)] if es else [])
    tr = hf_trainer()
    if resume_at:
        tr.train()
        tr = hf_trainer()
    before = tr.evaluate() if eval_first else {}
    res = tr.train(resume_from_checkpoint=f"{out}/checkpoint-{resume_at}" if resume_at else None)
    hf = {"metrics": dict(res.metrics), "evaluate": tr.evaluate(), "before": before}
    code = M.trainer_lua(init, train, args, zout, evalr)
    if es:
        code = code.replace("  args = {", "  callbacks = { zr.EarlyStoppingCallback{ " +
                            ", ".join(f"{a} = {M.lua(v)}" for a, v in es.items()) + " } },\n  args = {")
    if resume_at:
        code += "tr:train()\n" + code + f'local before, r = {{}}, tr:train {{ resume_from_checkpoint = "{zout}/checkpoint-{resume_at}" }}\n'
    else:
        code += ("local before = tr:evaluate()\n" if eval_first else "local before = {}\n") + "local r = tr:train()\n"
    code += """local ev = tr:evaluate()
tr:save_state()
io.write("ZJSON ", cjson.encode({ metrics = r.metrics, evaluate = ev, before = before }), "\\n")
"""
    rc, text = C.zrun_lua(code)
    z = [json.loads(x[6:]) for x in text.splitlines() if x.startswith("ZJSON ")]
    if rc != 0 or not z:
        C.report(f"zr.Trainer writes and reports as transformers: {name}", False, text[-600:])
        return
    z, bad = z[0], []
    tr.save_state()
    ckpts = lambda d: sorted((x for x in os.listdir(d) if x.startswith("checkpoint-")), key=lambda s: int(s[11:]))
    hc, zc = ckpts(out), ckpts(zout)
    if hc != zc:
        bad.append(f"checkpoints {hc} vs zrun {zc}")
    for label, hp, zp in [("final", out, zout)] + [(c, f"{out}/{c}", f"{zout}/{c}") for c in hc if c in zc]:
        hs, zs = (json.load(open(f"{p}/trainer_state.json")) for p in (hp, zp))
        zs["stateful_callbacks"].pop("ZrunTrainer", None)
        if set(zs["stateful_callbacks"]) != set(hs["stateful_callbacks"]):
            bad.append(f"{label} stateful_callbacks {sorted(hs['stateful_callbacks'])} vs {sorted(zs['stateful_callbacks'])}")
        for h, zr_ in zip(hs["log_history"], zs["log_history"]):  # (zrun's own keys aside)
            for key in [x for x in zr_ if x not in h and x in ZRUN_ONLY]:
                zr_.pop(key)
            extra = set(zr_) - set(h)
            if extra:
                bad.append(f"{label} log step {h.get('step')}: keys zrun only {sorted(extra)}")
        compare(label, hs, zs, bad)
    hm, zm = hf["metrics"], z["metrics"]
    zm.pop("total_flos", None)  # (transformers' printing callbacks pop it from the returned metrics; logged above)
    compare("metrics", hm, {k: float(v) if k == "epoch" else v for k, v in zm.items()}, bad)
    for key in ("evaluate", "before"):
        compare(key, hf[key], {k: float(v) if k == "epoch" and v else v for k, v in z[key].items()}, bad)
    C.report(f"zr.Trainer writes and reports as transformers: {name}", not bad, "; ".join(bad[:6]))


def events():
    """Every callback event with the control's flags as a callback sees them (a second callback clears should_log at
    step 2, which cancels that log in both)."""
    from transformers import Trainer, TrainerCallback, TrainingArguments
    names = ["on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end", "on_step_begin", "on_substep_end",
             "on_pre_optimizer_step", "on_optimizer_step", "on_step_end", "on_log", "on_evaluate", "on_save"]
    cases = [dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, max_steps=4, save_strategy="epoch",
                  eval_strategy="steps", eval_steps=3, logging_steps=2, logging_first_step=True),
             dict(per_device_train_batch_size=8, gradient_accumulation_steps=2, eval_strategy="epoch",
                  save_strategy="epoch", logging_strategy="epoch", load_best_model_at_end=True),
             dict(per_device_train_batch_size=8, gradient_accumulation_steps=2, eval_strategy="steps", eval_steps=2,
                  save_strategy="best", metric_for_best_model="loss", logging_strategy="no"),
             dict(per_device_train_batch_size=8, gradient_accumulation_steps=2, max_steps=5, eval_strategy="epoch",
                  eval_delay=1, save_strategy="steps", save_steps=2, logging_steps=3)]
    for k, extra in enumerate(cases):
        args = dict(M.BASE, **extra)
        train, evalr = M.rows(900 + k, True)[:36], M.rows(950 + k, True)[:8]
        m = C.tiny_llama(90 + k)
        init = f"{C.OUT}/einit{k}"
        m.save_pretrained(init)
        out, zout = f"{C.OUT}/e{k}_hf", f"{C.OUT}/e{k}_zrun"
        for d in (out, zout):
            shutil.rmtree(d, ignore_errors=True)
        seen = []

        class Rec(TrainerCallback):
            pass
        for e in names:
            def f(self, args, state, control, e=e, **kw):
                seen.append(f"{e}@{state.global_step}:{int(control.should_log)}{int(control.should_evaluate)}"
                            f"{int(control.should_save)}{int(control.should_training_stop)}")
            setattr(Rec, e, f)

        class Cancel(TrainerCallback):
            def on_step_end(self, args, state, control, **kw):
                if state.global_step == 2:
                    control.should_log = False
        Trainer(model=m, args=TrainingArguments(output_dir=out, report_to=[], use_cpu=True, disable_tqdm=True, **args),
                train_dataset=M.Rows(train), eval_dataset=M.Rows(evalr), data_collator=M.pad,
                callbacks=[Rec(), Cancel()]).train()
        code = M.trainer_lua(init, train, args, zout, evalr).replace("  args = {", """  callbacks = { setmetatable({}, {
    __index = function(_, e)
      if not e:match("^on_") or e == "on_init_end" then return nil end
      local function b(v) return v and 1 or 0 end
      return function(_, _, state, c) print(("EV %s@%d:%d%d%d%d"):format(e, state.global_step, b(c.should_log),
        b(c.should_evaluate), b(c.should_save), b(c.should_training_stop))) end
    end }),
    { on_step_end = function(_, _, state, c) if state.global_step == 2 then c.should_log = false end end } },
  args = {""")
        rc, text = C.zrun_lua(code + "tr:train()\n")
        z = [x[3:] for x in text.splitlines() if x.startswith("EV ")]
        first = next((i for i, (a, b) in enumerate(zip(seen, z)) if a != b), None)
        ok = rc == 0 and z == seen
        C.report(f"callback events and control flags as transformers': case {k + 1}", ok,
                 f"{len(seen)} events vs zrun {len(z)}; first difference at {first}: "
                 f"{seen[first] if first is not None else ''} vs {z[first] if first is not None else ''}"
                 if rc == 0 else text[-400:])


def main():
    os.makedirs(C.OUT, exist_ok=True)
    for k, (name, extra, kw) in enumerate(SETUPS):
        run(k, name, extra, **kw)
    events()
    print(f"{C.failed} failed", flush=True)
    sys.exit(1 if C.failed else 0)


if __name__ == "__main__":
    C.one_process_world()
    main()
