#!/usr/bin/env python3
"""Writes tests/golden/torch_files/: files in torch.save's format and DeepSpeed checkpoints, for
tests/lua/test_torch_file.lua and test_zero_to_fp32_deepspeed.lua, with the standard library only.

torch.save's format is reproduced from torch/serialization.py (_save, _legacy_save) and
torch/_tensor.py (__reduce_ex__): Python's own pickle.Pickler at protocol 2 with torch's
persistent ids ('storage', torch.<T>Storage, key, location, numel) and torch's rebuild functions
as globals (stand-in modules named torch and torch._utils, so the pickler writes exactly the
names torch's pickler writes); the zip archive stored, records <archive>/data.pkl,
<archive>/byteorder, <archive>/data/<key>, <archive>/version. The DeepSpeed checkpoints follow
DeepSpeed 0.19.8: engine._save_checkpoint / _save_zero_checkpoint (file names, the model-states
dict), stage_1_and_2.DeepSpeedZeroOptimizer (flat groups, parameter alignment padding, the
2*world alignment, equal partitions, groups_padding cut from the saved partitions) and
stage3.DeepSpeedZeroOptimizer_Stage3 (each parameter cut into world ceil(n/world) pieces).

Every tensor's values are also written to reference.safetensors (plain float32), which the tests
compare against. On a machine with torch and DeepSpeed, tests/golden/check_torch_files.py checks
these files against the real torch.load, and writes real ones for zrun to read.

usage: python3 tests/golden/make_torch_files.py [OUT_DIR]   (default tests/golden/torch_files)
"""
import collections
import copyreg
import enum
import io
import json
import math
import os
import pickle
import random
import struct
import sys
import types
import zipfile

# ---------------------------------------------------------------- stand-ins named as torch's

torch = types.ModuleType("torch")
torch_utils = types.ModuleType("torch._utils")
torch._utils = torch_utils
sys.modules["torch"], sys.modules["torch._utils"] = torch, torch_utils
torch_tensor_mod = types.ModuleType("torch._tensor")
sys.modules["torch._tensor"] = torch_tensor_mod


def _fn(mod, name):
    def f(*a):
        raise RuntimeError("stand-in")
    f.__module__, f.__name__, f.__qualname__ = mod.__name__, name, name
    setattr(mod, name, f)
    return f


_rebuild_tensor_v2 = _fn(torch_utils, "_rebuild_tensor_v2")
_rebuild_parameter = _fn(torch_utils, "_rebuild_parameter")
_rebuild_from_type_v2 = _fn(torch_tensor_mod, "_rebuild_from_type_v2")

STORAGE = {"F32": "FloatStorage", "BF16": "BFloat16Storage", "F16": "HalfStorage", "I64": "LongStorage",
           "I32": "IntStorage", "U8": "ByteStorage", "BOOL": "BoolStorage"}
SIZE = {"F32": 4, "BF16": 2, "F16": 2, "I64": 8, "I32": 4, "U8": 1, "BOOL": 1}
for st in STORAGE.values():
    cls = type(st, (), {"__module__": "torch"})
    setattr(torch, st, cls)


class Size(tuple):
    pass


Size.__module__, Size.__qualname__, Size.__name__ = "torch", "Size", "Size"
torch.Size = Size
copyreg.pickle(Size, lambda s: (Size, (tuple(s),)))


class TensorBase:  # the stand-in for torch.Tensor, as a class name only
    pass


TensorBase.__module__, TensorBase.__qualname__, TensorBase.__name__ = "torch", "Tensor", "Tensor"
torch.Tensor = TensorBase


def bf16_round(x):
    """x as the nearest float32 whose low 16 bits are zero (exactly representable in bf16)."""
    b = struct.unpack("<I", struct.pack("<f", x))[0]
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", b))[0]


def encode(values, dt):
    if dt == "F32":
        return struct.pack("<%df" % len(values), *values)
    if dt == "BF16":
        return b"".join(struct.pack("<I", struct.unpack("<I", struct.pack("<f", bf16_round(v)))[0])[2:] for v in values)
    if dt == "F16":
        return struct.pack("<%de" % len(values), *values)
    if dt == "I64":
        return struct.pack("<%dq" % len(values), *values)
    if dt == "I32":
        return struct.pack("<%di" % len(values), *values)
    if dt in ("U8", "BOOL"):
        return bytes(int(v) for v in values)
    raise ValueError(dt)


class Storage:
    def __init__(self, dt, values):
        self.dt, self.values, self.numel = dt, list(values), len(values)

    def data(self):
        return encode(self.values, self.dt)


class Tensor:
    """A tensor: a storage, an element offset, a shape and strides (contiguous unless given)."""

    def __init__(self, storage, shape, offset=0, stride=None, attrs=None, parameter=False):
        self.storage, self.shape, self.offset = storage, tuple(shape), offset
        if stride is None:
            stride, s = [], 1
            for d in reversed(self.shape):
                stride.insert(0, s)
                s *= d
        self.stride, self.attrs, self.parameter = tuple(stride), attrs, parameter

    def numel(self):
        return math.prod(self.shape)

    def values(self):  # in row-major order of the view
        out = []

        def rec(dim, base):
            if dim == len(self.shape):
                out.append(self.storage.values[base])
                return
            for i in range(self.shape[dim]):
                rec(dim + 1, base + i * self.stride[dim])
        rec(0, self.offset)
        return out

    def __reduce_ex__(self, proto):  # torch/_tensor.py: _reduce_ex_internal / _rebuild_from_type_v2
        args = (self.storage, self.offset, tuple(self.shape), self.stride, False, collections.OrderedDict())
        if self.parameter:
            return (_rebuild_parameter, (Tensor(self.storage, self.shape, self.offset, self.stride), True,
                                         collections.OrderedDict()))
        if self.attrs:
            return (_rebuild_from_type_v2, (_rebuild_tensor_v2, TensorBase, args, self.attrs))
        return (_rebuild_tensor_v2, args)


