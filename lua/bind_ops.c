/* Lua bindings for elementwise ops, reductions, and comparisons with where/masked_fill, one
 * banner per op family (runtime/ops/elementwise.h, reduce.h, compare.h). */
#include <string.h>

#include "bind.h"
#include "ops/compare.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"

/* ===== elementwise (runtime/ops/elementwise.h) ===== */

#define UNARY(fname, op)                                                                           \
    static int l_##fname(lua_State *L) {                                                           \
        return zr_l_pushtensor(L, zr_unary(op, zr_l_checktensor(L, 1), 0));                        \
    }
UNARY(neg, ZR_UN_NEG)
UNARY(exp, ZR_UN_EXP)
UNARY(log, ZR_UN_LOG)
UNARY(sqrt, ZR_UN_SQRT)
UNARY(rsqrt, ZR_UN_RSQRT)
UNARY(relu, ZR_UN_RELU)
UNARY(silu, ZR_UN_SILU)
UNARY(sigmoid, ZR_UN_SIGMOID)
UNARY(tanh, ZR_UN_TANH)
UNARY(abs, ZR_UN_ABS)
UNARY(square, ZR_UN_SQUARE)
UNARY(reciprocal, ZR_UN_RECIPROCAL)

/* gelu(x) or gelu(x, "tanh") */
static int l_gelu(lua_State *L) {
    zr_tensor *x = zr_l_checktensor(L, 1);
    const char *approx = luaL_optstring(L, 2, "none");
    int op = ZR_UN_GELU_ERF;
    if (strcmp(approx, "tanh") == 0) op = ZR_UN_GELU_TANH;
    else if (strcmp(approx, "none") != 0) luaL_error(L, "gelu: approximate must be 'none' or 'tanh', got '%s'", approx);
    return zr_l_pushtensor(L, zr_unary(op, x, 0));
}

static int l_pow(lua_State *L) {
    return zr_l_pushtensor(L, zr_unary(ZR_UN_POW, zr_l_checktensor(L, 1), luaL_checknumber(L, 2)));
}

/* Binary ops accept a tensor or a number on either side. */
static int binary(lua_State *L, int op) {
    zr_tensor *a = zr_l_totensor(L, 1), *b = zr_l_totensor(L, 2);
    if (a && b) return zr_l_pushtensor(L, zr_binary(op, a, b));
    if (!a && !b) luaL_error(L, "expected at least one tensor operand");
    double s = luaL_checknumber(L, a ? 2 : 1);
    zr_tensor *t = a ? a : b;
    switch (op) {
    case ZR_BIN_ADD: return zr_l_pushtensor(L, zr_affine(t, 1, s));
    case ZR_BIN_SUB: return zr_l_pushtensor(L, a ? zr_affine(t, 1, -s) : zr_affine(t, -1, s));
    case ZR_BIN_MUL: return zr_l_pushtensor(L, zr_affine(t, s, 0));
    case ZR_BIN_DIV:
        if (a) return zr_l_pushtensor(L, zr_affine(t, 1 / s, 0));
        {
            zr_tensor *r = zr_unary(ZR_UN_RECIPROCAL, t, 0);
            if (!r) return zr_l_error(L);
            zr_tensor *o = zr_affine(r, s, 0);
            zr_tensor_release(r);
            return zr_l_pushtensor(L, o);
        }
    default: {
        zr_tensor *st = zr_tensor_scalar(s, t->dtype, t->storage->device);
        if (!st) return zr_l_error(L);
        zr_tensor *o = a ? zr_binary(op, t, st) : zr_binary(op, st, t);
        zr_tensor_release(st);
        return zr_l_pushtensor(L, o);
    }
    }
}
static int l_add(lua_State *L) { return binary(L, ZR_BIN_ADD); }
static int l_sub(lua_State *L) { return binary(L, ZR_BIN_SUB); }
static int l_mul(lua_State *L) { return binary(L, ZR_BIN_MUL); }
static int l_div(lua_State *L) { return binary(L, ZR_BIN_DIV); }

static int l_affine(lua_State *L) {
    return zr_l_pushtensor(L, zr_affine(zr_l_checktensor(L, 1), luaL_checknumber(L, 2), luaL_optnumber(L, 3, 0)));
}
/* t:add_(src [, alpha]) / t:add_(number) in place, no autograd */
static int l_add_(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    zr_status st;
    if (lua_type(L, 2) == LUA_TNUMBER) {
        zr_tensor *s = zr_tensor_scalar(lua_tonumber(L, 2), t->dtype, t->storage->device);
        st = s ? zr_add_(t, s, 1) : ZR_ERR;
        zr_tensor_release(s);
    } else
        st = zr_add_(t, zr_l_checktensor(L, 2), luaL_optnumber(L, 3, 1));
    if (st) return zr_l_error(L);
    lua_settop(L, 1);
    return 1;
}
static int l_mul_(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    if (zr_mul_scalar_(t, luaL_checknumber(L, 2))) return zr_l_error(L);
    lua_settop(L, 1);
    return 1;
}

/* ===== reduce (runtime/ops/reduce.h) ===== */

