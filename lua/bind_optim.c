/* Lua bindings for the optimizer steps (runtime/ops/optim.h): zr._C.adamw_step, sgd_step and
 * lamb_step, used by the Lua optimizers in lua/zrun/optim/, and optim_step (the engine's kernels). Hyperparameters come in an options table. */

#include <string.h>

#include "bind.h"
#include "ops/optim.h"

/* Number field k of the table at idx, or def when absent; def < -1e300 means required. */
static double num_field(lua_State *L, int idx, const char *k, double def) {
    double v = zr_l_numfield(L, idx, k, def, "optimizer step");
    if (v < -1e300) luaL_error(L, "optimizer step: option '%s' is required", k);
    return v;
}

/* Tensors at idx: one tensor, or an array of n tensors (n = -1: any length). Returns the count;
 * the array is allocated in a userdata left on the stack (freed by the GC). */
static int tensor_list(lua_State *L, int idx, int n, zr_tensor ***out) {
    zr_tensor *t = zr_l_totensor(L, idx);
    if (t) {
        if (n > 1) luaL_error(L, "adamw_step: argument #%d is one tensor, expected a list of %d", idx, n);
        zr_tensor **a = lua_newuserdata(L, sizeof *a);
        a[0] = t;
        *out = a;
        return 1;
    }
    luaL_checktype(L, idx, LUA_TTABLE);
    int len = (int)lua_objlen(L, idx);
    if (n >= 0 && len != n)
        luaL_error(L, "adamw_step: argument #%d has %d tensors, expected %d", idx, len, n);
    zr_tensor **a = lua_newuserdata(L, sizeof *a * (size_t)(len ? len : 1));
    for (int i = 0; i < len; i++) {
        lua_rawgeti(L, idx, i + 1);
        a[i] = zr_l_totensor(L, -1);
        if (!a[i]) luaL_error(L, "adamw_step: argument #%d entry %d is not a tensor", idx, i + 1);
        lua_pop(L, 1);
    }
    *out = a;
    return len;
}

/* adamw_step(params, grads, exp_avgs, exp_avg_sqs, {lr=, beta1=, beta2=, eps=, weight_decay=,
 * step=}); the first four are tensors or equally long lists of tensors. grads = nil uses each
 * parameter's own .grad, so Lua never holds (and delays freeing) the gradient tensors. */
static int l_adamw_step(lua_State *L) {
    luaL_checktype(L, 5, LUA_TTABLE);
    zr_adamw_config c = {
        .lr = num_field(L, 5, "lr", -1e308),
        .beta1 = num_field(L, 5, "beta1", 0.9),
        .beta2 = num_field(L, 5, "beta2", 0.999),
        .eps = num_field(L, 5, "eps", 1e-8),
        .weight_decay = num_field(L, 5, "weight_decay", 1e-2),
    };
    double step = num_field(L, 5, "step", -1e308);
    zr_tensor **p, **g, **m, **v;
    int n = tensor_list(L, 1, -1, &p);
    if (lua_isnil(L, 2)) {
        g = lua_newuserdata(L, sizeof *g * (size_t)(n ? n : 1));
        for (int i = 0; i < n; i++) g[i] = p[i]->grad;
    } else
        tensor_list(L, 2, n, &g);
    tensor_list(L, 3, n, &m);
    tensor_list(L, 4, n, &v);
    if (zr_adamw_step_multi(n, p, g, m, v, (int64_t)step, &c)) return zr_l_error(L);
    return 0;
}

/* sgd_step(param, grad_or_nil, momentum_buf_or_nil, {lr=, momentum=, dampening=, weight_decay=,
 * nesterov=, first=}) */
static int l_sgd_step(lua_State *L) {
    zr_tensor *p = zr_l_checktensor(L, 1);
    zr_tensor *g = lua_isnil(L, 2) ? p->grad : zr_l_checktensor(L, 2); /* nil: p's own .grad */
    zr_tensor *buf = lua_isnoneornil(L, 3) ? NULL : zr_l_checktensor(L, 3);
    luaL_checktype(L, 4, LUA_TTABLE);
    zr_sgd_config c = {
        .lr = num_field(L, 4, "lr", -1e308),
        .momentum = num_field(L, 4, "momentum", 0),
        .dampening = num_field(L, 4, "dampening", 0),
        .weight_decay = num_field(L, 4, "weight_decay", 0),
    };
    lua_getfield(L, 4, "nesterov");
    c.nesterov = lua_toboolean(L, -1);
    lua_getfield(L, 4, "first");
    int first = lua_toboolean(L, -1);
    lua_pop(L, 2);
    if (zr_sgd_step(p, g, buf, first, &c)) return zr_l_error(L);
    return 0;
}

/* The optimizer options at table idx (beta1=, beta2=, eps=, momentum=, dampening=, nesterov=,
 * lr_decay=; Lamb: bias_correction= (default true), eps_inside_sqrt=, max_coeff=, min_coeff=). */