def tensor(values, shape, dt="F32", **kw):
    return Tensor(Storage(dt, values), shape, **kw)


def dumps(obj):
    """The pickle torch.save writes and its storages by key, in the order keys are given."""
    keys, storages = {}, {}

    def persistent_id(o):
        if isinstance(o, Storage):
            k = keys.setdefault(id(o), str(len(keys)))
            storages[k] = o
            return ("storage", getattr(torch, STORAGE[o.dt]), k, "cpu", o.numel)
        return None
    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=2)
    p.persistent_id = persistent_id
    p.dump(obj)
    return buf.getvalue(), storages


def save(obj, path, archive="archive"):
    """torch.save(obj, path) with the zip format (torch >= 1.6)."""
    data, storages = dumps(obj)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        def record(name, data):  # a fixed time stamp: the same bytes on every run
            z.writestr(zipfile.ZipInfo(archive + "/" + name, date_time=(2020, 1, 1, 0, 0, 0)), data)
        record("data.pkl", data)
        record("byteorder", "little")
        for k in sorted(storages, key=int):
            record("data/" + k, storages[k].data())
        record("version", "3\n")


def rezip64(src, dst):
    """src's records rewritten as torch's writer (miniz) writes a file past 4 GB: zip64 sizes and
    offsets in every directory entry (the 32-bit fields 0xFFFFFFFF), a zip64 end record and
    locator, and each record's data aligned to 64 bytes by a padding extra field ("FB")."""
    with zipfile.ZipFile(src) as z:
        recs = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    out, central = bytearray(), bytearray()
    for name, data in recs:
        nb = name.encode()
        crc = zipfile.crc32(data) & 0xFFFFFFFF
        z64 = struct.pack("<HHQQ", 1, 16, len(data), len(data))
        off = len(out)
        pad = (-(off + 30 + len(nb) + len(z64) + 4)) % 64
        fb = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
        out += struct.pack("<IHHHHHIIIHH", 0x04034b50, 45, 0, 0, 0, 0, crc, 0xFFFFFFFF, 0xFFFFFFFF, len(nb),
                           len(z64) + len(fb)) + nb + z64 + fb + data
        cz64 = struct.pack("<HHQQQ", 1, 24, len(data), len(data), off)
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014b50, 45, 45, 0, 0, 0, 0, crc, 0xFFFFFFFF,
                               0xFFFFFFFF, len(nb), len(cz64), 0, 0, 0, 0, 0xFFFFFFFF) + nb + cz64
    cd_off = len(out)
    out += central
    z64_off = len(out)
    out += struct.pack("<IQHHIIQQQQ", 0x06064b50, 44, 45, 45, 0, 0, len(recs), len(recs), len(central), cd_off)
    out += struct.pack("<IIQI", 0x07064b50, 0, z64_off, 1)
    out += struct.pack("<IHHHHIIH", 0x06054b50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    with open(dst, "wb") as f:
        f.write(out)


def save_legacy(obj, path):
    """torch.save(obj, path, _use_new_zipfile_serialization=False): torch/serialization.py _legacy_save."""
    keys, storages = {}, {}

    def persistent_id(o):
        if isinstance(o, Storage):
            k = keys.setdefault(id(o), str(140000000000 + 64 * len(keys)))  # str(storage._cdata)
            storages[k] = o
            return ("storage", getattr(torch, STORAGE[o.dt]), k, "cpu", o.numel, None)
        return None
    f = io.BytesIO()
    pickle.dump(0x1950a86a20f9469cfc6c, f, protocol=2)
    pickle.dump(1001, f, protocol=2)
    pickle.dump(dict(protocol_version=1001, little_endian=True, type_sizes=dict(short=2, int=4, long=4)), f,
                protocol=2)
    p = pickle.Pickler(f, protocol=2)
    p.persistent_id = persistent_id
    p.dump(obj)
    skeys = sorted(storages)
    pickle.dump(skeys, f, protocol=2)
    for k in skeys:
        s = storages[k]
        f.write(struct.pack("<q", s.numel))
        f.write(s.data())
    with open(path, "wb") as out:
        out.write(f.getvalue())


def write_safetensors(path, named):
    """named: list of (name, shape, float values) -> a plain float32 safetensors file."""
    header, off, blobs = {}, 0, []
    for name, shape, vals in sorted(named):
        b = struct.pack("<%df" % len(vals), *vals)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


# ---------------------------------------------------------------- a micro Llama

MICRO = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32, "hidden_size": 16,
         "intermediate_size": 24, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
         "head_dim": 8, "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
         "bos_token_id": 1, "eos_token_id": 2, "dtype": "float32"}