/* Reduction dims: nil (all), a number, or a table of numbers (1-based). */
static int read_dims(lua_State *L, int idx, int *dims) {
    if (lua_isnoneornil(L, idx)) return 0;
    if (lua_type(L, idx) == LUA_TNUMBER) {
        dims[0] = zr_l_checkdim(L, idx);
        return 1;
    }
    luaL_checktype(L, idx, LUA_TTABLE);
    int n = (int)lua_objlen(L, idx);
    if (n > ZR_MAX_DIMS) luaL_error(L, "too many dims");
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, idx, i + 1);
        dims[i] = zr_l_checkdim(L, lua_gettop(L));
        lua_pop(L, 1);
    }
    return n;
}
static int l_sum(lua_State *L) {
    int dims[ZR_MAX_DIMS], n = read_dims(L, 2, dims);
    return zr_l_pushtensor(L, zr_sum(zr_l_checktensor(L, 1), n, dims, lua_toboolean(L, 3)));
}
static int l_mean(lua_State *L) {
    int dims[ZR_MAX_DIMS], n = read_dims(L, 2, dims);
    return zr_l_pushtensor(L, zr_mean(zr_l_checktensor(L, 1), n, dims, lua_toboolean(L, 3)));
}
/* max(t) -> value tensor; max(t, dim [, keepdim]) -> values, indices (1-based) */
static int l_max(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    int dims[ZR_MAX_DIMS], n = read_dims(L, 2, dims);
    if (n == 0) return zr_l_pushtensor(L, zr_max(t, 0, dims, 0, NULL));
    zr_tensor *idx = NULL;
    zr_tensor *v = zr_max(t, n, dims, lua_toboolean(L, 3), &idx);
    if (!v) return zr_l_error(L);
    zr_l_pushtensor(L, v);
    /* Lua sees 1-based positions: idx + 1 on idx's device, through f64 (exact below 2^53) */
    if (!idx) return 1;
    zr_tensor *idx1 = NULL;
    {
        zr_device dev = idx->storage->device;
        zr_tensor *f = zr_tensor_to_raw(idx, ZR_F64, dev);
        zr_tensor *f1 = f ? zr_affine(f, 1, 1) : NULL;
        idx1 = f1 ? zr_tensor_to_raw(f1, ZR_I64, dev) : NULL;
        zr_tensor_release(f);
        zr_tensor_release(f1);
    }
    zr_tensor_release(idx);
    if (!idx1) return zr_l_error(L);
    return 1 + zr_l_pushtensor(L, idx1);
}

/* ===== compare: comparisons, where, masked_fill (runtime/ops/compare.h) ===== */

/* The tensor at idx, or a new 0-dim tensor of `like`'s dtype/device holding the number there. */
static zr_tensor *tensor_or_scalar(lua_State *L, int idx, zr_tensor *like, int *owned) {
    zr_tensor *t = zr_l_totensor(L, idx);
    *owned = 0;
    if (t) return t;
    double v = luaL_checknumber(L, idx);
    *owned = 1;
    return zr_tensor_scalar(v, like->dtype, like->storage->device);
}

/* where(cond, a, b): a or b may be a number */
static int l_where(lua_State *L) {
    zr_tensor *cond = zr_l_checktensor(L, 1), *a = zr_l_totensor(L, 2), *b = zr_l_totensor(L, 3);
    if (!a && !b) luaL_error(L, "where: a or b must be a tensor");
    int oa, ob;
    zr_tensor *ta = tensor_or_scalar(L, 2, b ? b : a, &oa);
    zr_tensor *tb = ta ? tensor_or_scalar(L, 3, a ? a : b, &ob) : NULL;
    zr_tensor *r = ta && tb ? zr_where(cond, ta, tb) : NULL;
    if (oa) zr_tensor_release(ta);
    if (tb && ob) zr_tensor_release(tb);
    return zr_l_pushtensor(L, r);
}

/* masked_fill(x, mask, value) */
static int l_masked_fill(lua_State *L) {
    return zr_l_pushtensor(L, zr_masked_fill(zr_l_checktensor(L, 1), zr_l_checktensor(L, 2), luaL_checknumber(L, 3)));
}

static int compare(lua_State *L, int op) {
    zr_tensor *a = zr_l_checktensor(L, 1), *b = zr_l_totensor(L, 2);
    if (b) return zr_l_pushtensor(L, zr_compare(op, a, b));
    return zr_l_pushtensor(L, zr_compare_scalar(op, a, luaL_checknumber(L, 2)));
}
static int l_eq(lua_State *L) { return compare(L, ZR_CMP_EQ); }
static int l_ne(lua_State *L) { return compare(L, ZR_CMP_NE); }
static int l_lt(lua_State *L) { return compare(L, ZR_CMP_LT); }
static int l_le(lua_State *L) { return compare(L, ZR_CMP_LE); }
static int l_gt(lua_State *L) { return compare(L, ZR_CMP_GT); }
static int l_ge(lua_State *L) { return compare(L, ZR_CMP_GE); }
static int l_logical_not(lua_State *L) { return zr_l_pushtensor(L, zr_logical_not(zr_l_checktensor(L, 1))); }

/* ===== registration ===== */

static const luaL_Reg methods[] = {
    {"neg", l_neg}, {"exp", l_exp}, {"log", l_log}, {"sqrt", l_sqrt}, {"rsqrt", l_rsqrt},
    {"relu", l_relu}, {"silu", l_silu}, {"sigmoid", l_sigmoid}, {"tanh", l_tanh}, {"abs", l_abs},
    {"square", l_square}, {"reciprocal", l_reciprocal}, {"gelu", l_gelu}, {"pow", l_pow},
    {"add", l_add}, {"sub", l_sub}, {"mul", l_mul}, {"div", l_div}, {"affine", l_affine},
    {"add_", l_add_}, {"mul_", l_mul_}, {"sum", l_sum}, {"mean", l_mean}, {"max", l_max},
    {"masked_fill", l_masked_fill}, {"eq", l_eq}, {"ne", l_ne}, {"lt", l_lt}, {"le", l_le},
    {"gt", l_gt}, {"ge", l_ge}, {"logical_not", l_logical_not}, {NULL, NULL}};
static const luaL_Reg functions[] = {{"where", l_where}, {NULL, NULL}};

void zr_bind_ops(lua_State *L) {
    zr_l_register_methods(L, methods);
    zr_l_register_functions(L, functions);
}
