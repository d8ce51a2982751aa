/* Lua bindings for the fused projections (runtime/ops/linear_multi.h):
 *   zr.linear_multi(x, {w1, ..., wn} [, {b1, ..., bn}]) -> y (..., Σ out_i)
 *   zr.linear_multi_runs({w1, ..., wn}) -> GEMMs per direction (1 when the weights are adjacent)
 * (zr.split, whose backward fills one gradient buffer, is bound in bind_layer_ops.c). */
#include "bind.h"
#include "ops/linear_multi.h"

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

static const luaL_Reg methods[] = {{"linear_multi", l_linear_multi}, {NULL, NULL}};
static const luaL_Reg functions[] = {{"linear_multi_runs", l_linear_multi_runs}, {NULL, NULL}};

void zr_bind_linear_multi(lua_State *L) {
    zr_l_register_methods(L, methods);
    zr_l_register_functions(L, functions);
}