def micro_params():
    h, i, v, d, kv = 16, 24, 32, 8, 1
    shapes = [("model.embed_tokens.weight", (v, h)),
              ("model.layers.0.input_layernorm.weight", (h,)),
              ("model.layers.0.self_attn.q_proj.weight", (2 * d, h)),
              ("model.layers.0.self_attn.k_proj.weight", (kv * d, h)),
              ("model.layers.0.self_attn.v_proj.weight", (kv * d, h)),
              ("model.layers.0.self_attn.o_proj.weight", (h, 2 * d)),
              ("model.layers.0.post_attention_layernorm.weight", (h,)),
              ("model.layers.0.mlp.gate_proj.weight", (i, h)),
              ("model.layers.0.mlp.up_proj.weight", (i, h)),
              ("model.layers.0.mlp.down_proj.weight", (h, i)),
              ("model.norm.weight", (h,)),
              ("lm_head.weight", (v, h))]
    rng = random.Random(40)
    out = []
    for name, shape in shapes:
        n = math.prod(shape)
        if name.endswith("norm.weight"):
            vals = [bf16_round(1 + 0.1 * rng.uniform(-1, 1)) for _ in range(n)]
        else:
            vals = [bf16_round(0.2 * rng.uniform(-1, 1)) for _ in range(n)]
        out.append((name, shape, vals))
    return out


def write_hf_dirs(root):
    params = micro_params()
    # 1. one pytorch_model.bin (zip, float32; the archive folder named as torch < 2.1 named it)
    d = os.path.join(root, "llama_micro_bin")
    os.makedirs(d, exist_ok=True)
    sd = collections.OrderedDict((n, tensor(v, s)) for n, s, v in params)
    save(sd, os.path.join(d, "pytorch_model.bin"), archive="pytorch_model")
    json.dump(MICRO, open(os.path.join(d, "config.json"), "w"), indent=2)
    write_safetensors(os.path.join(d, "reference.safetensors"), params)
    # 2. sharded: shard 1 zip in bfloat16, shard 2 the legacy format in float32, with an index
    d = os.path.join(root, "llama_micro_sharded")
    os.makedirs(d, exist_ok=True)
    cfg = dict(MICRO, dtype="bfloat16")
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
    first, second = params[:6], params[6:]
    save(collections.OrderedDict((n, tensor(v, s, "BF16")) for n, s, v in first),
         os.path.join(d, "pytorch_model-00001-of-00002.bin"))
    save_legacy(collections.OrderedDict((n, tensor(v, s)) for n, s, v in second),
                os.path.join(d, "pytorch_model-00002-of-00002.bin"))
    wm = {n: "pytorch_model-00001-of-00002.bin" for n, _, _ in first}
    wm.update({n: "pytorch_model-00002-of-00002.bin" for n, _, _ in second})
    total = sum(2 * math.prod(s) for _, s, _ in first) + sum(4 * math.prod(s) for _, s, _ in second)
    json.dump({"metadata": {"total_size": total}, "weight_map": wm},
              open(os.path.join(d, "pytorch_model.bin.index.json"), "w"), indent=2)
    write_safetensors(os.path.join(d, "reference.safetensors"), params)


# ---------------------------------------------------------------- assorted Python values

class Color(enum.IntEnum):
    red = 1
    blue = 3


Color.__module__ = "deepspeed.runtime.zero.config"


class Scaler:  # an ordinary class: pickled as copyreg.__newobj__ + BUILD of its __dict__
    def __init__(self):
        self.cur_scale, self.dynamic = 65536.0, True


def module(name):
    """A stand-in module and its parents (pickle imports the module a class names)."""
    parts = name.split(".")
    for k in range(1, len(parts) + 1):
        sys.modules.setdefault(".".join(parts[:k]), types.ModuleType(".".join(parts[:k])))
    return sys.modules[name]


Scaler.__module__, Scaler.__qualname__ = "deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"
module("deepspeed.runtime.fp16.loss_scaler").DynamicLossScaler = Scaler
module("deepspeed.runtime.zero.config").Color = Color


def write_values(root):
    base = Storage("F32", [float(k) for k in range(12)])
    obj = collections.OrderedDict()
    obj["none"] = None
    obj["flags"] = (True, False)
    obj["ints"] = [0, 1, -1, 255, 256, 65535, 65536, -2 ** 31, 2 ** 31, 2 ** 40, -(2 ** 50)]
    obj["floats"] = [0.5, -2.25, 1e-300, float("inf")]
    obj["text"] = "héllo ✓"
    obj["raw"] = b"\x00\xff\x80abc"
    obj["nested"] = {"a": [1, (2, 3)], 7: "seven", (1, 2): "tuple key"}
    obj["order"] = collections.OrderedDict((k, i) for i, k in enumerate(["z", "a", "m", "b"]))
    obj["size"] = Size((3, 4))
    obj["stage"] = Color.blue
    obj["scaler"] = Scaler()
    obj["whole"] = Tensor(base, (3, 4))
    obj["row1"] = Tensor(base, (4,), offset=4)               # a view with an offset: shares the storage
    obj["column"] = Tensor(base, (3,), offset=1, stride=(4,))  # not contiguous
    obj["transposed"] = Tensor(base, (4, 3), stride=(1, 4))
    obj["same"] = obj["whole"]                                 # one tensor, twice (pickle's memo)
    obj["ids"] = tensor([5, -7, 2 ** 40], (3,), "I64")
    obj["flat"] = tensor([0.25, 0.5, 0.75], (3,), attrs={"ds_id": 4})
    obj["param"] = tensor([1.5, -1.5], (2,), parameter=True)
    obj["bf16"] = tensor([1.0, -0.5, 3.0], (3,), "BF16")
    obj["scalar"] = tensor([2.5], ())
    obj["empty"] = tensor([], (0,))
    save(obj, os.path.join(root, "values.pt"))
    save_legacy(obj, os.path.join(root, "values_legacy.pt"))
    rezip64(os.path.join(root, "values.pt"), os.path.join(root, "values_zip64.pt"))
    save(collections.OrderedDict(a=1, b=[2, 3]), os.path.join(root, "no_tensors.pt"))


