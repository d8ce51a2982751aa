/* Lua bindings for the ZeRO engine (runtime/zero/engine.h) and the stage-3 module-boundary autograd
 * nodes that gather parameters again before a module's backward and release them after it. */
#include <stdlib.h>
#include <string.h>

#include "bind.h"
#include "core/autograd.h"
#include "zero/comm.h"
#include "zero/engine.h"
#include "zero/zenflow.h"

#define ZERO_MT "zr.ZeroEngine"

static zr_zero *check_zero(lua_State *L, int idx) {
    zr_zero **p = luaL_checkudata(L, idx, ZERO_MT);
    if (!*p) luaL_error(L, "the ZeRO engine was freed");
    return *p;
}
static int ok_or_error(lua_State *L, zr_status st) {
    if (st) return zr_l_error(L);
    return 0;
}

static int read_indices(lua_State *L, int idx, int **out) {
    luaL_checktype(L, idx, LUA_TTABLE);
    int n = (int)lua_objlen(L, idx);
    *out = malloc(sizeof(int) * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, idx, i + 1);
        (*out)[i] = (int)lua_tointeger(L, -1) - 1;
        lua_pop(L, 1);
    }
    return n;
}

/* A number the caller must give: the defaults live in one place, the resolved config (config.lua). */
static double required_num(lua_State *L, int idx, const char *key) {
    lua_getfield(L, idx, key);
    if (lua_type(L, -1) != LUA_TNUMBER)
        luaL_error(L, "zero_new: option '%s' is required (a number, from the resolved config), got %s", key,
                   luaL_typename(L, -1));
    double v = lua_tonumber(L, -1);
    lua_pop(L, 1);
    return v;
}

/* The optimizer kind named by field `key` of table idx ("adamw", "lion", "adagrad", "sgd", "lamb"; nil:
 * "adamw"). */
static int optim_kind_field(lua_State *L, int idx, const char *key) {
    lua_getfield(L, idx, key);
    const char *s = lua_isnil(L, -1) ? "adamw" : luaL_checkstring(L, -1);
    int k = !strcmp(s, "adamw") ? ZR_OPTIM_ADAMW
            : !strcmp(s, "lion") ? ZR_OPTIM_LION
            : !strcmp(s, "adagrad") ? ZR_OPTIM_ADAGRAD
            : !strcmp(s, "sgd") ? ZR_OPTIM_SGD
            : !strcmp(s, "lamb") ? ZR_OPTIM_LAMB : -1;
    if (k < 0) luaL_error(L, "%s: unknown optimizer \"%s\" (adamw, lion, adagrad, sgd or lamb)", key, s);
    lua_pop(L, 1);
    return k;
}
static double opt_num(lua_State *L, int idx, const char *key, double dflt) {
    lua_getfield(L, idx, key);
    double v = lua_isnil(L, -1) ? dflt : luaL_checknumber(L, -1);
    lua_pop(L, 1);
    return v;
}

/* zero_new({stage=, reduce_bucket_size=, allgather_bucket_size=, persistence_threshold=,
 *           max_live_parameters= (all required), offload_optimizer=, offload_param=, pin_memory=,
 *           param_pin_memory= (offload_param.pin_memory),
 *           offload_grads_on_device= (offload_optimizer: gradients on the GPU until the step),
 *           offload_ratio= (offload_optimizer: the host's share of the optimizer states; nil: 1),
 *           overlap_comm=, keep_grads= (stage 2: gradients stay until the next backward), comm_dtype= (nil: the parameters'), grad_dtype= (nil: f32),
 *           names= (a name per parameter, for collective messages), optimizer= (nil: "adamw"),
 *           momentum= (SGD), initial_accumulator_value= (Adagrad), master_dtype=, state_dtype= (nil: f32;
 *           "bf16": DeepSpeed's bf16_master_weights_and_grads / bf16_optimizer_states)}, {params...}, {weight_decay...}) */
