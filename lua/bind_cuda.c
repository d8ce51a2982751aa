/* Lua bindings for the CUDA backend: the table zr.cuda with is_available(), device_count(),
 * set_device(n), current_device(), synchronize([n]), empty_cache([n]), device_name(n),
 * memory_summary([n]). Device numbers are CUDA ordinals (0-based, as in "cuda:0"). Present in
 * every build; without CUDA it reports no device. */
#include "bind.h"
#include "cuda/device.h"

static int l_is_available(lua_State *L) {
    lua_pushboolean(L, zr_cuda_is_available());
    return 1;
}
static int l_device_count(lua_State *L) {
    lua_pushinteger(L, zr_cuda_device_count());
    return 1;
}
static int l_unavailable_reason(lua_State *L) {
    lua_pushstring(L, zr_cuda_unavailable_reason());
    return 1;
}
static int l_set_device(lua_State *L) {
    if (zr_cuda_set_device((int)luaL_checkinteger(L, 1))) return zr_l_error(L);
    return 0;
}
static int l_current_device(lua_State *L) {
    lua_pushinteger(L, zr_cuda_current_device());
    return 1;
}
static int l_synchronize(lua_State *L) {
    if (zr_cuda_synchronize((int)luaL_optinteger(L, 1, -1))) return zr_l_error(L);
    return 0;
}
static int l_empty_cache(lua_State *L) {
    zr_cuda_empty_cache((int)luaL_optinteger(L, 1, -1));
    return 0;
}
static int l_device_name(lua_State *L) {
    char name[256];
    int sms = 0;
    int64_t mem = 0;
    if (zr_cuda_device_info((int)luaL_optinteger(L, 1, 0), name, &sms, &mem)) return zr_l_error(L);
    lua_pushstring(L, name);
    lua_pushinteger(L, sms);
    lua_pushnumber(L, (lua_Number)mem);
    return 3;
}

static void setnum(lua_State *L, const char *k, double v) {
    lua_pushnumber(L, v);
    lua_setfield(L, -2, k);
}

/* { device = "cuda:0", categories = { params = {allocated=, peak=}, ... }, allocated, peak,
 *   reserved, cached, peak_reserved, peak_blocks, n_cuda_malloc, n_cuda_free, n_alloc, n_cache_hits,
 *   device_free, device_total, oom_collections }  (bytes; allocated/peak: tensors, as asked;
 *   peak_blocks: the caching allocator's blocks in use at most since the start, rounded, the
 *   cuBLASLt workspace included; oom_collections: full Lua collections run because a device
 *   allocation failed, on any device: zr_mem_collect) */
static int l_memory_summary(lua_State *L) {
    int idx = (int)luaL_optinteger(L, 1, zr_cuda_current_device());
    zr_device dev = {ZR_CUDA, (int8_t)idx};
    if (idx < 0 || idx >= ZR_MAX_DEVICES - 1) luaL_error(L, "memory_summary: bad device %d", idx);
    zr_mem_stats s;
    zr_cuda_mem_stats c;
    zr_mem_get_stats(dev, &s);
    zr_cuda_mem_get_stats(idx, &c);
    char name[16];
    lua_newtable(L);
    lua_pushstring(L, zr_device_name(dev, name));
    lua_setfield(L, -2, "device");
    lua_newtable(L);
    for (int k = 0; k < ZR_MEM_NCATEGORIES; k++) {
        lua_newtable(L);
        setnum(L, "allocated", (double)s.current[k]);
        setnum(L, "peak", (double)s.peak[k]);
        lua_setfield(L, -2, zr_mem_category_name((zr_mem_category)k));
    }
    lua_setfield(L, -2, "categories");
    setnum(L, "allocated", (double)s.total_current);
    setnum(L, "peak", (double)s.total_peak);
    setnum(L, "reserved", (double)c.reserved);
    setnum(L, "cached", (double)c.cached);
    setnum(L, "peak_reserved", (double)c.peak_reserved);
    setnum(L, "peak_blocks", (double)c.peak_allocated);
    setnum(L, "n_cuda_malloc", (double)c.n_cuda_malloc);
    setnum(L, "n_cuda_free", (double)c.n_cuda_free);
    setnum(L, "n_alloc", (double)c.n_alloc);
    setnum(L, "n_cache_hits", (double)c.n_cache_hits);
    setnum(L, "device_free", (double)c.device_free);
    setnum(L, "device_total", (double)c.device_total);
    int64_t host_runs, device_runs;
    zr_mem_collections(&host_runs, &device_runs);
    setnum(L, "oom_collections", (double)device_runs);
    return 1;
}

static const luaL_Reg cuda_fns[] = {
    {"is_available", l_is_available},     {"device_count", l_device_count},
    {"unavailable_reason", l_unavailable_reason}, {"set_device", l_set_device},
    {"current_device", l_current_device}, {"synchronize", l_synchronize},
    {"empty_cache", l_empty_cache},       {"device_name", l_device_name},
    {"memory_summary", l_memory_summary}, {NULL, NULL}};

/* Called by luaopen_zrun_C with the zrun._C table on top of the stack: adds _C.cuda. */
void zr_bind_cuda(lua_State *L) {
    zr_cuda_install();
    int C = lua_gettop(L);
    if (!lua_istable(L, C)) return;
    lua_getfield(L, C, "tensor_methods"); /* make sure the table on top is zrun._C */
    int is_C = lua_isfunction(L, -1);
    lua_pop(L, 1);
    if (!is_C) return;
    lua_newtable(L);
    for (const luaL_Reg *f = cuda_fns; f->name; f++) {
        lua_pushcfunction(L, f->func);
        lua_setfield(L, -2, f->name);
    }
    lua_setfield(L, C, "cuda");
}