# ---------------------------------------------------------------- DeepSpeed checkpoints

class fragment_address:  # deepspeed.utils.tensor_fragment.fragment_address (a dataclass)
    def __init__(self, numel, start):
        self.numel, self.start = numel, start


fragment_address.__module__ = "deepspeed.utils.tensor_fragment"
module("deepspeed.utils.tensor_fragment").fragment_address = fragment_address


class ZeroStageEnum(int, enum.Enum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3


ZeroStageEnum.__module__ = "deepspeed.runtime.zero.config"
module("deepspeed.runtime.zero.config").ZeroStageEnum = ZeroStageEnum

DS_CONFIG = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "bf16": {"enabled": True},
             "zero_optimization": {"stage": 2}}


def scaler():
    return Scaler()


def model_states(params, module, stage, world, frozen=None, shared=None, frags=None, shapes=None, buffers=()):
    return dict(module=module, buffer_names=list(buffers), optimizer=None,
                param_shapes=shapes or [collections.OrderedDict((n, Size(s)) for n, s, _ in params)],
                frozen_param_shapes=frozen, shared_params=shared or {}, frozen_param_fragments=frags,
                lr_scheduler={"last_batch_iteration": 1, "warmup_num_steps": 10}, data_sampler=None,
                random_ltd=None, sparse_tensor_module_names=set(), skipped_steps=0, global_steps=2,
                global_samples=8, dp_world_size=world, mp_world_size=1,
                ds_config=dict(DS_CONFIG, zero_optimization={"stage": stage}), ds_version="0.19.8")


