#!/usr/bin/env python3
"""Writes OUT/st/model.safetensors and OUT/bin/pytorch_model.bin holding the same random bf16
Llama weights (hidden 1024, 8 layers, vocab 32000: 168M parameters, 311 MB), each with its
config.json, for tests/bench/bench_load_bin.lua. Standard library only: the .bin is written in
torch.save's zip format by tests/golden/make_torch_files.py's writer.
usage: python3 tests/bench/make_bin_model.py [OUT]   (default /tmp/zrun_bench_bin)"""
import collections
import json
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden"))
import make_torch_files as M  # noqa: E402

OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/zrun_bench_bin"
H, I, V, L, KV, D = 1024, 2816, 32000, 8, 4, 64
shapes = [("model.embed_tokens.weight", (V, H))]
for layer in range(L):
    p = f"model.layers.{layer}."
    shapes += [(p + "self_attn.q_proj.weight", (H, H)), (p + "self_attn.k_proj.weight", (KV * D, H)),
               (p + "self_attn.v_proj.weight", (KV * D, H)), (p + "self_attn.o_proj.weight", (H, H)),
               (p + "mlp.gate_proj.weight", (I, H)), (p + "mlp.up_proj.weight", (I, H)),
               (p + "mlp.down_proj.weight", (H, I)), (p + "input_layernorm.weight", (H,)),
               (p + "post_attention_layernorm.weight", (H,))]
shapes += [("model.norm.weight", (H,)), ("lm_head.weight", (V, H))]


class RawStorage(M.Storage):
    """A bf16 storage of random finite values, as raw bytes."""

    def __init__(self, n):
        self.dt, self.numel = "BF16", n
        b = bytearray(os.urandom(2 * n))
        b[1::2] = bytes(x & 0x3F for x in b[1::2])  # the high byte's exponent bits kept small
        self.raw = bytes(b)

    def data(self):
        return self.raw


sd = collections.OrderedDict()
for n, s in shapes:
    numel = 1
    for d in s:
        numel *= d
    sd[n] = M.Tensor(RawStorage(numel), s)
cfg = dict(M.MICRO, vocab_size=V, hidden_size=H, intermediate_size=I, num_hidden_layers=L, num_attention_heads=16,
           num_key_value_heads=KV, head_dim=D, dtype="bfloat16")
for sub in ("bin", "st"):
    os.makedirs(os.path.join(OUT, sub), exist_ok=True)
    json.dump(cfg, open(os.path.join(OUT, sub, "config.json"), "w"))
M.save(sd, os.path.join(OUT, "bin", "pytorch_model.bin"))
header, off, blobs = {}, 0, []
for n, s in sorted(shapes):
    b = sd[n].storage.raw
    header[n] = {"dtype": "BF16", "shape": list(s), "data_offsets": [off, off + len(b)]}
    off += len(b)
    blobs.append(b)
h = json.dumps(header, separators=(",", ":")).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(os.path.join(OUT, "st", "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for b in blobs:
        f.write(b)
print("wrote", OUT)
