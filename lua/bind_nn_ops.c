/* Lua bindings for matmul/linear, linear_gelu, softmax, cross-entropy and embedding, one banner per op family
 * (runtime/ops/matmul.h, linear_gelu.h, softmax.h, cross_entropy.h, embedding.h). Each is both zr.name(...) and
 * a tensor method. Dims are 1-based here; class targets and embedding ids are 0-based data
 * (like token ids). */
#include <string.h>

#include "bind.h"
#include "ops/cross_entropy.h"
#include "ops/linear_ce.h"
#include "ops/embedding.h"
#include "ops/linear_gelu.h"
#include "ops/matmul.h"
#include "ops/softmax.h"

/* ===== matmul: matmul, bmm, linear, conv1d (runtime/ops/matmul.h) ===== */

static int l_matmul(lua_State *L) {
    return zr_l_pushtensor(L, zr_matmul(zr_l_checktensor(L, 1), zr_l_checktensor(L, 2)));
}
static int l_bmm(lua_State *L) {
    return zr_l_pushtensor(L, zr_bmm(zr_l_checktensor(L, 1), zr_l_checktensor(L, 2)));
}
/* linear(x, w [, b]) */
static int l_linear(lua_State *L) {
    zr_tensor *b = lua_isnoneornil(L, 3) ? NULL : zr_l_checktensor(L, 3);
    return zr_l_pushtensor(L, zr_linear(zr_l_checktensor(L, 1), zr_l_checktensor(L, 2), b));
}
/* conv1d(x, w [, b]): Hugging Face's Conv1D (GPT-2), x · w + b with w stored (in, out) */
static int l_conv1d(lua_State *L) {
    zr_tensor *b = lua_isnoneornil(L, 3) ? NULL : zr_l_checktensor(L, 3);
    return zr_l_pushtensor(L, zr_conv1d(zr_l_checktensor(L, 1), zr_l_checktensor(L, 2), b));
}

/* ===== linear_gelu: linear_gelu, mlp_gelu (runtime/ops/linear_gelu.h) ===== */

/* linear_gelu(x, w [, b]) */
static int l_linear_gelu(lua_State *L) {
    zr_tensor *b = lua_isnoneornil(L, 3) ? NULL : zr_l_checktensor(L, 3);
    return zr_l_pushtensor(L, zr_linear_gelu(zr_l_checktensor(L, 1), zr_l_checktensor(L, 2), b));
}

/* mlp_gelu(x, w_fc, b_fc, w_proj, b_proj [, layout = "linear"]): linear, tanh GELU, linear as one
 * node (biases may be nil); layout "conv1d": weights stored (in, out), as zr.conv1d's */
static int l_mlp_gelu(lua_State *L) {
    zr_tensor *bf = lua_isnoneornil(L, 3) ? NULL : zr_l_checktensor(L, 3);
    zr_tensor *bp = lua_isnoneornil(L, 5) ? NULL : zr_l_checktensor(L, 5);
    const char *layout = luaL_optstring(L, 6, "linear");
    int in_out = strcmp(layout, "conv1d") == 0;
    if (!in_out && strcmp(layout, "linear") != 0)
        luaL_error(L, "mlp_gelu: layout must be 'linear' (weights (out, in)) or 'conv1d' (weights (in, out)), got '%s'",
                   layout);
    return zr_l_pushtensor(L, zr_mlp_gelu(zr_l_checktensor(L, 1), zr_l_checktensor(L, 2), bf, zr_l_checktensor(L, 4), bp,
                                          in_out));
}

/* ===== softmax: softmax, log_softmax (runtime/ops/softmax.h) ===== */

/* softmax(x [, dim = -1]) */
static int l_softmax(lua_State *L) {
    return zr_l_pushtensor(L, zr_softmax(zr_l_checktensor(L, 1), zr_l_optdim(L, 2, -1)));
}
static int l_log_softmax(lua_State *L) {
    return zr_l_pushtensor(L, zr_log_softmax(zr_l_checktensor(L, 1), zr_l_optdim(L, 2, -1)));
}

/* ===== cross_entropy (runtime/ops/cross_entropy.h) ===== */

static int parse_reduction(lua_State *L, const char *s) {
    int r = zr_loss_reduction_parse(s);
    if (r < 0) luaL_error(L, "cross_entropy: reduction must be 'mean', 'sum' or 'none', got '%s'", s);
    return r;
}

/* cross_entropy(logits, targets [, {ignore_index = -100, reduction = "mean", label_smoothing = 0,
 * inplace = false}]) or cross_entropy(logits, targets [, ignore_index [, reduction [, label_smoothing]]]).
 * inplace = true (reduction mean or sum, contiguous logits): when the loss will be recorded for
 * backward, its forward also makes the logits' gradient (for the seed zr.set_loss_grad_hint
 * promises: 1, or what engine:forward sets) and writes it over the logits' own storage, so the
 * backward reads nothing and no second logits-sized buffer is made. The caller promises not to
 * read those logits again (they hold the gradient); under no_grad, or for logits that need no
 * gradient, it is the plain op and the logits stay as they are. */