def write_zero2(root, world, param_alignment, name, elastic, lr_scheduler="warmup", lr=1e-3, split=False):
    """ZeRO-2, bf16, the model's last parameter (lm_head) frozen, a buffer; one parameter group,
    or (split) the Trainer's two in named_parameters' order: the weights that decay, then the norms."""
    params = micro_params()
    trainable, frozen = params[:-1], params[-1:]
    if split:
        by = {n: (n, s, v) for n, s, v in trainable}
        groups = [[by[n] for n in HF_ORDER if n in by and "norm" not in n], [by[n] for n in HF_ORDER if "norm" in n]]
    else:
        groups = [trainable]
    tag = os.path.join(root, name, "global_step2")
    os.makedirs(tag, exist_ok=True)
    with open(os.path.join(root, name, "latest"), "w") as f:
        f.write("global_step2")
    # each group flat: each parameter then its alignment padding (none after the last), then padded to
    # 2*world and cut into world equal partitions
    flats = []
    for g in groups:
        flat, paddings = [], []
        for k, (n, sh, v) in enumerate(g):
            flat += v
            pad = 0 if k == len(g) - 1 else (-len(flat)) % param_alignment
            paddings.append(pad)
            flat += [0.0] * pad
        used = len(flat)
        flat += [0.0] * ((-len(flat)) % (2 * world))
        flats.append((flat, paddings, used, len(flat) // world))
    buf = tensor([0.0, 1.0, 2.0, 3.0], (4,), "F32")  # a persistent buffer (model.rotary.scale, say)
    module = collections.OrderedDict((n, tensor(v, sh, "BF16")) for n, sh, v in params)
    module["model.extra_buffer"] = buf
    frozen_shapes = collections.OrderedDict((n, Size(sh)) for n, sh, _ in frozen)
    frozen_frags = collections.OrderedDict((n, tensor(v, sh, "BF16")) for n, sh, v in frozen)
    shapes = [collections.OrderedDict((n, Size(sh)) for n, sh, _ in g) for g in groups]
    ms = model_states(None, module, 2, world, frozen_shapes, {}, frozen_frags, shapes=shapes,
                      buffers=["model.extra_buffer"])
    if lr_scheduler is None:
        ms["lr_scheduler"] = None
    elif lr_scheduler == "lambda":  # the Trainer's LambdaLR, handed to deepspeed.initialize, saved by the engine
        ms["lr_scheduler"] = LAMBDA_LR
    ms["epoch"], ms["note"] = 3, {"source": "deepspeed"}  # client_state: save_checkpoint's caller's keys
    save(ms, os.path.join(tag, "mp_rank_00_model_states.pt"))
    for r in range(world):
        leans, fulls, pads = [], [], []
        for flat, paddings, used, part in flats:
            left = r * part
            padding = part if used <= left else (left + part - used if used < left + part else 0)
            leans.append(flat[left:left + part - padding])
            fulls.append(flat[left:left + part])  # the moments keep the padding in a rigid checkpoint
            pads.append(padding)
        st = collections.OrderedDict()
        st["loss_scaler"] = scaler()
        st["dynamic_loss_scale"] = False
        st["overflow"] = False
        st["clip_grad"] = 1.0
        if elastic:  # zero_optimization.elastic_checkpoint: per-group states without padding
            st["base_optimizer_state"] = [{"exp_avg": tensor([0.5 * x for x in lean], (len(lean),)),
                                           "exp_avg_sq": tensor([x * x for x in lean], (len(lean),)),
                                           "step": 2} for lean in leans]
            st["base_optimizer_state_step"] = 0  # FusedAdam's param_groups[0]["step"] (it counts in state)
        else:  # the default: the torch optimizer's state_dict (FusedAdam: step in the state)
            st["base_optimizer_state"] = {
                "state": {gi: {"step": 2, "exp_avg": tensor([0.5 * x for x in full], (len(full),)),
                               "exp_avg_sq": tensor([x * x for x in full], (len(full),))}
                          for gi, full in enumerate(fulls)},
                "param_groups": [{"lr": lr, "bias_correction": True, "betas": (0.9, 0.999), "eps": 1e-8,
                                  "weight_decay": 0.01 if gi == 0 else 0.0, "amsgrad": False, "step": 0,
                                  "params": [gi]} for gi in range(len(fulls))]}
        st["single_partition_of_fp32_groups"] = [tensor(lean, (len(lean),)) for lean in leans]
        st["zero_stage"] = ZeroStageEnum.gradients
        st["group_paddings"] = pads
        st["param_alignment_paddings"] = [f[1] for f in flats]
        st["partition_count"] = [world] * len(flats)
        st["ds_version"] = "0.19.8"
        st["param_slice_mappings"] = [collections.OrderedDict((n, fragment_address(math.prod(sh), 0))
                                                              for n, sh, _ in g) for g in groups]
        save(dict(optimizer_state_dict=st, ds_config=DS_CONFIG, ds_version="0.19.8"),
             os.path.join(tag, "bf16_zero_pp_rank_%d_mp_rank_00_optim_states.pt" % r))
    ref = list(params) + [("model.extra_buffer", (4,), [0.0, 1.0, 2.0, 3.0])]
    write_safetensors(os.path.join(root, name, "reference.safetensors"), ref)


def write_zero3(root, world, name):
    """ZeRO-3, fp32 optimizer files (no bf16_ prefix), two parameter groups (norms apart), the
    embedding frozen, lm_head tied to it through shared_params."""
    params = micro_params()
    by = {n: (s, v) for n, s, v in params}
    frozen_name = "model.embed_tokens.weight"
    groups = [[p for p in params if p[0] != frozen_name and p[0] != "lm_head.weight" and "norm" not in p[0]],
              [p for p in params if "norm" in p[0]]]
    tag = os.path.join(root, name, "global_step2")
    os.makedirs(tag, exist_ok=True)
    with open(os.path.join(root, name, "latest"), "w") as f:
        f.write("global_step2")

    def piece(vals, r):
        c = math.ceil(len(vals) / world)
        padded = vals + [0.0] * (c * world - len(vals))
        return padded[r * c:(r + 1) * c]
    shapes = [collections.OrderedDict((n, Size(s)) for n, s, _ in g) for g in groups]
    fs, fv = by[frozen_name]
    for r in range(world):
        module = collections.OrderedDict((n, tensor([], (0,), "BF16")) for n, _, _ in params if n != "lm_head.weight")
        frags = collections.OrderedDict([(frozen_name, tensor(piece(fv, r), (len(piece(fv, r)),), "BF16"))])
        save(model_states(None, module, 3, world, collections.OrderedDict([(frozen_name, Size(fs))]),
                          {"lm_head.weight": frozen_name}, frags, shapes=shapes),
             os.path.join(tag, "zero_pp_rank_%d_mp_rank_00_model_states.pt" % r))
        flat_groups = []
        for gi, g in enumerate(groups):
            vals = []
            for _, _, v in g:
                vals += piece(v, r)
            flat_groups.append(tensor(vals, (len(vals),), attrs={"ds_id": gi}))
        st = collections.OrderedDict()
        st["zero_stage"] = ZeroStageEnum.weights
        st["loss_scaler"] = scaler()
        st["dynamic_loss_scale"] = True
        st["overflow"] = False
        st["partition_count"] = world
        st["optimizer_state_dict"] = {
            "state": {gi: {"step": 2, "exp_avg": tensor([0.5 * x for x in t.storage.values], (t.numel(),)),
                           "exp_avg_sq": tensor([x * x for x in t.storage.values], (t.numel(),))}
                      for gi, t in enumerate(flat_groups)},
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "step": 0,
                              "params": [gi]} for gi in range(len(flat_groups))]}
        st["fp32_flat_groups"] = flat_groups
        save(dict(optimizer_state_dict=st, ds_config=dict(DS_CONFIG, zero_optimization={"stage": 3}),
                  ds_version="0.19.8"),
             os.path.join(tag, "zero_pp_rank_%d_mp_rank_00_optim_states.pt" % r))
    ref = list(params[:-1]) + [("lm_head.weight", fs, fv)]
    write_safetensors(os.path.join(root, name, "reference.safetensors"), ref)


# torch.optim.lr_scheduler.LambdaLR.state_dict() after 2 steps (lr_lambdas: None for a function)
LAMBDA_LR = {"base_lrs": [0.02], "last_epoch": 2, "verbose": False, "_step_count": 3,
             "_get_lr_called_within_step": False, "_last_lr": [0.015], "lr_lambdas": [None]}


