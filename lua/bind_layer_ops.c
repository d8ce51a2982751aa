/* Lua bindings for the transformer layer ops, one banner per op family: norm, rope, qkv_rope,
 * swiglu, attention, dropout, and cat/split (runtime/ops/view.h). Comparisons and where are bind_ops.c. */
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "bind.h"
#include "ops/attention.h"
#include "ops/dropout.h"
#include "ops/norm.h"
#include "ops/qkv_rope.h"
#include "ops/rope.h"
#include "ops/swiglu.h"
#include "ops/view.h"

/* ===== norm (runtime/ops/norm.h) ===== */

/* rms_norm(x [, weight [, eps=1e-6 [, unit_offset=false]]]): unit_offset true is Gemma's norm, x normalised
 * times (1 + weight) in f32, rounded once (ops/norm.h zr_rmsnorm_ex) */
static int l_rms_norm(lua_State *L) {
    zr_tensor *x = zr_l_checktensor(L, 1), *w = lua_isnoneornil(L, 2) ? NULL : zr_l_checktensor(L, 2);
    return zr_l_pushtensor(L, zr_rmsnorm_ex(x, w, luaL_optnumber(L, 3, 1e-6), lua_toboolean(L, 4)));
}
/* add_rms_norm(x, r [, weight [, eps=1e-6 [, unit_offset=false]]]) -> h, y: h = x + r and
 * y = rms_norm(h, weight, eps, unit_offset) (a pre-norm block's residual add and the next norm; one kernel on
 * a GPU for x and r of one shape and dtype) */
static int l_add_rms_norm(lua_State *L) {
    zr_tensor *x = zr_l_checktensor(L, 1), *r = zr_l_checktensor(L, 2), *h;
    zr_tensor *w = lua_isnoneornil(L, 3) ? NULL : zr_l_checktensor(L, 3);
    zr_tensor *y = zr_add_rmsnorm_ex(x, r, w, luaL_optnumber(L, 4, 1e-6), lua_toboolean(L, 5), &h);
    if (!y) return zr_l_error(L);
    zr_l_pushtensor(L, h);
    zr_l_pushtensor(L, y);
    return 2;
}
/* layer_norm(x [, weight [, bias [, eps=1e-5]]]) */
static int l_layer_norm(lua_State *L) {
    zr_tensor *x = zr_l_checktensor(L, 1);
    zr_tensor *w = lua_isnoneornil(L, 2) ? NULL : zr_l_checktensor(L, 2);
    zr_tensor *b = lua_isnoneornil(L, 3) ? NULL : zr_l_checktensor(L, 3);
    return zr_l_pushtensor(L, zr_layernorm(x, w, b, luaL_optnumber(L, 4, 1e-5)));
}

/* add_layer_norm(x, r [, weight [, bias [, eps=1e-5]]]) -> h, y: h = x + r and
 * y = layer_norm(h, weight, bias, eps) (a pre-norm block's residual add and the next LayerNorm; one
 * kernel on a GPU for x and r of one shape and dtype) */
static int l_add_layer_norm(lua_State *L) {
    zr_tensor *x = zr_l_checktensor(L, 1), *r = zr_l_checktensor(L, 2), *h;
    zr_tensor *w = lua_isnoneornil(L, 3) ? NULL : zr_l_checktensor(L, 3);
    zr_tensor *b = lua_isnoneornil(L, 4) ? NULL : zr_l_checktensor(L, 4);
    zr_tensor *y = zr_add_layernorm(x, r, w, b, luaL_optnumber(L, 5, 1e-5), &h);
    if (!y) return zr_l_error(L);
    zr_l_pushtensor(L, h);
    zr_l_pushtensor(L, y);
    return 2;
}

/* ===== rope (runtime/ops/rope.h) ===== */

/* rope(x, cos, sin) */
static int l_rope(lua_State *L) {
    return zr_l_pushtensor(L, zr_rope(zr_l_checktensor(L, 1), zr_l_checktensor(L, 2), zr_l_checktensor(L, 3)));
}