static int l_cross_entropy(lua_State *L) {
    zr_tensor *logits = zr_l_checktensor(L, 1), *targets = zr_l_checktensor(L, 2);
    double ignore = -100, eps = 0;
    int red = ZR_LOSS_MEAN, inplace = 0;
    if (lua_istable(L, 3)) {
        zr_l_check_keys(L, 3, "cross_entropy", "ignore_index reduction label_smoothing inplace");
        lua_getfield(L, 3, "ignore_index");
        ignore = luaL_optnumber(L, -1, -100);
        lua_getfield(L, 3, "reduction");
        if (!lua_isnil(L, -1)) red = parse_reduction(L, luaL_checkstring(L, -1));
        lua_getfield(L, 3, "label_smoothing");
        eps = luaL_optnumber(L, -1, 0);
        lua_getfield(L, 3, "inplace");
        inplace = lua_toboolean(L, -1);
        lua_pop(L, 4);
    } else {
        ignore = luaL_optnumber(L, 3, -100);
        if (!lua_isnoneornil(L, 4)) red = parse_reduction(L, luaL_checkstring(L, 4));
        eps = luaL_optnumber(L, 5, 0);
    }
    return zr_l_pushtensor(L, zr_cross_entropy(logits, targets, (int64_t)ignore, (zr_loss_reduction)red, eps, inplace));
}

/* linear_cross_entropy(h (..., D), w (V, D), targets (...) [, {ignore_index = -100, reduction = "mean",
 * label_smoothing = 0, chunk = 0, token_stats = false, keep}]): cross_entropy(linear(h, w), targets) with the logits
 * made chunk columns at a time and never held whole (runtime/ops/linear_ce.h; chunk 0: the default slices), unless
 * the counted rows' logits take at most keep bytes (default 256 MiB; 0: never): then made once and kept for backward
 * (no second product). targets may be on the host beside a GPU's h (no copy back to read them). token_stats:
 * also each row's entropy and argmax (0 at ignored rows), as logits_stats gives them: returns loss, entropy, argmax. */
static int l_linear_cross_entropy(lua_State *L) {
    zr_tensor *h = zr_l_checktensor(L, 1), *w = zr_l_checktensor(L, 2), *targets = zr_l_checktensor(L, 3);
    double ignore = -100, eps = 0, chunk = 0, keep = -1;
    int red = ZR_LOSS_MEAN, stats = 0;
    if (!lua_isnoneornil(L, 4)) {
        luaL_checktype(L, 4, LUA_TTABLE);
        zr_l_check_keys(L, 4, "linear_cross_entropy", "ignore_index reduction label_smoothing chunk token_stats keep");
        lua_getfield(L, 4, "keep");
        keep = luaL_optnumber(L, -1, -1);
        lua_pop(L, 1);
        lua_getfield(L, 4, "token_stats");
        stats = lua_toboolean(L, -1);
        lua_pop(L, 1);
        lua_getfield(L, 4, "ignore_index");
        ignore = luaL_optnumber(L, -1, -100);
        lua_getfield(L, 4, "reduction");
        if (!lua_isnil(L, -1)) red = parse_reduction(L, luaL_checkstring(L, -1));
        lua_getfield(L, 4, "label_smoothing");
        eps = luaL_optnumber(L, -1, 0);
        lua_getfield(L, 4, "chunk");
        chunk = luaL_optnumber(L, -1, 0);
        lua_pop(L, 4);
    }
    if (chunk < 0 || chunk != (double)(int64_t)chunk)
        return luaL_error(L, "linear_cross_entropy: chunk must be a whole number of columns (0: the default), got %g",
                          chunk);
    if (keep != -1 && (keep < 0 || keep != (double)(int64_t)keep))
        return luaL_error(L, "linear_cross_entropy: keep must be a whole number of bytes (0: never keep the logits), got %g",
                          keep);
    zr_tensor *e = NULL, *a = NULL;
    zr_tensor *loss = zr_linear_cross_entropy_stats(h, w, targets, (int64_t)ignore, (zr_loss_reduction)red, eps,
                                                    (int64_t)chunk, (int64_t)keep, stats ? &e : NULL, stats ? &a : NULL);
    if (!loss) return zr_l_error(L);
    zr_l_pushtensor(L, loss);
    if (!stats) return 1;
    zr_l_pushtensor(L, e);
    zr_l_pushtensor(L, a);
    return 3;
}

/* ===== embedding (runtime/ops/embedding.h) ===== */

/* embedding(weight, ids); also accepts (ids, weight) in torch's F.embedding order. */
static int l_embedding(lua_State *L) {
    zr_tensor *w = zr_l_checktensor(L, 1), *ids = zr_l_checktensor(L, 2);
    if (!zr_dtype_is_float(w->dtype) && zr_dtype_is_float(ids->dtype)) {
        zr_tensor *t = w;
        w = ids;
        ids = t;
    }
    return zr_l_pushtensor(L, zr_embedding(w, ids));
}

/* logits_stats(logits (..., C)) -> entropy (...), argmax (...) i64 (0-based), no gradient */
static int l_logits_stats(lua_State *L) {
    zr_tensor *x = zr_l_checktensor(L, 1), *e = NULL, *a = NULL;
    if (zr_logits_stats(x, &e, &a)) return zr_l_error(L);
    zr_l_pushtensor(L, e);
    zr_l_pushtensor(L, a);
    return 2;
}

/* ===== registration ===== */

static const luaL_Reg methods[] = {
    {"matmul", l_matmul}, {"bmm", l_bmm}, {"linear", l_linear}, {"conv1d", l_conv1d}, {"linear_gelu", l_linear_gelu}, {"mlp_gelu", l_mlp_gelu},
    {"softmax", l_softmax},
    {"log_softmax", l_log_softmax}, {"cross_entropy", l_cross_entropy},
    {"linear_cross_entropy", l_linear_cross_entropy}, {"embedding", l_embedding},
    {"logits_stats", l_logits_stats},
    {NULL, NULL}};

void zr_bind_nn_ops(lua_State *L) { zr_l_register_methods(L, methods); }
