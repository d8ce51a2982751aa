/* Lua bindings for collectives (runtime/zero/comm.h): zr.dist.* wraps these. */
#include <string.h>

#include "bind.h"
#include "zero/comm.h"

static zr_reduce_op check_op(lua_State *L, int idx) {
    const char *s = luaL_optstring(L, idx, "sum");
    if (!strcmp(s, "sum")) return ZR_RED_SUM;
    if (!strcmp(s, "avg") || !strcmp(s, "mean")) return ZR_RED_AVG;
    if (!strcmp(s, "max")) return ZR_RED_MAX;
    if (!strcmp(s, "min")) return ZR_RED_MIN;
    luaL_error(L, "unknown reduce op '%s' (sum, avg, max, min)", s);
    return ZR_RED_SUM;
}

static int l_init(lua_State *L) {
    if (zr_comm_init()) return zr_l_error(L);
    const zr_comm_info *i = zr_comm_get();
    lua_newtable(L);
    lua_pushinteger(L, i->rank);
    lua_setfield(L, -2, "rank");
    lua_pushinteger(L, i->world_size);
    lua_setfield(L, -2, "world_size");
    lua_pushinteger(L, i->local_rank);
    lua_setfield(L, -2, "local_rank");
    lua_pushinteger(L, i->local_size);
    lua_setfield(L, -2, "local_size");
    lua_pushstring(L, i->launcher);
    lua_setfield(L, -2, "launcher");
    return 1;
}
static int l_all_reduce(lua_State *L) {
    if (zr_all_reduce(zr_l_checktensor(L, 1), check_op(L, 2))) return zr_l_error(L);
    lua_settop(L, 1);
    return 1;
}
static int l_reduce_scatter(lua_State *L) {
    if (zr_reduce_scatter(zr_l_checktensor(L, 1), zr_l_checktensor(L, 2), check_op(L, 3))) return zr_l_error(L);
    lua_settop(L, 1);
    return 1;
}
static int l_all_gather(lua_State *L) {
    if (zr_all_gather(zr_l_checktensor(L, 1), zr_l_checktensor(L, 2))) return zr_l_error(L);
    lua_settop(L, 1);
    return 1;
}
static int l_broadcast(lua_State *L) {
    if (zr_broadcast(zr_l_checktensor(L, 1), (int)luaL_optinteger(L, 2, 0))) return zr_l_error(L);
    lua_settop(L, 1);
    return 1;
}
/* Async: a handle userdata with :wait(); collected unwaited, it is waited for then. */
#define HANDLE_MT "zrun.comm_handle"
static int push_handle(lua_State *L, zr_comm_handle *h) {
    if (!h) return zr_l_error(L);
    zr_comm_handle **u = lua_newuserdata(L, sizeof *u);
    *u = h;
    luaL_getmetatable(L, HANDLE_MT);
    lua_setmetatable(L, -2);
    return 1;
}
static int l_handle_wait(lua_State *L) {
    zr_comm_handle **u = luaL_checkudata(L, 1, HANDLE_MT);
    if (!*u) return 0;
    zr_comm_handle *h = *u;
    *u = NULL;
    if (zr_comm_wait(h)) return zr_l_error(L);
    return 0;
}
static int l_handle_gc(lua_State *L) {
    zr_comm_handle **u = luaL_checkudata(L, 1, HANDLE_MT);
    if (*u) zr_comm_wait(*u);
    *u = NULL;
    return 0;
}
static int l_all_reduce_async(lua_State *L) {
    return push_handle(L, zr_all_reduce_async(zr_l_checktensor(L, 1), check_op(L, 2)));
}
static int l_reduce_scatter_async(lua_State *L) {
    return push_handle(L, zr_reduce_scatter_async(zr_l_checktensor(L, 1), zr_l_checktensor(L, 2), check_op(L, 3)));
}
static int l_all_gather_async(lua_State *L) {
    return push_handle(L, zr_all_gather_async(zr_l_checktensor(L, 1), zr_l_checktensor(L, 2)));
}

static int l_barrier(lua_State *L) {
    if (zr_barrier()) return zr_l_error(L);
    return 0;
}
static int l_abort(lua_State *L) {
    zr_comm_abort(luaL_checkstring(L, 1), (int)luaL_optinteger(L, 2, 1));
    return 0;
}
static int l_set_timeout(lua_State *L) {
    zr_comm_set_timeout(luaL_checknumber(L, 1));
    return 0;
}
static int l_timeout(lua_State *L) {
    lua_pushnumber(L, zr_comm_timeout());
    return 1;
}
static int l_set_step(lua_State *L) {
    zr_comm_set_step((int64_t)luaL_checknumber(L, 1));
    return 0;
}
static int l_finalize(lua_State *L) {
    (void)L;
    zr_comm_finalize();
    return 0;
}

static const luaL_Reg fns[] = {{"comm_init", l_init}, {"all_reduce", l_all_reduce},
                               {"reduce_scatter", l_reduce_scatter}, {"all_gather", l_all_gather},
                               {"broadcast", l_broadcast}, {"barrier", l_barrier},
                               {"comm_abort", l_abort}, {"comm_finalize", l_finalize},
                               {"all_reduce_async", l_all_reduce_async},
                               {"reduce_scatter_async", l_reduce_scatter_async},
                               {"all_gather_async", l_all_gather_async},
                               {"comm_set_timeout", l_set_timeout}, {"comm_timeout", l_timeout},
                               {"comm_set_step", l_set_step}, {NULL, NULL}};
void zr_bind_comm(lua_State *L) {
    luaL_newmetatable(L, HANDLE_MT);
    lua_pushcfunction(L, l_handle_gc);
    lua_setfield(L, -2, "__gc");
    lua_newtable(L);
    lua_pushcfunction(L, l_handle_wait);
    lua_setfield(L, -2, "wait");
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);
    zr_l_register_functions(L, fns);
}