static int l_new(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    luaL_checktype(L, 2, LUA_TTABLE);
    zr_zero_config c = {0};
    c.stage = (int)required_num(L, 1, "stage");
    c.reduce_bucket_size = (int64_t)required_num(L, 1, "reduce_bucket_size");
    c.allgather_bucket_size = (int64_t)required_num(L, 1, "allgather_bucket_size");
    c.offload_optimizer = zr_l_boolfield(L, 1, "offload_optimizer");
    c.offload_param = zr_l_boolfield(L, 1, "offload_param");
    c.offload_grads_on_device = zr_l_boolfield(L, 1, "offload_grads_on_device");
    c.offload_ratio = opt_num(L, 1, "offload_ratio", 1);
    c.persistence_threshold = (int64_t)required_num(L, 1, "persistence_threshold");
    c.pin_memory = zr_l_boolfield(L, 1, "pin_memory");
    c.param_pin_memory = zr_l_boolfield(L, 1, "param_pin_memory");
    c.overlap_comm = zr_l_boolfield(L, 1, "overlap_comm");
    c.keep_grads = zr_l_boolfield(L, 1, "keep_grads");
    c.max_live_parameters = (int64_t)required_num(L, 1, "max_live_parameters");
    lua_getfield(L, 1, "comm_dtype");
    c.comm_dtype = lua_isnil(L, -1) ? -1 : (int)zr_l_checkdtype(L, lua_gettop(L));
    lua_pop(L, 1);
    c.optimizer = optim_kind_field(L, 1, "optimizer");
    c.momentum = opt_num(L, 1, "momentum", 0);
    c.initial_accumulator_value = opt_num(L, 1, "initial_accumulator_value", 0);
    lua_getfield(L, 1, "grad_dtype");
    c.grad_dtype = lua_isnil(L, -1) ? -1 : (int)zr_l_checkdtype(L, lua_gettop(L));
    lua_pop(L, 1);
    lua_getfield(L, 1, "master_dtype");
    c.master_dtype = lua_isnil(L, -1) ? ZR_F32 : (int)zr_l_checkdtype(L, lua_gettop(L));
    lua_pop(L, 1);
    lua_getfield(L, 1, "state_dtype");
    c.state_dtype = lua_isnil(L, -1) ? ZR_F32 : (int)zr_l_checkdtype(L, lua_gettop(L));
    lua_pop(L, 1);
    if (zr_comm_init()) return zr_l_error(L);
    c.world_size = zr_comm_get()->world_size;
    c.rank = zr_comm_get()->rank;
    int n = (int)lua_objlen(L, 2);
    zr_tensor **ps = malloc(sizeof *ps * (size_t)(n ? n : 1));
    double *wd = malloc(sizeof *wd * (size_t)(n ? n : 1));
    const char **names = calloc((size_t)(n ? n : 1), sizeof *names); /* for messages; may be absent */
    lua_getfield(L, 1, "names");
    int names_idx = lua_gettop(L);
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, 2, i + 1);
        ps[i] = zr_l_checktensor(L, -1);
        lua_pop(L, 1);
        if (names && lua_istable(L, names_idx)) {
            lua_rawgeti(L, names_idx, i + 1);
            if (lua_type(L, -1) == LUA_TSTRING) names[i] = lua_tostring(L, -1); /* kept alive by the table */
            lua_pop(L, 1);
        }
        wd[i] = 0;
        if (lua_istable(L, 3)) {
            lua_rawgeti(L, 3, i + 1);
            wd[i] = lua_tonumber(L, -1);
            lua_pop(L, 1);
        }
    }
    zr_zero **box = lua_newuserdata(L, sizeof *box);
    *box = NULL;
    luaL_getmetatable(L, ZERO_MT);
    lua_setmetatable(L, -2);
    c.names = names && lua_istable(L, names_idx) ? names : NULL;
    *box = zr_zero_new(&c, n, ps, wd);
    free(ps);
    free(wd);
    free(names);
    if (!*box) return zr_l_error(L);
    return 1;
}