def write_hf_trainer_checkpoint(root):
    """output_dir/checkpoint-2 as transformers' Trainer with DeepSpeed writes it (Trainer._save_checkpoint):
    the engine's checkpoint (global_step2, latest: ds_zero2's layout), trainer_state.json, the
    Trainer's own LambdaLR in scheduler.pt and rng_state.pth. DeepSpeed's config has no scheduler, so
    the Trainer handed its LambdaLR to deepspeed.initialize and the engine saved its state too (as a
    real DeepSpeed 0.19.8 run does)."""
    name = os.path.join("hf_trainer_out", "checkpoint-2")
    # linear decay over 8 steps from 2e-2, after 2 steps: the optimizer's lr is 2e-2 * 6/8
    write_zero2(root, 2, 1, name, False, lr_scheduler="lambda", lr=0.015, split=True)
    d = os.path.join(root, name)
    os.remove(os.path.join(d, "reference.safetensors"))
    state = {"best_global_step": None, "best_metric": None, "best_model_checkpoint": None, "epoch": 0.5,
             "eval_steps": 500, "global_step": 2, "is_hyper_param_search": False, "is_local_process_zero": True,
             "is_world_process_zero": True,
             "log_history": [{"epoch": 0.25, "grad_norm": 1.5, "learning_rate": 0.02, "loss": 3.5, "step": 1},
                             {"epoch": 0.5, "grad_norm": 1.25, "learning_rate": 0.0175, "loss": 3.25, "step": 2}],
             "logging_steps": 1, "max_steps": 8, "num_input_tokens_seen": 0, "num_train_epochs": 2,
             "save_steps": 2, "stateful_callbacks": {"TrainerControl": {"args": {"should_save": True},
                                                                        "attributes": {}}},
             "total_flos": 123.0, "train_batch_size": 2, "trial_name": None, "trial_params": None}
    json.dump(state, open(os.path.join(d, "trainer_state.json"), "w"), indent=2)
    save(LAMBDA_LR, os.path.join(d, "scheduler.pt"))
    save({"python": (3, tuple(range(5)), None), "cpu": tensor([1, 2, 3], (3,), "U8")}, os.path.join(d, "rng_state.pth"))


HF_ORDER = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
            "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_proj.weight",
            "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
            "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
            "model.norm.weight", "lm_head.weight"]  # LlamaForCausalLM.named_parameters()' order


def write_hf_plain_checkpoint(root):
    """output_dir/checkpoint-3 as transformers' Trainer writes it without DeepSpeed
    (Trainer._save_checkpoint): the model (model.safetensors + config.json), optimizer.pt (torch
    AdamW's state_dict: parameters numbered through the Trainer's two groups, those that decay
    then biases and norms (get_decay_parameter_names), each in named_parameters' order; the
    moments in the parameter's shape), scheduler.pt, trainer_state.json, rng_state.pth."""
    d = os.path.join(root, "hf_plain_out", "checkpoint-3")
    os.makedirs(d, exist_ok=True)
    params = {n: (s, v) for n, s, v in micro_params()}
    write_safetensors(os.path.join(d, "model.safetensors"), [(n, s, v) for n, (s, v) in params.items()])
    json.dump(MICRO, open(os.path.join(d, "config.json"), "w"), indent=2)
    decay = [n for n in HF_ORDER if "norm" not in n]
    no_decay = [n for n in HF_ORDER if "norm" in n]
    state = {}
    for i, n in enumerate(decay + no_decay):
        sh, v = params[n]
        state[i] = {"step": tensor([3.0], ()), "exp_avg": tensor([0.5 * x for x in v], sh),
                    "exp_avg_sq": tensor([x * x for x in v], sh)}
    common = {"lr": 2e-2 * 5 / 8, "betas": (0.9, 0.999), "eps": 1e-8, "amsgrad": False, "foreach": None,
              "maximize": False, "capturable": False, "differentiable": False, "fused": None,
              "decoupled_weight_decay": True, "initial_lr": 2e-2}
    groups = [dict(common, weight_decay=0.01, params=list(range(len(decay)))),
              dict(common, weight_decay=0.0, params=list(range(len(decay), len(HF_ORDER))))]
    save({"state": state, "param_groups": groups}, os.path.join(d, "optimizer.pt"))
    save({"base_lrs": [0.02, 0.02], "last_epoch": 3, "verbose": False, "_step_count": 4,
          "_get_lr_called_within_step": False, "_last_lr": [2e-2 * 5 / 8] * 2, "lr_lambdas": [None, None]},
         os.path.join(d, "scheduler.pt"))
    save({"python": (3, tuple(range(5)), None), "cpu": tensor([1, 2, 3], (3,), "U8")}, os.path.join(d, "rng_state.pth"))
    st = {"global_step": 3, "epoch": 0.75, "max_steps": 8, "logging_steps": 1, "save_steps": 3,
          "log_history": [{"epoch": 0.25 * k, "learning_rate": 2e-2 * (9 - k) / 8, "loss": 3.6 - 0.05 * k, "step": k}
                          for k in (1, 2, 3)],
          "num_input_tokens_seen": 0, "total_flos": 100.0, "train_batch_size": 2, "best_metric": None,
          "best_model_checkpoint": None, "is_world_process_zero": True}
    json.dump(st, open(os.path.join(d, "trainer_state.json"), "w"), indent=2)


