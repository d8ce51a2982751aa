/* Lua bindings for the fused projections (runtime/ops/linear_multi.h):
 *   zr.linear_multi(x, {w1, ..., wn} [, {b1, ..., bn}]) -> y (..., Σ out_i)
 *   zr.linear_multi_runs({w1, ..., wn}) -> GEMMs per direction (1 when the weights are adjacent)
 *   zr.lora_multi(x, {w...}, {b...} or nil, {A...}, {B...}, {s...}, p, training) -> y (..., Σ out_i):
 *     frozen projections with LoRA adapters (runtime/ops/lora.h); A[i] = B[i] = false for a plain one
 * (zr.split, whose backward fills one gradient buffer, is bound in bind_layer_ops.c). */
#include "bind.h"
#include "ops/linear_multi.h"
#include "ops/lora.h"

/* The tensors of the array at idx (1 to ZR_LINEAR_MULTI_MAX of them) into ts; returns the count. */
static int check_array(lua_State *L, int idx, const char *what, zr_tensor **ts) {
    luaL_checktype(L, idx, LUA_TTABLE);
    int n = (int)lua_objlen(L, idx);
    if (n < 1 || n > ZR_LINEAR_MULTI_MAX)
        luaL_error(L, "linear_multi: expected 1 to %d %s, got %d", ZR_LINEAR_MULTI_MAX, what, n);
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, idx, i + 1);
        ts[i] = zr_l_totensor(L, -1);
        if (!ts[i]) luaL_error(L, "linear_multi: element %d of the %s is not a tensor", i + 1, what);
        lua_pop(L, 1); /* the array keeps it alive */
    }
    return n;
}

/* linear_multi(x, {w...} [, {b...}]) */
static int l_linear_multi(lua_State *L) {
    zr_tensor *x = zr_l_checktensor(L, 1), *w[ZR_LINEAR_MULTI_MAX], *b[ZR_LINEAR_MULTI_MAX];
    int n = check_array(L, 2, "weights", w);
    int has_b = !lua_isnoneornil(L, 3);
    if (has_b && check_array(L, 3, "biases", b) != n)
        luaL_error(L, "linear_multi: %d weights but %d biases (give one bias per weight, or none)", n,
                   (int)lua_objlen(L, 3));
    return zr_l_pushtensor(L, zr_linear_multi(x, n, w, has_b ? b : NULL));
}

/* linear_multi_runs({w...}) -> the number of GEMMs linear_multi runs for them (1: adjacent) */
static int l_linear_multi_runs(lua_State *L) {
    zr_tensor *w[ZR_LINEAR_MULTI_MAX];
    int n = check_array(L, 1, "weights", w);
    lua_pushinteger(L, zr_linear_multi_runs(n, w));
    return 1;
}

/* The i-th entries (1-based) of the arrays at idx: a tensor, or NULL for false. */
static zr_tensor *optional_at(lua_State *L, int idx, int i, const char *what) {
    lua_rawgeti(L, idx, i);
    zr_tensor *t = lua_toboolean(L, -1) ? zr_l_totensor(L, -1) : NULL;
    if (lua_toboolean(L, -1) && !t) luaL_error(L, "lora_multi: %s[%d] is not a tensor (give false for none)", what, i);
    lua_pop(L, 1); /* the array keeps it alive */
    return t;
}

/* lora_multi(x, {w...}, {b...} | nil, {A...}, {B...}, {s...}, p, training) */
static int l_lora_multi(lua_State *L) {
    zr_tensor *x = zr_l_checktensor(L, 1), *w[ZR_LINEAR_MULTI_MAX], *b[ZR_LINEAR_MULTI_MAX];
    zr_tensor *A[ZR_LORA_MULTI_MAX], *B[ZR_LORA_MULTI_MAX];
    double s[ZR_LORA_MULTI_MAX];
    int n = check_array(L, 2, "weights", w);
    if (n > ZR_LORA_MULTI_MAX) luaL_error(L, "lora_multi: expected 1 to %d weights, got %d", ZR_LORA_MULTI_MAX, n);
    int has_b = !lua_isnoneornil(L, 3);
    if (has_b && check_array(L, 3, "biases", b) != n)
        luaL_error(L, "lora_multi: %d weights but %d biases (give one bias per weight, or none)", n,
                   (int)lua_objlen(L, 3));
    luaL_checktype(L, 4, LUA_TTABLE);
    luaL_checktype(L, 5, LUA_TTABLE);
    luaL_checktype(L, 6, LUA_TTABLE);
    for (int i = 0; i < n; i++) {
        A[i] = optional_at(L, 4, i + 1, "A");
        B[i] = optional_at(L, 5, i + 1, "B");
        lua_rawgeti(L, 6, i + 1);
        s[i] = A[i] ? luaL_checknumber(L, -1) : 0.0;
        lua_pop(L, 1);
    }
    double p = luaL_checknumber(L, 7);
    int training = lua_toboolean(L, 8);
    return zr_l_pushtensor(L, zr_lora_multi(x, n, w, has_b ? b : NULL, A, B, s, p, training));
}

static const luaL_Reg methods[] = {{"linear_multi", l_linear_multi}, {"lora_multi", l_lora_multi}, {NULL, NULL}};
static const luaL_Reg functions[] = {{"linear_multi_runs", l_linear_multi_runs}, {NULL, NULL}};

void zr_bind_linear_multi(lua_State *L) {
    zr_l_register_methods(L, methods);
    zr_l_register_functions(L, functions);
}