static int l_gc(lua_State *L) {
    zr_zero **p = luaL_checkudata(L, 1, ZERO_MT);
    zr_zero_free(*p);
    *p = NULL;
    return 0;
}
static int l_backward_begin(lua_State *L) {
    return ok_or_error(L, zr_zero_backward_begin(check_zero(L, 1), lua_toboolean(L, 2)));
}
static int l_backward_end(lua_State *L) { return ok_or_error(L, zr_zero_backward_end(check_zero(L, 1))); }
static int l_reduce(lua_State *L) { return ok_or_error(L, zr_zero_reduce(check_zero(L, 1))); }
static int l_grad_norm(lua_State *L) {
    double norm;
    if (zr_zero_grad_norm(check_zero(L, 1), luaL_optnumber(L, 2, 1.0), &norm)) return zr_l_error(L);
    lua_pushnumber(L, norm);
    return 1;
}
/* Reads step's arguments 3..7 (lr, beta1, beta2, eps, extra) into c and a malloc'ed lr (one per parameter). */
static double *step_args(lua_State *L, zr_zero *z, zr_adamw_config *c) {
    int n = zr_zero_num_params(z);
    if (lua_istable(L, 4) && (int)lua_objlen(L, 4) != n)
        luaL_error(L, "step: %d learning rates for %d parameters", (int)lua_objlen(L, 4), n);
    int table = lua_istable(L, 4);
    double one = table ? 0 : luaL_checknumber(L, 4);
    *c = (zr_adamw_config){.beta1 = luaL_checknumber(L, 5), .beta2 = luaL_checknumber(L, 6), .eps = luaL_checknumber(L, 7)};
    if (lua_istable(L, 8)) {
        c->kind = optim_kind_field(L, 8, "optimizer");
        c->momentum = opt_num(L, 8, "momentum", 0);
        c->dampening = opt_num(L, 8, "dampening", 0);
        c->lr_decay = opt_num(L, 8, "lr_decay", 0);
        c->nesterov = zr_l_boolfield(L, 8, "nesterov");
        lua_getfield(L, 8, "bias_correction");
        c->no_bias_correction = !lua_isnil(L, -1) && !lua_toboolean(L, -1);
        lua_pop(L, 1);
        c->eps_inside_sqrt = zr_l_boolfield(L, 8, "eps_inside_sqrt");
        c->max_coeff = opt_num(L, 8, "max_coeff", 10);
        c->min_coeff = opt_num(L, 8, "min_coeff", 0.01);
    }
    double *lr = malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (!lr) luaL_error(L, "step: out of host memory");
    for (int i = 0; i < n; i++) {
        if (table) {
            lua_rawgeti(L, 4, i + 1);
            lr[i] = lua_tonumber(L, -1);
            lua_pop(L, 1);
        } else
            lr[i] = one;
    }
    return lr;
}
/* step(grad_scale, step, lr, beta1, beta2, eps[, extra]); lr: a number, or a table with one learning
 * rate per parameter (its group's); extra: {optimizer= (nil: "adamw"), momentum=, dampening=,
 * nesterov=, lr_decay=, bias_correction= (nil: true), eps_inside_sqrt=, max_coeff=, min_coeff=} */
static int l_step(lua_State *L) {
    zr_zero *z = check_zero(L, 1);
    zr_adamw_config c;
    double *lr = step_args(L, z, &c);
    zr_status st = zr_zero_step(z, luaL_checknumber(L, 2), (int64_t)luaL_checknumber(L, 3), &c, lr);
    free(lr);
    return ok_or_error(L, st);
}
/* step_async(grad_scale, step, lr, beta1, beta2, eps, extra|nil, set, threads): ZenFlow's overlap_step
 * (zr_zero_step_async); async_wait(), async_apply(), async_busy() -> boolean */
static int l_step_async(lua_State *L) {
    zr_zero *z = check_zero(L, 1);
    zr_adamw_config c;
    double *lr = step_args(L, z, &c);
    zr_status st = zr_zero_step_async(z, luaL_checknumber(L, 2), (int64_t)luaL_checknumber(L, 3), &c, lr,
                                      (int)luaL_checkinteger(L, 9), (int)luaL_checkinteger(L, 10));
    free(lr);
    return ok_or_error(L, st);
}
static int l_async_wait(lua_State *L) { return ok_or_error(L, zr_zero_async_wait(check_zero(L, 1))); }
static int l_async_apply(lua_State *L) { return ok_or_error(L, zr_zero_async_apply(check_zero(L, 1))); }
static int l_async_busy(lua_State *L) {
    lua_pushboolean(L, zr_zero_async_busy(check_zero(L, 1)));
    return 1;
}
/* async_state(k, create) -> tensor or nil: overlap_step's pending weights (0) or second moment set
 * (1, 2) for checkpoints (zr_zero_async_state); async_pending() -> boolean; set_async_pending(on) */