static double field_number(lua_State *L, int idx, const char *key, const char *alt, double def, int required) {
    lua_getfield(L, idx, key);
    if (lua_isnil(L, -1) && alt) {
        lua_pop(L, 1);
        lua_getfield(L, idx, alt);
    }
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        if (required) luaL_error(L, "rope_tables: rope_scaling.%s is required for its rope_type", key);
        return def;
    }
    if (!lua_isnumber(L, -1)) luaL_error(L, "rope_tables: %s must be a number", key);
    double v = lua_tonumber(L, -1);
    lua_pop(L, 1);
    return v;
}

/* YaRN's rope_scaling fields (at index s) into c, as transformers' _compute_yarn_parameters reads them:
 * factor and original_max_position_embeddings required; beta_fast 32 and beta_slow 1 where absent (or
 * 0, Python's `or`); truncate (default true) floors / ceils the correction range, which is clamped to
 * 0 .. dim − 1 (and widened by 0.001 where empty); attention_factor where absent: 0.1·ln(factor) + 1
 * (1 for factor <= 1), or with mscale and mscale_all_dim both given (non-zero) the ratio of
 * 0.1·m·ln(factor) + 1 for the two. dim: the rotary dim. Python's double arithmetic throughout. */
static void yarn_config(lua_State *L, int s, int64_t dim, zr_rope_config *c) {
    const double base = c->theta;
    const double factor = field_number(L, s, "factor", NULL, 0, 1);
    const double orig = field_number(L, s, "original_max_position_embeddings", NULL, 0, 1);
    double beta_fast = field_number(L, s, "beta_fast", NULL, 0, 0), beta_slow = field_number(L, s, "beta_slow", NULL, 0, 0);
    if (beta_fast == 0) beta_fast = 32;
    if (beta_slow == 0) beta_slow = 1;
    lua_getfield(L, s, "truncate");
    const int truncate = lua_isnil(L, -1) ? 1 : lua_toboolean(L, -1);
    lua_pop(L, 1);
    if (!(factor > 0) || !(orig > 0) || !(base > 1))
        luaL_error(L, "rope_tables: yarn needs factor > 0, original_max_position_embeddings > 0 and theta > 1");
    const double pi = 3.14159265358979323846;
    double low = ((double)dim * log(orig / (beta_fast * 2 * pi))) / (2 * log(base));
    double high = ((double)dim * log(orig / (beta_slow * 2 * pi))) / (2 * log(base));
    if (truncate) low = floor(low), high = ceil(high);
    if (low < 0) low = 0;
    if (high > (double)(dim - 1)) high = (double)(dim - 1);
    if (low == high) high += 0.001;
    c->yarn = 1;
    c->factor = factor;
    c->original_max_position_embeddings = orig;
    c->yarn_low = low;
    c->yarn_high = high;
    lua_getfield(L, s, "attention_factor");
    const int given = !lua_isnil(L, -1);
    lua_pop(L, 1);
    if (given) {
        c->attention_scale = field_number(L, s, "attention_factor", NULL, 1.0, 1);
    } else {
        const double ms = field_number(L, s, "mscale", NULL, 0, 0), msa = field_number(L, s, "mscale_all_dim", NULL, 0, 0);
#define YARN_MSCALE(m) (factor <= 1 ? 1.0 : 0.1 * (m) * log(factor) + 1.0)
        c->attention_scale = ms != 0 && msa != 0 ? YARN_MSCALE(ms) / YARN_MSCALE(msa) : YARN_MSCALE(1.0);
#undef YARN_MSCALE
    }
}