def write_bf16_no_zero(root, world=2):
    """DeepSpeed's BF16_Optimizer (runtime/bf16_optimizer.py: ZeRO-1 in bf16 with data_types.grad_accum_dtype
    fp32, or pipeline parallelism; this fixture's model-states file, as a pipeline engine's, has no param_shapes). Each
    parameter group (the Trainer's two, lm_head frozen) flattened with no padding between
    parameters, padded to 2*world and cut into equal partitions; rank r saves its whole fp32
    partition (bf16_zero_pp_rank_r_...: single_partition_of_fp32_groups, group_paddings on the last
    rank, param_slice_mappings: name -> fragment_address(numel, start in the partition)); the
    model-states file has the module and no param_shapes."""
    name = "ds_bf16_nozero"
    params = micro_params()
    by = {n: (n, sh, v) for n, sh, v in params}
    groups = [[by[n] for n in HF_ORDER if n != "lm_head.weight" and "norm" not in n], [by[n] for n in HF_ORDER if "norm" in n]]
    tag = os.path.join(root, name, "global_step2")
    os.makedirs(tag, exist_ok=True)
    with open(os.path.join(root, name, "latest"), "w") as f:
        f.write("global_step2")
    module = collections.OrderedDict((n, tensor(v, sh, "BF16")) for n, sh, v in params)
    ms = model_states(None, module, 0, world, shapes=[{}])
    ms["param_shapes"], ms["shared_params"], ms["frozen_param_shapes"], ms["frozen_param_fragments"] = None, None, None, None
    save(ms, os.path.join(tag, "mp_rank_00_model_states.pt"))
    flats = []
    for g in groups:
        flat, offs = [], []
        for n, sh, v in g:
            offs.append((n, len(flat), len(v)))
            flat += v
        used = len(flat)
        flat += [0.0] * ((-len(flat)) % (2 * world))
        flats.append((flat, offs, used, len(flat) // world))
    for r in range(world):
        parts, pads, maps = [], [], []
        for flat, offs, used, part in flats:
            lo, hi = r * part, (r + 1) * part
            parts.append(flat[lo:hi])
            pads.append(len(flat) - used if r == world - 1 else 0)
            m = collections.OrderedDict()
            for n, o, k in offs:
                a, b = max(o, lo), min(o + k, hi)
                if a < b:
                    m[n] = fragment_address(b - a, a - lo)
            maps.append(m)
        st = collections.OrderedDict()
        st["clip_grad"] = 1.0
        st["base_optimizer_state"] = {
            "state": {gi: {"step": 2, "exp_avg": tensor([0.5 * x for x in p], (len(p),)),
                           "exp_avg_sq": tensor([x * x for x in p], (len(p),))} for gi, p in enumerate(parts)},
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01 if gi == 0 else 0.0,
                              "step": 0, "params": [gi]} for gi in range(len(parts))]}
        st["single_partition_of_fp32_groups"] = [tensor(p, (len(p),)) for p in parts]
        st["group_paddings"] = pads
        st["partition_count"] = [world] * len(parts)
        st["ds_version"] = "0.19.8"
        st["param_slice_mappings"] = maps
        save(dict(optimizer_state_dict=st, ds_config=dict(DS_CONFIG, zero_optimization={"stage": 0}), ds_version="0.19.8"),
             os.path.join(tag, "bf16_zero_pp_rank_%d_mp_rank_00_optim_states.pt" % r))
    write_safetensors(os.path.join(root, name, "reference.safetensors"), params)