static int l_async_state(lua_State *L) {
    zr_tensor *t;
    if (zr_zero_async_state(check_zero(L, 1), (int)luaL_checkinteger(L, 2), lua_toboolean(L, 3), &t))
        return zr_l_error(L);
    if (!t) {
        lua_pushnil(L);
        return 1;
    }
    return zr_l_pushtensor(L, t);
}
static int l_async_pending(lua_State *L) {
    lua_pushboolean(L, zr_zero_async_pending(check_zero(L, 1)));
    return 1;
}
static int l_set_async_pending(lua_State *L) {
    return ok_or_error(L, zr_zero_async_set_pending(check_zero(L, 1), lua_toboolean(L, 2)));
}
static int l_zero_grad(lua_State *L) { return ok_or_error(L, zr_zero_zero_grad(check_zero(L, 1))); }
static int l_refresh(lua_State *L) { return ok_or_error(L, zr_zero_refresh_params(check_zero(L, 1))); }
static int l_partition_numel(lua_State *L) {
    lua_pushnumber(L, (lua_Number)zr_zero_partition_numel(check_zero(L, 1)));
    return 1;
}
static int l_layout(lua_State *L) {
    int64_t off, c;
    zr_zero_param_layout(check_zero(L, 1), (int)luaL_checkinteger(L, 2) - 1, &off, &c);
    lua_pushnumber(L, (lua_Number)off);
    lua_pushnumber(L, (lua_Number)c);
    return 2;
}
/* state(k): partition tensor k (0 master, 1 and 2 the optimizer's states, 3 grads); nil for a state
 * the optimizer does not keep */
static int l_state(lua_State *L) {
    zr_zero *z = check_zero(L, 1);
    int k = (int)luaL_checkinteger(L, 2);
    if ((k == 1 || k == 2) && k > zr_zero_num_states(z)) {
        lua_pushnil(L);
        return 1;
    }
    return zr_l_pushtensor(L, zr_zero_state(z, k));
}
/* set_state(k, t): t (the partition's S f32 elements) into state k (0-2), both parts of a split */
static int l_set_state(lua_State *L) {
    zr_zero *z = check_zero(L, 1);
    return ok_or_error(L, zr_zero_set_state(z, (int)luaL_checkinteger(L, 2), zr_l_checktensor(L, 3)));
}
/* num_states(): the optimizer's f32 states beside the master (AdamW 2, Lion/Adagrad 1, SGD 0 or 1) */
static int l_num_states(lua_State *L) {
    lua_pushinteger(L, zr_zero_num_states(check_zero(L, 1)));
    return 1;
}
/* split(): partial offload's boundary (elements of the partition's head updated on the device; 0: none) */
static int l_split(lua_State *L) {
    lua_pushnumber(L, (lua_Number)zr_zero_split(check_zero(L, 1)));
    return 1;
}
/* fn(engine, {param indices}): gather / release */
static int call_indices(lua_State *L, zr_status (*fn)(zr_zero *, int, const int *)) {
    zr_zero *z = check_zero(L, 1);
    int *idx, n = read_indices(L, 2, &idx);
    zr_status st = fn(z, n, idx);
    free(idx);
    return ok_or_error(L, st);
}
static int l_gather(lua_State *L) { return call_indices(L, zr_zero_gather); }
static int l_release(lua_State *L) { return call_indices(L, zr_zero_release); }
/* prefetch({param indices}, budget elements): starts their all-gathers (stage 3) */
static int l_prefetch(lua_State *L) {
    zr_zero *z = check_zero(L, 1);
    int *idx, n = read_indices(L, 2, &idx);
    zr_status st = zr_zero_prefetch(z, n, idx, (int64_t)luaL_checknumber(L, 3));
    free(idx);
    return ok_or_error(L, st);
}
static int l_live_numel(lua_State *L) {
    lua_pushnumber(L, (lua_Number)zr_zero_live_numel(check_zero(L, 1)));
    return 1;
}
static int l_release_all(lua_State *L) { return ok_or_error(L, zr_zero_release_all(check_zero(L, 1))); }
static int l_shard_pinned(lua_State *L) {
    lua_pushboolean(L, zr_zero_shard_pinned(check_zero(L, 1)));
    return 1;
}
static int l_is_resident(lua_State *L) {
    lua_pushboolean(L, zr_zero_is_resident(check_zero(L, 1)));
    return 1;
}
static int l_is_gathered(lua_State *L) {
    lua_pushboolean(L, zr_zero_is_gathered(check_zero(L, 1), (int)luaL_checkinteger(L, 2) - 1));
    return 1;
}