/* rope_tables(T, head_dim [, {theta=, rope_scaling={rope_type="llama3", factor=, low_freq_factor=,
 * high_freq_factor=, original_max_position_embeddings=} | {rope_type="longrope", ext_factors={head_dim/2
 * numbers}, attention_factor=} | {rope_type="yarn", factor=, original_max_position_embeddings= [,
 * beta_fast=, beta_slow=, truncate=, attention_factor=, mscale=, mscale_all_dim=]}, offset=, dtype=,
 * device=}]) -> cos, sin. head_dim: the rotary dim. */
static int l_rope_tables(lua_State *L) {
    int64_t T = (int64_t)luaL_checknumber(L, 1), hd = (int64_t)luaL_checknumber(L, 2);
    zr_rope_config c = zr_rope_config_default();
    double ext[1024];
    zr_dtype dt = ZR_F32;
    zr_device dev = zr_cpu();
    if (lua_istable(L, 3)) {
        zr_l_check_keys(L, 3, "rope_tables", "theta rope_theta offset rope_scaling dtype device");
        c.theta = field_number(L, 3, "theta", "rope_theta", c.theta, 0);
        c.offset = (int64_t)field_number(L, 3, "offset", NULL, 0, 0);
        zr_l_opt_dtype_device(L, 3, &dt, &dev);
        lua_getfield(L, 3, "rope_scaling");
        if (lua_istable(L, -1)) {
            int s = lua_gettop(L);
            lua_getfield(L, s, "rope_type");
            if (lua_isnil(L, -1)) {
                lua_pop(L, 1);
                lua_getfield(L, s, "type"); /* older transformers configs */
            }
            const char *type = lua_isnil(L, -1) ? "default" : luaL_checkstring(L, -1);
            if (strcmp(type, "llama3") == 0) {
                c.llama3 = 1;
                c.factor = field_number(L, s, "factor", NULL, 0, 1);
                c.low_freq_factor = field_number(L, s, "low_freq_factor", NULL, 0, 1);
                c.high_freq_factor = field_number(L, s, "high_freq_factor", NULL, 0, 1);
                c.original_max_position_embeddings =
                    field_number(L, s, "original_max_position_embeddings", NULL, 0, 1);
            } else if (strcmp(type, "longrope") == 0) {
                /* the factors of the sequence's regime (short or long), chosen by the caller */
                lua_getfield(L, s, "ext_factors");
                if (!lua_istable(L, -1)) luaL_error(L, "rope_tables: rope_scaling.ext_factors (a list) is required for rope_type 'longrope'");
                int64_t n = (int64_t)lua_objlen(L, -1);
                if (n != hd / 2 || n > 1024)
                    luaL_error(L, "rope_tables: rope_scaling.ext_factors must hold head_dim/2 = %d numbers (at most 1024), got %d",
                               (int)(hd / 2), (int)n);
                for (int64_t i = 0; i < n; i++) {
                    lua_rawgeti(L, -1, (int)i + 1);
                    if (!lua_isnumber(L, -1)) luaL_error(L, "rope_tables: rope_scaling.ext_factors[%d] must be a number", (int)i + 1);
                    ext[i] = lua_tonumber(L, -1);
                    lua_pop(L, 1);
                }
                lua_pop(L, 1);
                c.ext_factors = ext;
                c.attention_scale = field_number(L, s, "attention_factor", NULL, 1.0, 0);
            } else if (strcmp(type, "yarn") == 0) {
                yarn_config(L, s, hd, &c);
            } else if (strcmp(type, "default") != 0)
                luaL_error(L, "rope_tables: rope_scaling type '%s' is not supported (expected 'default', 'llama3', "
                           "'longrope' or 'yarn')", type);
            lua_pop(L, 1);
        } else if (!lua_isnil(L, -1))
            luaL_error(L, "rope_tables: rope_scaling must be a table");
        lua_pop(L, 1);
    } else if (!lua_isnoneornil(L, 3))
        luaL_error(L, "rope_tables: argument 3 must be an options table");
    zr_tensor *cs, *sn;
    if (zr_rope_tables(T, hd, &c, dt, &cs, &sn)) return zr_l_error(L);
    if (dev.type != ZR_CPU) {
        zr_tensor *c2 = zr_tensor_to_raw(cs, dt, dev), *s2 = c2 ? zr_tensor_to_raw(sn, dt, dev) : NULL;
        zr_tensor_release(cs);
        zr_tensor_release(sn);
        if (!s2) {
            zr_tensor_release(c2);
            return zr_l_error(L);
        }
        cs = c2;
        sn = s2;
    }
    zr_l_pushtensor(L, cs);
    zr_l_pushtensor(L, sn);
    return 2;
}