def write_no_zero(root, form):
    """DeepSpeed without ZeRO (stage 0): everything in mp_rank_00_model_states.pt, its "optimizer"
    the optimizer wrapper's state_dict (engine._save_checkpoint), in DeepSpeed 0.19.8's three forms:
      fp16_optimizer (ds_nozero_bf16): bf16 with FusedAdam: FP16_Optimizer (runtime/fp16/fused_optimizer.py),
        the Trainer's two groups each flattened into fp32_groups_flat[g], one flat state per group,
        no loss scaling (bf16); lm_head tied to the embedding (one storage, two names);
      unfused (ds_nozero_fp16): fp16 with torch's Adam: FP16_UnfusedOptimizer (unfused_optimizer.py),
        one group, fp32_groups[0] the masters one by one, the state per parameter, a dynamic loss scale;
      plain (ds_nozero_fp32): fp32, the optimizer's own state_dict (FusedAdam's: step per state),
        one group, lm_head frozen (in no group), the module's weights the master."""
    name = {"fp16_optimizer": "ds_nozero_bf16", "unfused": "ds_nozero_fp16", "plain": "ds_nozero_fp32"}[form]
    params = micro_params()
    by = {n: (n, sh, v) for n, sh, v in params}
    tag = os.path.join(root, name, "global_step2")
    os.makedirs(tag, exist_ok=True)
    with open(os.path.join(root, name, "latest"), "w") as f:
        f.write("global_step2")
    dt = {"fp16_optimizer": "BF16", "unfused": "F16", "plain": "F32"}[form]
    # (the module's state_dict and the parameters DeepSpeed was given: named_parameters' order)
    module = collections.OrderedDict((n, tensor(by[n][2], by[n][1], dt)) for n in HF_ORDER)
    order = HF_ORDER
    if form == "fp16_optimizer":  # tied: lm_head.weight is the embedding's tensor (one storage)
        module["lm_head.weight"] = module["model.embed_tokens.weight"]
        groups = [[n for n in HF_ORDER if "norm" not in n and n != "lm_head.weight"], [n for n in HF_ORDER if "norm" in n]]
    elif form == "unfused":
        groups = [order]
    else:
        groups = [[n for n in order if n != "lm_head.weight"]]
    common = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "bias_correction": True}
    if form == "fp16_optimizer":
        flats = [[x for n in g for x in by[n][2]] for g in groups]
        opt = {"optimizer_state_dict": {
            "state": {gi: {"step": 2, "exp_avg": tensor([0.5 * x for x in f], (len(f),)),
                           "exp_avg_sq": tensor([x * x for x in f], (len(f),))} for gi, f in enumerate(flats)},
            "param_groups": [dict(common, weight_decay=0.01 if gi == 0 else 0.0, step=0, params=[gi])
                             for gi in range(len(groups))]},
            "fp32_groups_flat": [tensor(f, (len(f),)) for f in flats], "clip_grad": 1.0}
    else:
        state, k, pgroups = {}, 0, []
        for gi, g in enumerate(groups):
            idx = []
            for n in g:
                _, sh, v = by[n]
                # (FusedAdam counts in its group's last state only: the others keep 0, as real files have it)
                last = n == g[-1]
                state[k] = {"step": tensor([2.0], ()) if form == "unfused" else (2 if last else 0),
                            "exp_avg": tensor([0.5 * x for x in v], sh), "exp_avg_sq": tensor([x * x for x in v], sh)}
                idx.append(k)
                k += 1
            pgroups.append(dict(common, weight_decay=0.0, params=idx))
        osd = {"state": state, "param_groups": pgroups}
        if form == "unfused":
            opt = {"dynamic_loss_scale": True, "cur_scale": 1024.0, "cur_iter": 7, "last_overflow_iter": 3,
                   "scale_factor": 2.0, "scale_window": 1000, "optimizer_state_dict": osd,
                   "fp32_groups": [[tensor(by[n][2], by[n][1]) for n in g] for g in groups]}
        else:
            opt = osd
    ms = model_states(None, module, 0, 1, shapes=[{}])
    ms["param_shapes"], ms["shared_params"], ms["frozen_param_shapes"], ms["frozen_param_fragments"] = None, None, None, None
    ms["optimizer"] = opt
    ms["ds_config"] = dict(DS_CONFIG, zero_optimization={"stage": 0}, bf16={"enabled": form == "fp16_optimizer"},
                           fp16={"enabled": form == "unfused"})
    save(ms, os.path.join(tag, "mp_rank_00_model_states.pt"))
    if form == "fp16_optimizer":  # (the tied name holds the embedding's values)
        params = [(n, sh, by["model.embed_tokens.weight"][2] if n == "lm_head.weight" else v) for n, sh, v in params]
    write_safetensors(os.path.join(root, name, "reference.safetensors"), params)


def write_universal(root, name="ds_universal", flat=False):
    """A universal checkpoint as DeepSpeed's ds_to_universal.py writes it (from a ZeRO-2 save):
    <out>/zero/<name>/fp32.pt, exp_avg.pt, exp_avg_sq.pt ({"param": full tensor}) and step.pt,
    <out>/zero/optimizer_state.pt (the optimizer state less its partitions, with param_groups), the
    model-states files copied, and latest_universal naming <out> beside it. flat: from a ZeRO-3 save
    (merge_zero3_slices), each tensor flat, as its partitions were."""
    out = os.path.join(root, name, "global_step2_universal")
    os.makedirs(os.path.join(out, "zero"), exist_ok=True)
    with open(os.path.join(root, name, "latest_universal"), "w") as f:
        f.write("global_step2_universal")
    params = micro_params()
    for n, sh, v in params:
        d = os.path.join(out, "zero", n)
        os.makedirs(d, exist_ok=True)
        fsh = (len(v),) if flat else sh
        save({"param": tensor(v, fsh)}, os.path.join(d, "fp32.pt"))
        save({"param": tensor([0.5 * x for x in v], fsh)}, os.path.join(d, "exp_avg.pt"))
        save({"param": tensor([x * x for x in v], fsh)}, os.path.join(d, "exp_avg_sq.pt"))
        save(tensor([2.0], ()), os.path.join(d, "step.pt"))
    save({"loss_scaler": scaler(), "dynamic_loss_scale": False, "overflow": False, "clip_grad": 1.0,
          "zero_stage": ZeroStageEnum.gradients, "group_paddings": [0], "partition_count": [2], "ds_version": "0.19.8",
          "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "step": 0,
                            "params": [0]}]}, os.path.join(out, "zero", "optimizer_state.pt"))
    module = collections.OrderedDict((n, tensor(v, sh, "BF16")) for n, sh, v in params)
    ms = model_states(params, module, 2, 2)
    save(ms, os.path.join(out, "mp_rank_00_model_states.pt"))
    write_safetensors(os.path.join(root, name, "reference.safetensors"), params)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                              "torch_files")
    os.makedirs(root, exist_ok=True)
    write_hf_dirs(root)
    write_values(root)
    write_zero2(root, 2, 1, "ds_zero2", False)
    write_zero2(root, 3, 8, "ds_zero2_aligned", True, split=True)
    write_zero3(root, 2, "ds_zero3")
    write_hf_trainer_checkpoint(root)
    write_hf_plain_checkpoint(root)
    write_universal(root)
    write_universal(root, "ds_universal3", flat=True)
    write_bf16_no_zero(root)
    for form in ("fp16_optimizer", "unfused", "plain"):
        write_no_zero(root, form)
    print("wrote", root)


if __name__ == "__main__":
    main()