/* --- stage-3 boundary nodes: identity forward; backward gathers (kind 1) or releases (kind 0)
 * the listed parameters, so a module's parameters are whole exactly during its backward. --- */
typedef struct {
    zr_zero *z;
    int kind, n, npre;
    int *idx, *pre; /* pre: parameters to prefetch after gathering (the modules whose backward is next) */
    int64_t budget;
} boundary_ctx;

static void boundary_free(void *p) {
    boundary_ctx *b = p;
    free(b->idx);
    free(b->pre);
    free(b);
}
static zr_status boundary_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    boundary_ctx *b = n->ctx;
    zr_status st = b->kind ? zr_zero_gather(b->z, b->n, b->idx) : zr_zero_release(b->z, b->n, b->idx);
    if (!st && b->npre) st = zr_zero_prefetch(b->z, b->npre, b->pre, b->budget);
    if (st) return st;
    gin[0] = zr_tensor_retain(g);
    return ZR_OK;
}
/* boundary(engine, tensor, kind (0 release / 1 gather), {param indices} [, {prefetch indices},
 * budget]) -> identity tensor */
static int l_boundary(lua_State *L) {
    zr_zero *z = check_zero(L, 1);
    zr_tensor *x = zr_l_checktensor(L, 2);
    int kind = (int)luaL_checkinteger(L, 3);
    if (!zr_tensor_needs_grad(x) || !zr_grad_enabled()) {
        lua_pushvalue(L, 2);
        return 1;
    }
    zr_tensor *out = zr_tensor_detach(x);
    zr_node *node;
    if (!out || zr_autograd_record(out, kind ? "zero3_gather" : "zero3_release", boundary_backward, 1, &x, &node)) {
        zr_tensor_release(out);
        return zr_l_error(L);
    }
    boundary_ctx *b = calloc(1, sizeof *b);
    b->z = z;
    b->kind = kind;
    b->n = read_indices(L, 4, &b->idx);
    if (lua_istable(L, 5)) {
        b->npre = read_indices(L, 5, &b->pre);
        b->budget = (int64_t)luaL_optnumber(L, 6, 0);
    }
    node->ctx = b;
    node->ctx_free = boundary_free;
    return zr_l_pushtensor(L, out);
}

static const luaL_Reg methods[] = {
    {"backward_begin", l_backward_begin}, {"backward_end", l_backward_end}, {"reduce", l_reduce},
    {"grad_norm", l_grad_norm}, {"step", l_step}, {"step_async", l_step_async}, {"async_wait", l_async_wait},
    {"async_apply", l_async_apply}, {"async_busy", l_async_busy}, {"async_state", l_async_state},
    {"async_pending", l_async_pending}, {"set_async_pending", l_set_async_pending}, {"zero_grad", l_zero_grad},
    {"refresh_params", l_refresh}, {"partition_numel", l_partition_numel}, {"layout", l_layout},
    {"state", l_state}, {"set_state", l_set_state}, {"split", l_split}, {"num_states", l_num_states}, {"gather", l_gather}, {"release", l_release},
    {"prefetch", l_prefetch}, {"live_numel", l_live_numel}, {"release_all", l_release_all},
    {"is_gathered", l_is_gathered}, {"is_resident", l_is_resident}, {"shard_pinned", l_shard_pinned},
    {"boundary", l_boundary}, {NULL, NULL}};