/* ===== qkv_rope (runtime/ops/qkv_rope.h) ===== */

/* qkv_rope(qkv, H, KV, cos, sin [, layout]) -> q, k, v; layout "bhtd", "bthd" or nil (the
 * attention kernels' choice) */
static int l_qkv_rope(lua_State *L) {
    zr_tensor *qkv = zr_l_checktensor(L, 1), *cs = zr_l_checktensor(L, 4), *sn = zr_l_checktensor(L, 5), *out[3];
    static const char *const names[] = {"bhtd", "bthd", NULL};
    int layout = lua_isnoneornil(L, 6) ? ZR_QKV_AUTO : luaL_checkoption(L, 6, NULL, names);
    if (zr_qkv_rope(qkv, (int64_t)luaL_checknumber(L, 2), (int64_t)luaL_checknumber(L, 3), cs, sn, layout, out))
        return zr_l_error(L);
    for (int i = 0; i < 3; i++) zr_l_pushtensor(L, out[i]);
    return 3;
}

/* qkv_norm_rope(qkv, n_head, n_kv_head, q_norm_weight, k_norm_weight, eps, cos, sin [, layout]) -> q, k, v:
 * qkv_rope with each head of q and k first through an RMSNorm over head_dim (Qwen3's q_norm / k_norm);
 * fused kernels where qkv_norm_rope_fused says so, else op by op ((B, heads, T, head_dim) views) */
static int l_qkv_norm_rope(lua_State *L) {
    zr_tensor *qkv = zr_l_checktensor(L, 1), *wq = zr_l_checktensor(L, 4), *wk = zr_l_checktensor(L, 5);
    zr_tensor *cs = zr_l_checktensor(L, 7), *sn = zr_l_checktensor(L, 8), *out[3];
    static const char *const names[] = {"bhtd", "bthd", NULL};
    int layout = lua_isnoneornil(L, 9) ? ZR_QKV_AUTO : luaL_checkoption(L, 9, NULL, names);
    if (zr_qkv_norm_rope(qkv, (int64_t)luaL_checknumber(L, 2), (int64_t)luaL_checknumber(L, 3), wq, wk,
                         luaL_checknumber(L, 6), cs, sn, layout, out))
        return zr_l_error(L);
    for (int i = 0; i < 3; i++) zr_l_pushtensor(L, out[i]);
    return 3;
}

/* ===== swiglu (runtime/ops/swiglu.h) ===== */

/* swiglu(gate, up) = silu(gate) * up, fused; swiglu(gu): gate and up packed in gu's last dim */
static int l_swiglu(lua_State *L) {
    zr_tensor *a = zr_l_checktensor(L, 1);
    if (lua_isnoneornil(L, 2)) return zr_l_pushtensor(L, zr_swiglu_packed(a));
    return zr_l_pushtensor(L, zr_swiglu(a, zr_l_checktensor(L, 2)));
}
/* geglu(gate, up [, approximate="none"]) = gelu(gate, approximate) * up, fused (Gemma's MLP: "tanh");
 * geglu(gu, nil [, approximate]): gate and up packed in gu's last dim */
