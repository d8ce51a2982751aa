"""Writes tests/golden/hf_schedules.json: the learning rate at every optimizer step of each Hugging Face
schedule (transformers.get_scheduler, as the Trainer calls it with lr_scheduler_type and
lr_scheduler_kwargs), for zrun's schedulers_hf to match (tests/lua/test_hf_schedules.lua).

Run on a machine with torch + transformers (the GPU machine):
    python3 tests/golden/make_hf_schedules.py tests/golden/hf_schedules.json
Each case: two AdamW param groups at lr 3e-4 (the Trainer's decay / no-decay groups); "lrs" holds
the first group's lr before the first step and after each of total + 2 scheduler steps (the tail
past num_training_steps included). The second group's must be the same (checked here).
"""
import json
import sys

import torch
import transformers
from transformers import get_scheduler

LR = 3e-4
CASES = [  # name, num_warmup_steps, num_training_steps, lr_scheduler_kwargs
    ("linear", 3, 20, {}), ("linear", 0, 10, {}),
    ("cosine", 3, 20, {}), ("cosine", 3, 20, {"num_cycles": 1.5}),
    ("cosine_with_restarts", 2, 20, {}), ("cosine_with_restarts", 2, 20, {"num_cycles": 3}),
    ("polynomial", 2, 20, {}), ("polynomial", 2, 20, {"lr_end": 1e-5, "power": 2.0}),
    ("constant", 0, 20, {}), ("constant_with_warmup", 4, 20, {}),
    ("inverse_sqrt", 4, 20, {}), ("inverse_sqrt", 4, 20, {"timescale": 7}), ("inverse_sqrt", 0, 20, {}),
    ("cosine_with_min_lr", 3, 20, {"min_lr": 1e-5}), ("cosine_with_min_lr", 3, 20, {"min_lr_rate": 0.1, "num_cycles": 0.75}),
    ("cosine_warmup_with_min_lr", 4, 20, {"min_lr_rate": 0.1}),
    ("cosine_warmup_with_min_lr", 4, 20, {"min_lr": 2e-5, "warmup_lr_rate": 0.2}),
    ("warmup_stable_decay", 3, 20, {"num_decay_steps": 6}),
    ("warmup_stable_decay", 3, 20, {"num_decay_steps": 5, "num_stable_steps": 8, "warmup_type": "cosine",
                                    "decay_type": "1-sqrt", "min_lr_ratio": 0.1}),
    ("warmup_stable_decay", 4, 20, {"num_decay_steps": 6, "warmup_type": "1-sqrt", "decay_type": "linear"}),
]

out = {"transformers": transformers.__version__, "torch": torch.__version__, "lr": LR, "cases": []}
for name, warm, total, kw in CASES:
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([{"params": [a]}, {"params": [b], "weight_decay": 0.0}], lr=LR)
    s = get_scheduler(name, opt, num_warmup_steps=warm, num_training_steps=total,
                      scheduler_specific_kwargs=dict(kw))
    lrs = [s.get_last_lr()[0]]
    for _ in range(total + 2):
        opt.step()
        s.step()
        g = s.get_last_lr()
        assert g[0] == g[1], (name, g)
        lrs.append(g[0])
    out["cases"].append({"name": name, "warmup": warm, "total": total, "kwargs": kw, "lrs": lrs})
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
print(f"wrote {len(out['cases'])} schedules (transformers {transformers.__version__}) to {sys.argv[1]}")