static zr_adamw_config read_config(lua_State *L, int idx, int kind) {
    zr_adamw_config c = {.beta1 = num_field(L, idx, "beta1", 0), .beta2 = num_field(L, idx, "beta2", 0),
                         .eps = num_field(L, idx, "eps", 0), .kind = kind,
                         .momentum = num_field(L, idx, "momentum", 0), .dampening = num_field(L, idx, "dampening", 0),
                         .lr_decay = num_field(L, idx, "lr_decay", 0), .max_coeff = num_field(L, idx, "max_coeff", 10),
                         .min_coeff = num_field(L, idx, "min_coeff", 0.01)};
    c.nesterov = zr_l_boolfield(L, idx, "nesterov");
    c.eps_inside_sqrt = zr_l_boolfield(L, idx, "eps_inside_sqrt");
    lua_getfield(L, idx, "bias_correction");
    c.no_bias_correction = !lua_isnil(L, -1) && !lua_toboolean(L, -1);
    lua_pop(L, 1);
    return c;
}

/* The segment list at idx, each {start= (1-based), n=, lr=, weight_decay=}, in a userdata pushed on
 * the stack (freed by the GC); *n gets the count. */
static zr_adamw_segment *read_segments(lua_State *L, int idx, const char *fn, int *n) {
    luaL_checktype(L, idx, LUA_TTABLE);
    *n = (int)lua_objlen(L, idx);
    zr_adamw_segment *segs = lua_newuserdata(L, sizeof *segs * (size_t)(*n ? *n : 1));
    for (int i = 0; i < *n; i++) {
        lua_rawgeti(L, idx, i + 1);
        if (!lua_istable(L, -1)) luaL_error(L, "%s: segment %d is not a table", fn, i + 1);
        int t = lua_gettop(L);
        segs[i] = (zr_adamw_segment){(int64_t)num_field(L, t, "start", 1) - 1, (int64_t)num_field(L, t, "n", 0),
                                     (float)num_field(L, t, "weight_decay", 0), (float)num_field(L, t, "lr", 0)};
        lua_pop(L, 1);
    }
    return segs;
}

/* optim_step(param, state_or_nil, grad, segments, {optimizer=, beta1=, beta2=, eps=, momentum=,
 * dampening=, nesterov=, lr_decay=}, step[, grad_scale]): Lion, Adagrad or SGD over segments of a
 * flat f32 tensor, each {start= (1-based), n=, lr=, weight_decay=}; the ZeRO engine's kernels. */
static int l_optim_step(lua_State *L) {
    zr_tensor *p = zr_l_checktensor(L, 1);
    zr_tensor *s = lua_isnil(L, 2) ? NULL : zr_l_checktensor(L, 2);
    zr_tensor *g = zr_l_checktensor(L, 3);
    luaL_checktype(L, 5, LUA_TTABLE);
    lua_getfield(L, 5, "optimizer");
    const char *name = luaL_checkstring(L, -1);
    int kind = !strcmp(name, "lion") ? ZR_OPTIM_LION : !strcmp(name, "adagrad") ? ZR_OPTIM_ADAGRAD
               : !strcmp(name, "sgd") ? ZR_OPTIM_SGD : -1;
    if (kind < 0)
        return luaL_error(L, "optim_step: optimizer must be \"lion\", \"adagrad\" or \"sgd\", got \"%s\" (Lamb has "
                          "lamb_step)", name);
    lua_pop(L, 1);
    zr_adamw_config c = read_config(L, 5, kind);
    const int64_t step = (int64_t)luaL_checknumber(L, 6);
    const double scale = luaL_optnumber(L, 7, 1.0);
    lua_settop(L, 7); /* the segment array goes above the arguments */
    int n;
    zr_adamw_segment *segs = read_segments(L, 4, "optim_step", &n);
    if (zr_optim_step_segments(p, s, g, segs, n, &c, step, scale))
        return zr_l_error(L);
    return 0;
}

/* lamb_step(param, exp_avg, exp_avg_sq, grad_or_nil, segments, {beta1=, beta2=, eps=, bias_correction=,
 * eps_inside_sqrt=, max_coeff=, min_coeff=}, step[, grad_scale]): Lamb on segments of a flat f32
 * tensor (as optim_step), each segment a whole parameter tensor with its own trust ratio: both
 * passes (zr_lamb_sums, zr_lamb_apply) in one process. */
static int l_lamb_step(lua_State *L) {
    zr_tensor *p = zr_l_checktensor(L, 1), *m = zr_l_checktensor(L, 2), *v = zr_l_checktensor(L, 3);
    zr_tensor *g = lua_isnil(L, 4) ? p->grad : zr_l_checktensor(L, 4); /* nil: p's own .grad */
    luaL_checktype(L, 6, LUA_TTABLE);
    zr_adamw_config c = read_config(L, 6, ZR_OPTIM_LAMB);
    const int64_t step = (int64_t)luaL_checknumber(L, 7);
    const double scale = luaL_optnumber(L, 8, 1.0);
    lua_settop(L, 8);
    int n;
    zr_adamw_segment *segs = read_segments(L, 5, "lamb_step", &n);
    if (zr_lamb_step_segments(p, m, v, g, segs, n, &c, step, scale)) return zr_l_error(L);
    return 0;
}

/* has_grad(t): whether t.grad is set, without creating a Lua reference to the gradient (which
 * would keep its memory alive until the next garbage collection). */
static int l_has_grad(lua_State *L) {
    lua_pushboolean(L, zr_l_checktensor(L, 1)->grad != NULL);
    return 1;
}

static const luaL_Reg functions[] = {
    {"adamw_step", l_adamw_step}, {"sgd_step", l_sgd_step}, {"optim_step", l_optim_step},
    {"lamb_step", l_lamb_step},   {"has_grad", l_has_grad},     {NULL, NULL}};

void zr_bind_optim(lua_State *L) { zr_l_register_functions(L, functions); }