static int l_geglu(lua_State *L) {
    zr_tensor *a = zr_l_checktensor(L, 1);
    const char *ap = luaL_optstring(L, 3, "none");
    zr_glu_act act = !strcmp(ap, "tanh") ? ZR_GLU_GELU_TANH : ZR_GLU_GELU;
    if (strcmp(ap, "tanh") && strcmp(ap, "none"))
        return luaL_error(L, "geglu: approximate must be \"none\" or \"tanh\" (torch's gelu), got \"%s\"", ap);
    if (lua_isnoneornil(L, 2)) return zr_l_pushtensor(L, zr_glu_packed(a, act));
    return zr_l_pushtensor(L, zr_glu(a, zr_l_checktensor(L, 2), act));
}

/* ===== attention (runtime/ops/attention.h) ===== */

/* The attention ops' options at idx: a number (the scale), or a table {scale =, segments =} (its
 * other known keys: extra, for the caller to read); *seg the segments tensor or NULL. */
static double attn_opts(lua_State *L, int idx, const char *who, const char *keys, zr_tensor **seg) {
    double scale = 0;
    *seg = NULL;
    if (lua_type(L, idx) == LUA_TNUMBER) return lua_tonumber(L, idx);
    if (lua_isnoneornil(L, idx)) return 0;
    if (!lua_istable(L, idx)) luaL_error(L, "%s: argument %d must be a scale or an options table", who, idx);
    zr_l_check_keys(L, idx, who, keys);
    lua_getfield(L, idx, "scale");
    if (!lua_isnil(L, -1)) scale = luaL_checknumber(L, -1);
    lua_pop(L, 1);
    lua_getfield(L, idx, "segments");
    if (!lua_isnil(L, -1) && !(*seg = zr_l_totensor(L, -1)))
        luaL_error(L, "%s: segments must be an i32 (2, B, T) tensor (lo then hi of each token's sequence), got %s",
                   who, luaL_typename(L, -1));
    lua_pop(L, 1); /* the options table keeps it alive */
    return scale;
}

/* scaled_dot_product_attention(q, k, v [, scale | {scale=, is_causal=true, segments=}]); causal only.
 * segments: packed sequences (a padding-free batch), an i32 (2, B, T) tensor, lo then hi of each
 * token's sequence (0-based, row-relative, hi one past its last token): query t attends to keys
 * lo .. t only (sdpa_segments_ok says where it runs) */
static int l_sdpa(lua_State *L) {
    zr_tensor *q = zr_l_checktensor(L, 1), *k = zr_l_checktensor(L, 2), *v = zr_l_checktensor(L, 3), *seg;
    double scale = attn_opts(L, 4, "scaled_dot_product_attention", "is_causal scale segments", &seg);
    if (lua_istable(L, 4)) {
        lua_getfield(L, 4, "is_causal");
        if (!lua_isnil(L, -1) && !lua_toboolean(L, -1))
            luaL_error(L, "scaled_dot_product_attention: only causal attention is implemented (is_causal=false given)");
        lua_pop(L, 1);
    }
    return zr_l_pushtensor(L, zr_sdpa_causal(q, k, v, seg, scale));
}

/* sdpa_packed(qkv, n_head [, n_kv_head=n_head [, scale | {scale=, segments=}]]) -> (B, T, n_head·head_dim):
 * causal attention over GPT-2's packed c_attn output (q, k, v columns in that order); segments as
 * scaled_dot_product_attention's, (2, B, T) */
static int l_sdpa_packed(lua_State *L) {
    zr_tensor *qkv = zr_l_checktensor(L, 1), *seg;
    lua_Number h = luaL_checknumber(L, 2);
    double scale = attn_opts(L, 4, "sdpa_packed", "scale segments", &seg);
    return zr_l_pushtensor(L, zr_sdpa_packed(qkv, (int64_t)h, (int64_t)luaL_optnumber(L, 3, h), seg, scale));
}

/* qkv_rope_sdpa(qkv, n_head, n_kv_head, cos, sin [, scale | {scale=, segments=}]) -> (B, T, n_head·head_dim):
 * causal attention over Llama's packed q/k/v product with q and k rotated (qkv_rope + sdpa, one node);
 * segments as scaled_dot_product_attention's, (2, B, T) (cos, sin then hold each token's row) */