/* ===== zenflow (runtime/zero/zenflow.h): ZenFlow's selective column update ===== */
/* zenflow_colsum(out, g) */
static int l_zenflow_colsum(lua_State *L) {
    return ok_or_error(L, zr_zenflow_colsum(zr_l_checktensor(L, 1), zr_l_checktensor(L, 2)));
}
/* zenflow_absdiff_sums(sums, {{slot (1-based), a, prev|nil, have_prev, keep}, ...}) */
static int l_zenflow_absdiff_sums(lua_State *L) {
    zr_tensor *sums = zr_l_checktensor(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    int n = (int)lua_objlen(L, 2);
    zr_zenflow_absdiff *e = lua_newuserdata(L, ((size_t)n + 1) * sizeof *e);
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, 2, i + 1);
        int top = lua_gettop(L);
        for (int k = 1; k <= 5 && lua_istable(L, top); k++) lua_rawgeti(L, top, k);
        if (!lua_istable(L, top) || !lua_isnumber(L, top + 1) || !zr_l_totensor(L, top + 2) ||
            !(lua_isnil(L, top + 3) || zr_l_totensor(L, top + 3)))
            luaL_error(L, "zenflow_absdiff_sums: entry %d (0-based) is not a {slot, a, prev|nil, have_prev, keep} "
                          "table", i);
        e[i] = (zr_zenflow_absdiff){(int64_t)lua_tointeger(L, top + 1) - 1, zr_l_totensor(L, top + 2),
                                    zr_l_totensor(L, top + 3), lua_toboolean(L, top + 4), lua_toboolean(L, top + 5)};
        lua_settop(L, top - 1); /* the tensors stay referenced by the argument table */
    }
    return ok_or_error(L, zr_zenflow_absdiff_sums(sums, e, n));
}
/* zenflow_gather(out, src, idx|nil) / zenflow_scatter(dst, src, idx|nil) */
static int l_zenflow_gather(lua_State *L) {
    return ok_or_error(L, zr_zenflow_gather(zr_l_checktensor(L, 1), zr_l_checktensor(L, 2), zr_l_totensor(L, 3)));
}
static int l_zenflow_scatter(lua_State *L) {
    return ok_or_error(L, zr_zenflow_scatter(zr_l_checktensor(L, 1), zr_l_checktensor(L, 2), zr_l_totensor(L, 3)));
}
/* zenflow_adamw(p, g, idx|nil, m, v, lr, beta1, beta2, eps, weight_decay, step); g: (rows, cols) or the
 * selected columns' (rows, k) */
static int l_zenflow_adamw(lua_State *L) {
    return ok_or_error(L, zr_zenflow_adamw(zr_l_checktensor(L, 1), zr_l_checktensor(L, 2), zr_l_totensor(L, 3),
                                           zr_l_checktensor(L, 4), zr_l_checktensor(L, 5), luaL_checknumber(L, 6),
                                           luaL_checknumber(L, 7), luaL_checknumber(L, 8), luaL_checknumber(L, 9),
                                           luaL_checknumber(L, 10), (int64_t)luaL_checkinteger(L, 11)));
}
/* zenflow_hold(on): the overlap test's hook (zr_zero_async_hold) */
static int l_zenflow_hold(lua_State *L) {
    zr_zero_async_hold(lua_toboolean(L, 1));
    return 0;
}

static const luaL_Reg fns[] = {{"zero_new", l_new}, {"zenflow_colsum", l_zenflow_colsum},
                               {"zenflow_absdiff_sums", l_zenflow_absdiff_sums},
                               {"zenflow_gather", l_zenflow_gather}, {"zenflow_scatter", l_zenflow_scatter},
                               {"zenflow_adamw", l_zenflow_adamw}, {"zenflow_hold", l_zenflow_hold}, {NULL, NULL}};

void zr_bind_zero(lua_State *L) {
    zr_l_newclass(L, ZERO_MT, l_gc, methods);
    zr_l_register_functions(L, fns);
}