static int l_qkv_rope_sdpa(lua_State *L) {
    zr_tensor *qkv = zr_l_checktensor(L, 1), *cs = zr_l_checktensor(L, 4), *sn = zr_l_checktensor(L, 5), *seg;
    double scale = attn_opts(L, 6, "qkv_rope_sdpa", "scale segments", &seg);
    return zr_l_pushtensor(L, zr_qkv_rope_sdpa(qkv, (int64_t)luaL_checknumber(L, 2), (int64_t)luaL_checknumber(L, 3),
                                               cs, sn, seg, scale));
}

/* qkv_norm_rope_sdpa(qkv, n_head, n_kv_head, q_norm_weight, k_norm_weight, eps, cos, sin [, scale |
 * {scale=, segments=}]) -> (B, T, n_head·head_dim): qkv_rope_sdpa with each head of q and k first through
 * an RMSNorm over head_dim (Qwen3's q_norm / k_norm); the norms and the rope in fused kernels where
 * qkv_norm_rope_fused says so, else op by op */
static int l_qkv_norm_rope_sdpa(lua_State *L) {
    zr_tensor *qkv = zr_l_checktensor(L, 1), *wq = zr_l_checktensor(L, 4), *wk = zr_l_checktensor(L, 5);
    zr_tensor *cs = zr_l_checktensor(L, 7), *sn = zr_l_checktensor(L, 8), *seg;
    double scale = attn_opts(L, 9, "qkv_norm_rope_sdpa", "scale segments", &seg);
    return zr_l_pushtensor(L, zr_qkv_norm_rope_sdpa(qkv, (int64_t)luaL_checknumber(L, 2), (int64_t)luaL_checknumber(L, 3),
                                                    wq, wk, luaL_checknumber(L, 6), cs, sn, seg, scale));
}

/* qkv_norm_rope_fused(device, dtype, head_dim) -> whether qkv_norm_rope_sdpa runs its norms and rope in
 * fused kernels there (CUDA, f32/bf16/f16, head_dim 64 or 128) */
static int l_qkv_norm_rope_fused(lua_State *L) {
    lua_pushboolean(L, zr_qkv_norm_rope_fused(zr_l_checkdevice(L, 1), zr_l_checkdtype(L, 2),
                                              (int64_t)luaL_checknumber(L, 3)));
    return 1;
}

/* sdpa_segments_ok(device, dtype, head_dim) -> whether the attention ops take segments (packed
 * sequences) there: the CPU, and CUDA in bf16/f16 at head_dim 64, 128, 256 or a multiple of 8 between 64 and 128
 * (the flash kernels) */
static int l_sdpa_segments_ok(lua_State *L) {
    zr_device dev = zr_l_checkdevice(L, 1);
    zr_dtype dt = zr_l_checkdtype(L, 2);
    lua_pushboolean(L, zr_sdpa_segments_ok(dev, dt, (int64_t)luaL_checknumber(L, 3)));
    return 1;
}

/* sdpa_window_segments(B, T, window [, segments]) -> i32 (2, B, T) on the CPU: the segments of a
 * sliding window of `window` keys (transformers' sliding_window: query t sees keys t - window + 1 ..
 * t) over the packed sequences given (a CPU (2, B, T) tensor; none: each row one sequence); pass it
 * as the attention ops' segments (moved to their device) */
static int l_sdpa_window_segments(lua_State *L) {
    zr_tensor *seg = lua_isnoneornil(L, 4) ? NULL : zr_l_checktensor(L, 4);
    return zr_l_pushtensor(L, zr_sdpa_window_segments(seg, (int64_t)luaL_checknumber(L, 1),
                                                      (int64_t)luaL_checknumber(L, 2), (int64_t)luaL_checknumber(L, 3)));
}

/* ===== dropout (runtime/ops/dropout.h) ===== */

/* dropout(x [, p=0.5 [, training=true]]) */
static int l_dropout(lua_State *L) {
    zr_tensor *x = zr_l_checktensor(L, 1);
    int training = lua_isnoneornil(L, 3) ? 1 : lua_toboolean(L, 3);
    return zr_l_pushtensor(L, zr_dropout(x, luaL_optnumber(L, 2, 0.5), training));
}

/* ===== cat / split (runtime/ops/view.h) ===== */

/* cat({t1, t2, ...} [, dim=1]) */
static int l_cat(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    int n = (int)lua_objlen(L, 1), d = zr_l_optdim(L, 2, 0);
    if (n < 1) luaL_error(L, "cat: expected a non-empty array of tensors");
    zr_tensor **ts = lua_newuserdata(L, (size_t)n * sizeof *ts); /* freed by the GC */
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, 1, i + 1);
        ts[i] = zr_l_totensor(L, -1);
        if (!ts[i]) luaL_error(L, "cat: element %d of the array is not a tensor", i + 1);
        lua_pop(L, 1); /* the array keeps it alive */
    }
    return zr_l_pushtensor(L, zr_cat(ts, n, d));
}

/* split(x, size | {sizes...} [, dim=1]) -> array of tensors (views of x) */
static int l_split(lua_State *L) {
    zr_tensor *x = zr_l_checktensor(L, 1);
    int d = zr_l_optdim(L, 3, 0), n = 0;
    zr_tensor **out;
    if (lua_istable(L, 2)) {
        n = (int)lua_objlen(L, 2);
        if (n < 1) luaL_error(L, "split: sizes must be a non-empty array");
        int64_t *sizes = lua_newuserdata(L, (size_t)n * sizeof *sizes);
        out = lua_newuserdata(L, (size_t)n * sizeof *out);
        for (int i = 0; i < n; i++) {
            lua_rawgeti(L, 2, i + 1);
            sizes[i] = (int64_t)luaL_checknumber(L, -1);
            lua_pop(L, 1);
        }
        if (zr_split_sizes(x, n, sizes, d, out)) return zr_l_error(L);
        lua_createtable(L, n, 0);
        for (int i = 0; i < n; i++) {
            zr_l_pushtensor(L, out[i]);
            lua_rawseti(L, -2, i + 1);
        }
        return 1;
    }
    out = zr_split(x, (int64_t)luaL_checknumber(L, 2), d, &n);
    if (!out) return zr_l_error(L);
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        zr_l_pushtensor(L, out[i]);
        lua_rawseti(L, -2, i + 1);
    }
    free(out);
    return 1;
}

/* ===== registration ===== */

static const luaL_Reg methods[] = {
    {"rms_norm", l_rms_norm}, {"add_rms_norm", l_add_rms_norm}, {"layer_norm", l_layer_norm},
    {"add_layer_norm", l_add_layer_norm}, {"rope", l_rope}, {"qkv_rope", l_qkv_rope}, {"swiglu", l_swiglu}, {"geglu", l_geglu},
    {"scaled_dot_product_attention", l_sdpa}, {"dropout", l_dropout}, {"split", l_split},
    {"sdpa_packed", l_sdpa_packed}, {"qkv_rope_sdpa", l_qkv_rope_sdpa},
    {"qkv_norm_rope", l_qkv_norm_rope}, {"qkv_norm_rope_sdpa", l_qkv_norm_rope_sdpa}, {NULL, NULL}};
static const luaL_Reg functions[] = {
    {"rope_tables", l_rope_tables}, {"cat", l_cat}, {"sdpa_segments_ok", l_sdpa_segments_ok},
    {"sdpa_window_segments", l_sdpa_window_segments}, {"qkv_norm_rope_fused", l_qkv_norm_rope_fused}, {NULL, NULL}};

void zr_bind_layer_ops(lua_State *L) {
    zr_l_register_methods(L, methods);
    zr_l_register_functions(L, functions);
}
