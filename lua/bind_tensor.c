/* The zrun._C module: the Tensor userdata class, creation, properties, views, autograd entry
 * points, memory statistics and the random generator. Op families register themselves through
 * zr_bind_<family> (see bind.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bind.h"
#include "core/autograd.h"
#include "core/random.h"
#include "cuda/device.h" /* zr_device_parse */
#include "ops/view.h"

static int ref_C = LUA_NOREF, ref_methods = LUA_NOREF;

/* ---------- helpers shared by all bindings ---------- */

/* The runtime's message names its file, tensor or option already. A script's own call gets its
 * "script.lua:N:" in front (the line to fix); a call from zrun's library (lua/zrun/) does not: that
 * position would point a user at zrun's source for a mistake in their files or arguments (a truncated
 * .safetensors, an output_dir in the way) and reads as a bug. */
int zr_l_error(lua_State *L) {
    lua_Debug ar;
    if (lua_getstack(L, 1, &ar) && lua_getinfo(L, "S", &ar) && strstr(ar.source, "/lua/zrun/")) {
        lua_pushstring(L, zr_last_error_message());
        return lua_error(L);
    }
    return luaL_error(L, "%s", zr_last_error_message());
}

int zr_l_checkdim(lua_State *L, int idx) {
    int d = (int)luaL_checkinteger(L, idx);
    if (d == 0) luaL_error(L, "bad argument #%d: dims are 1-based in Lua (use 1 for the first, -1 for the last)", idx);
    return d > 0 ? d - 1 : d;
}
int zr_l_optdim(lua_State *L, int idx, int def_c) {
    return lua_isnoneornil(L, idx) ? def_c : zr_l_checkdim(L, idx);
}

int zr_l_checkshape(lua_State *L, int idx, int *ndim, int64_t *shape) {
    int n = 0;
    if (lua_istable(L, idx) && !zr_l_totensor(L, idx) && lua_objlen(L, idx) > 0 ) {
        n = (int)lua_objlen(L, idx);
        if (n > ZR_MAX_DIMS) luaL_error(L, "at most %d dims, got %d", ZR_MAX_DIMS, n);
        for (int i = 0; i < n; i++) {
            lua_rawgeti(L, idx, i + 1);
            if (!lua_isnumber(L, -1)) luaL_error(L, "shape entry %d is not a number", i + 1);
            shape[i] = (int64_t)lua_tonumber(L, -1);
            lua_pop(L, 1);
        }
        *ndim = n;
        return idx + 1;
    }
    if (lua_istable(L, idx) && !zr_l_totensor(L, idx) && lua_objlen(L, idx) == 0 && !lua_isnil(L, idx)) {
        /* {} is a 0-dim shape unless it is an options table (has fields) */
        lua_pushnil(L);
        int has_fields = lua_next(L, idx);
        if (has_fields) lua_pop(L, 2);
        else {
            *ndim = 0;
            return idx + 1;
        }
    }
    while (lua_type(L, idx + n) == LUA_TNUMBER) {
        if (n >= ZR_MAX_DIMS) luaL_error(L, "at most %d dims", ZR_MAX_DIMS);
        shape[n] = (int64_t)lua_tonumber(L, idx + n);
        n++;
    }
    *ndim = n;
    return idx + n;
}

zr_dtype zr_l_checkdtype(lua_State *L, int idx) {
    const char *s = luaL_checkstring(L, idx);
    int d = zr_dtype_parse(s);
    if (d < 0) luaL_error(L, "unknown dtype '%s' (expected f32, bf16, f16, f64, i32, i64 or u8)", s);
    return (zr_dtype)d;
}

double zr_l_numfield(lua_State *L, int idx, const char *key, double def, const char *op) {
    lua_getfield(L, idx, key);
    double v = def;
    if (lua_type(L, -1) == LUA_TNUMBER) v = lua_tonumber(L, -1);
    else if (!lua_isnil(L, -1))
        luaL_error(L, "%s: option '%s' must be a number, got %s", op, key, luaL_typename(L, -1));
    lua_pop(L, 1);
    return v;
}

int zr_l_boolfield(lua_State *L, int idx, const char *key) {
    lua_getfield(L, idx, key);
    int v = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return v;
}

zr_device zr_l_checkdevice(lua_State *L, int idx) {
    const char *s = luaL_checkstring(L, idx);
    zr_device d;
    if (zr_device_parse(s, &d)) luaL_error(L, "unknown device '%s' (expected 'cpu', 'cuda' or 'cuda:N')", s);
    return d;
}

void zr_l_opt_dtype_device(lua_State *L, int idx, zr_dtype *dt, zr_device *dev) {
    if (!lua_istable(L, idx)) return;
    lua_getfield(L, idx, "dtype");
    if (!lua_isnil(L, -1)) *dt = zr_l_checkdtype(L, lua_gettop(L));
    lua_pop(L, 1);
    lua_getfield(L, idx, "device");
    if (!lua_isnil(L, -1)) *dev = zr_l_checkdevice(L, lua_gettop(L));
    lua_pop(L, 1);
}

void zr_l_check_keys(lua_State *L, int idx, const char *who, const char *known) {
    if (!lua_istable(L, idx)) return;
    idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1); /* the value */
        const char *k = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
        int found = 0;
        size_t kl = k ? strlen(k) : 0;
        for (const char *p = known; k && *p && !found;) {
            const char *e = strchr(p, ' ');
            size_t n = e ? (size_t)(e - p) : strlen(p);
            found = n == kl && !strncmp(p, k, n);
            p += n + (e != NULL);
        }
        if (!found) {
            char list[256];
            size_t j = 0;
            for (const char *p = known; *p && j + 3 < sizeof list; p++) {
                if (*p == ' ') list[j++] = ',';
                list[j++] = *p;
            }
            list[j] = 0;
            luaL_error(L, "%s: unknown option '%s'; it takes %s", who, k ? k : luaL_typename(L, -1), list);
        }
    }
}

static void register_into(lua_State *L, int ref, const luaL_Reg *fns) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
    for (; fns->name; fns++) {
        lua_pushcfunction(L, fns->func);
        lua_setfield(L, -2, fns->name);
    }
    lua_pop(L, 1);
}
void zr_l_register_functions(lua_State *L, const luaL_Reg *fns) { register_into(L, ref_C, fns); }

void zr_l_newclass(lua_State *L, const char *name, lua_CFunction gc, const luaL_Reg *methods) {
    luaL_newmetatable(L, name);
    lua_pushcfunction(L, gc);
    lua_setfield(L, -2, "__gc");
    lua_newtable(L);
    for (; methods->name; methods++) {
        lua_pushcfunction(L, methods->func);
        lua_setfield(L, -2, methods->name);
    }
    lua_setfield(L, -2, "__index");
    lua_pop(L, 1);
}
void zr_l_register_methods(lua_State *L, const luaL_Reg *fns) {
    register_into(L, ref_methods, fns);
    register_into(L, ref_C, fns);
}

/* ---------- creation ---------- */

/* Reads requires_grad from an options table. */
static void opt_requires_grad(lua_State *L, int idx, zr_tensor *t) {
    if (!lua_istable(L, idx)) return;
    lua_getfield(L, idx, "requires_grad");
    t->requires_grad = lua_toboolean(L, -1);
    lua_pop(L, 1);
}

typedef enum { C_EMPTY, C_ZEROS, C_ONES, C_RAND, C_RANDN } create_kind;

static int create(lua_State *L, create_kind kind) {
    static const char *names[] = {"zr.empty", "zr.zeros", "zr.ones", "zr.rand", "zr.randn"};
    int ndim;
    int64_t shape[ZR_MAX_DIMS];
    int oi = zr_l_checkshape(L, 1, &ndim, shape);
    zr_l_check_keys(L, oi, names[kind], "dtype device requires_grad");
    zr_dtype dt = ZR_F32;
    zr_device dev = zr_cpu();
    zr_l_opt_dtype_device(L, oi, &dt, &dev);
    zr_tensor *t = kind == C_ZEROS ? zr_tensor_zeros(dt, dev, ndim, shape) : zr_tensor_new(dt, dev, ndim, shape);
    if (!t) return zr_l_error(L);
    zr_status st = ZR_OK;
    if (kind == C_ONES) st = zr_tensor_fill_(t, 1);
    else if (kind == C_RAND) st = zr_tensor_uniform_(t, 0, 1);
    else if (kind == C_RANDN) st = zr_tensor_normal_(t, 0, 1);
    if (st) {
        zr_tensor_release(t);
        return zr_l_error(L);
    }
    opt_requires_grad(L, oi, t);
    return zr_l_pushtensor(L, t);
}
static int l_empty(lua_State *L) { return create(L, C_EMPTY); }
static int l_zeros(lua_State *L) { return create(L, C_ZEROS); }
static int l_ones(lua_State *L) { return create(L, C_ONES); }
static int l_rand(lua_State *L) { return create(L, C_RAND); }
static int l_randn(lua_State *L) { return create(L, C_RANDN); }

static int l_full(lua_State *L) {
    int ndim;
    int64_t shape[ZR_MAX_DIMS];
    luaL_checktype(L, 1, LUA_TTABLE);
    zr_l_checkshape(L, 1, &ndim, shape);
    double v = luaL_checknumber(L, 2);
    zr_dtype dt = ZR_F32;
    zr_device dev = zr_cpu();
    zr_l_check_keys(L, 3, "zr.full", "dtype device requires_grad");
    zr_l_opt_dtype_device(L, 3, &dt, &dev);
    zr_tensor *t = zr_tensor_full(dt, dev, ndim, shape, v);
    if (t) opt_requires_grad(L, 3, t);
    return zr_l_pushtensor(L, t);
}

static int l_arange(lua_State *L) {
    double a = luaL_checknumber(L, 1), b, step = 1;
    int oi;
    if (lua_type(L, 2) == LUA_TNUMBER) {
        b = lua_tonumber(L, 2);
        oi = 3;
        if (lua_type(L, 3) == LUA_TNUMBER) {
            step = lua_tonumber(L, 3);
            oi = 4;
        }
    } else {
        b = a;
        a = 0;
        oi = 2;
    }
    zr_dtype dt = ZR_I64;
    zr_device dev = zr_cpu();
    if (a != (int64_t)a || b != (int64_t)b || step != (int64_t)step) dt = ZR_F32;
    zr_l_check_keys(L, oi, "zr.arange", "dtype device");
    zr_l_opt_dtype_device(L, oi, &dt, &dev);
    return zr_l_pushtensor(L, zr_tensor_arange(a, b, step, dt, dev));
}

/* zr.tensor(nested table or number, {dtype=, device=, requires_grad=}) */
static int nested_shape(lua_State *L, int idx, int depth, int *ndim, int64_t *shape) {
    if (lua_type(L, idx) == LUA_TNUMBER || lua_type(L, idx) == LUA_TBOOLEAN) {
        if (*ndim < 0) *ndim = depth;
        else if (*ndim != depth) luaL_error(L, "tensor: ragged nested table (depth %d vs %d)", depth, *ndim);
        return 0;
    }
    if (!lua_istable(L, idx)) luaL_error(L, "tensor: expected numbers or tables, got %s", luaL_typename(L, idx));
    if (depth >= ZR_MAX_DIMS) luaL_error(L, "tensor: at most %d dims", ZR_MAX_DIMS);
    int64_t n = (int64_t)lua_objlen(L, idx);
    if (*ndim >= 0 && depth >= *ndim) luaL_error(L, "tensor: ragged nested table");
    if (shape[depth] < 0) shape[depth] = n;
    else if (shape[depth] != n)
        luaL_error(L, "tensor: ragged nested table: dim %d has lengths %d and %d", depth + 1,
                   (int)shape[depth], (int)n);
    if (n == 0) {
        if (*ndim < 0) *ndim = depth + 1;
        return 0;
    }
    for (int64_t i = 1; i <= n; i++) {
        lua_rawgeti(L, idx, (int)i);
        nested_shape(L, lua_gettop(L), depth + 1, ndim, shape);
        lua_pop(L, 1);
    }
    return 0;
}
static void nested_fill(lua_State *L, int idx, double **out) {
    if (lua_type(L, idx) == LUA_TNUMBER) {
        *(*out)++ = lua_tonumber(L, idx);
        return;
    }
    if (lua_type(L, idx) == LUA_TBOOLEAN) {
        *(*out)++ = lua_toboolean(L, idx);
        return;
    }
    int n = (int)lua_objlen(L, idx);
    for (int i = 1; i <= n; i++) {
        lua_rawgeti(L, idx, i);
        nested_fill(L, lua_gettop(L), out);
        lua_pop(L, 1);
    }
}
static int l_tensor(lua_State *L) {
    int ndim = -1;
    int64_t shape[ZR_MAX_DIMS];
    for (int i = 0; i < ZR_MAX_DIMS; i++) shape[i] = -1;
    nested_shape(L, 1, 0, &ndim, shape);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    zr_tensor *h = zr_tensor_new(ZR_F64, zr_cpu(), ndim, shape);
    if (!h) return zr_l_error(L);
    double *p = zr_tensor_data(h);
    nested_fill(L, 1, &p);
    zr_dtype dt = ZR_F32;
    zr_device dev = zr_cpu();
    zr_l_check_keys(L, 2, "zr.tensor", "dtype device requires_grad");
    zr_l_opt_dtype_device(L, 2, &dt, &dev);
    zr_tensor *t = zr_tensor_new(dt, dev, ndim, shape);
    if (t && zr_tensor_copy_(t, h)) {
        zr_tensor_release(t);
        t = NULL;
    }
    zr_tensor_release(h);
    if (t) opt_requires_grad(L, 2, t);
    (void)n;
    return zr_l_pushtensor(L, t);
}

/* ---------- properties ---------- */


static int l_shape(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    lua_createtable(L, t->ndim, 0);
    for (int i = 0; i < t->ndim; i++) {
        lua_pushnumber(L, (lua_Number)t->shape[i]);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}
static int l_size(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    if (lua_isnoneornil(L, 2)) return l_shape(L);
    int d = zr_dim_norm(zr_l_checkdim(L, 2), t->ndim, "size");
    if (d < 0) return zr_l_error(L);
    lua_pushnumber(L, (lua_Number)t->shape[d]);
    return 1;
}
static int l_stride(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    lua_createtable(L, t->ndim, 0);
    for (int i = 0; i < t->ndim; i++) {
        lua_pushnumber(L, (lua_Number)t->stride[i]);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}
static int l_dim(lua_State *L) {
    lua_pushinteger(L, zr_l_checktensor(L, 1)->ndim);
    return 1;
}
static int l_numel(lua_State *L) {
    lua_pushnumber(L, (lua_Number)zr_tensor_numel(zr_l_checktensor(L, 1)));
    return 1;
}
static int l_is_contiguous(lua_State *L) {
    lua_pushboolean(L, zr_tensor_is_contiguous(zr_l_checktensor(L, 1)));
    return 1;
}
static int l_dtype(lua_State *L) {
    lua_pushstring(L, zr_dtype_name(zr_l_checktensor(L, 1)->dtype));
    return 1;
}
static int l_device(lua_State *L) {
    char b[16];
    lua_pushstring(L, zr_device_name(zr_l_checktensor(L, 1)->storage->device, b));
    return 1;
}
static int l_category(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    if (!lua_isnoneornil(L, 2)) {
        const char *s = luaL_checkstring(L, 2);
        int c = zr_mem_category_parse(s);
        if (c < 0) luaL_error(L, "unknown memory category '%s' (params, grads, optimizer, activations, comm, workspace, other)", s);
        zr_storage_set_category(t->storage, (zr_mem_category)c);
    }
    lua_pushstring(L, zr_mem_category_name(t->storage->category));
    return 1;
}
static int l_item(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    int64_t n = zr_tensor_numel(t);
    if (n != 1) luaL_error(L, "item: tensor has %d elements, expected 1", (int)n);
    double v;
    if (zr_tensor_get(t, 0, &v)) return zr_l_error(L);
    lua_pushnumber(L, v);
    return 1;
}
/* Flat logical-order element access (1-based), for tests and printing. */
static int l_get_flat(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    double v;
    if (zr_tensor_get(t, (int64_t)luaL_checknumber(L, 2) - 1, &v)) return zr_l_error(L);
    lua_pushnumber(L, v);
    return 1;
}
static int l_set_flat(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    if (zr_tensor_set(t, (int64_t)luaL_checknumber(L, 2) - 1, luaL_checknumber(L, 3))) return zr_l_error(L);
    return 0;
}
/* All elements as a flat Lua array (row-major). */
static int l_flat_table(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    double *d = zr_tensor_to_doubles(t);
    if (!d) return zr_l_error(L);
    int64_t n = zr_tensor_numel(t);
    lua_createtable(L, (int)n, 0);
    for (int64_t i = 0; i < n; i++) {
        lua_pushnumber(L, d[i]);
        lua_rawseti(L, -2, (int)(i + 1));
    }
    free(d);
    return 1;
}

/* ---------- autograd ---------- */

static int l_backward(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    zr_tensor *g = lua_isnoneornil(L, 2) ? NULL : zr_l_checktensor(L, 2);
    int retain = lua_toboolean(L, 3);
    if (zr_backward(t, g, retain)) return zr_l_error(L);
    return 0;
}
static int l_set_grad_enabled(lua_State *L) {
    lua_pushboolean(L, zr_set_grad_enabled(lua_toboolean(L, 1)));
    return 1;
}
static int l_is_grad_enabled(lua_State *L) {
    lua_pushboolean(L, zr_grad_enabled());
    return 1;
}
/* set_loss_grad_hint(g | nil) -> the previous hint (zr_set_loss_grad_hint; nil: the default 1) */
static int l_set_loss_grad_hint(lua_State *L) {
    double g = lua_isnoneornil(L, 1) ? 1.0 : luaL_checknumber(L, 1);
    if (!(g != 0 && fabs(g) < 3e38))
        return luaL_error(L, "set_loss_grad_hint: the hint must be a finite non-zero number (the seed the "
                             "next backward brings), got %f; pass nil for the default 1", g);
    lua_pushnumber(L, zr_set_loss_grad_hint(g));
    return 1;
}
/* autograd_profile(on): time every backward node by op; autograd_profile_report() -> text */
static int l_autograd_profile(lua_State *L) {
    zr_autograd_profile(lua_isnumber(L, 1) ? (int)lua_tointeger(L, 1) : lua_toboolean(L, 1));
    return 0;
}
/* autograd_profile_mark(name, device): the time since the previous forward op goes to `name` */
static int l_autograd_profile_mark(lua_State *L) {
    zr_autograd_profile_mark(luaL_checkstring(L, 1), zr_l_checkdevice(L, 2));
    return 0;
}
static int l_memory_trace(lua_State *L) {
    zr_autograd_mem_trace(lua_toboolean(L, 1));
    return 0;
}
static int l_autograd_profile_report(lua_State *L) {
    char buf[8192];
    zr_autograd_profile_report(buf, sizeof buf);
    lua_pushstring(L, buf);
    return 1;
}
static int l_detach(lua_State *L) { return zr_l_pushtensor(L, zr_tensor_detach(zr_l_checktensor(L, 1))); }
/* p:set_data(q): p takes q's data and keeps its identity (torch's p.data = q). Returns p. */
static int l_set_data(lua_State *L) {
    if (zr_tensor_set_data(zr_l_checktensor(L, 1), zr_l_checktensor(L, 2))) return zr_l_error(L);
    lua_settop(L, 1);
    return 1;
}
static int l_requires_grad_(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    int on = lua_isnoneornil(L, 2) ? 1 : lua_toboolean(L, 2);
    if (t->grad_fn && !on) luaL_error(L, "requires_grad_(false) is only allowed on leaf tensors; use detach()");
    if (on && !zr_dtype_is_float(t->dtype)) luaL_error(L, "only floating-point tensors can require grad, got %s", zr_dtype_name(t->dtype));
    t->requires_grad = on;
    lua_settop(L, 1);
    return 1;
}

/* ---------- fills and copies ---------- */

static int l_fill_(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    if (zr_tensor_fill_(t, luaL_checknumber(L, 2))) return zr_l_error(L);
    lua_settop(L, 1);
    return 1;
}
static int l_zero_(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    if (zr_tensor_fill_(t, 0)) return zr_l_error(L);
    lua_settop(L, 1);
    return 1;
}
static int l_copy_(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    if (zr_tensor_copy_(t, zr_l_checktensor(L, 2))) return zr_l_error(L);
    lua_settop(L, 1);
    return 1;
}
static int l_uniform_(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    if (zr_tensor_uniform_(t, luaL_optnumber(L, 2, 0), luaL_optnumber(L, 3, 1))) return zr_l_error(L);
    lua_settop(L, 1);
    return 1;
}
static int l_normal_(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    if (zr_tensor_normal_(t, luaL_optnumber(L, 2, 0), luaL_optnumber(L, 3, 1))) return zr_l_error(L);
    lua_settop(L, 1);
    return 1;
}

/* ---------- views and movement ---------- */

static int l_view(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    int nd;
    int64_t sh[ZR_MAX_DIMS];
    zr_l_checkshape(L, 2, &nd, sh);
    return zr_l_pushtensor(L, zr_view(t, nd, sh));
}
static int l_reshape(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    int nd;
    int64_t sh[ZR_MAX_DIMS];
    zr_l_checkshape(L, 2, &nd, sh);
    return zr_l_pushtensor(L, zr_reshape(t, nd, sh));
}
static int l_expand(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    int nd;
    int64_t sh[ZR_MAX_DIMS];
    zr_l_checkshape(L, 2, &nd, sh);
    return zr_l_pushtensor(L, zr_expand(t, nd, sh));
}
static int l_transpose(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    int d0 = zr_l_optdim(L, 2, 0), d1 = zr_l_optdim(L, 3, 1);
    return zr_l_pushtensor(L, zr_transpose(t, d0, d1));
}
static int l_permute(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    int perm[ZR_MAX_DIMS], n = 0;
    if (lua_istable(L, 2)) {
        n = (int)lua_objlen(L, 2);
        for (int i = 0; i < n && i < ZR_MAX_DIMS; i++) {
            lua_rawgeti(L, 2, i + 1);
            perm[i] = zr_l_checkdim(L, lua_gettop(L));
            lua_pop(L, 1);
        }
    } else
        for (n = 0; lua_type(L, 2 + n) == LUA_TNUMBER && n < ZR_MAX_DIMS; n++) perm[n] = zr_l_checkdim(L, 2 + n);
    if (n != t->ndim) luaL_error(L, "permute: expected %d dims, got %d", t->ndim, n);
    return zr_l_pushtensor(L, zr_permute(t, perm));
}
static int l_narrow(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    int d = zr_l_checkdim(L, 2);
    int64_t start = (int64_t)luaL_checknumber(L, 3), len = (int64_t)luaL_checknumber(L, 4);
    return zr_l_pushtensor(L, zr_narrow(t, d, start - 1, len));
}
static int l_select(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    int d = zr_l_checkdim(L, 2);
    int64_t i = (int64_t)luaL_checknumber(L, 3);
    return zr_l_pushtensor(L, zr_select(t, d, i > 0 ? i - 1 : i));
}
static int l_unsqueeze(lua_State *L) {
    return zr_l_pushtensor(L, zr_unsqueeze(zr_l_checktensor(L, 1), zr_l_checkdim(L, 2)));
}
static int l_squeeze(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    return zr_l_pushtensor(L, zr_squeeze(t, lua_isnoneornil(L, 2) ? ZR_ALL_DIMS : zr_l_checkdim(L, 2)));
}
static int l_contiguous(lua_State *L) { return zr_l_pushtensor(L, zr_contiguous(zr_l_checktensor(L, 1))); }
static int l_clone(lua_State *L) { return zr_l_pushtensor(L, zr_clone(zr_l_checktensor(L, 1))); }
/* t:to("bf16") / t:to("cuda:0") / t:to{dtype=, device=} / t:to("cuda", "bf16") */
static int l_to(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    zr_dtype dt = t->dtype;
    zr_device dev = t->storage->device;
    for (int i = 2; i <= lua_gettop(L); i++) {
        if (lua_istable(L, i)) {
            zr_l_check_keys(L, i, "t:to", "dtype device");
            zr_l_opt_dtype_device(L, i, &dt, &dev);
        }
        else if (lua_isstring(L, i)) {
            const char *s = lua_tostring(L, i);
            int d = zr_dtype_parse(s);
            if (d >= 0) dt = (zr_dtype)d;
            else if (zr_device_parse(s, &dev))
                luaL_error(L, "to: '%s' is neither a dtype (f32, bf16, ...) nor a device (cpu, cuda:N)", s);
        }
    }
    return zr_l_pushtensor(L, zr_to(t, dt, dev));
}

/* t[i] (1-based along dim 1): a number for 1-dim tensors, else a view; t.grad etc. */
static int l_index(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    if (lua_type(L, 2) == LUA_TNUMBER) {
        int64_t i = (int64_t)lua_tonumber(L, 2);
        if (t->ndim == 0) luaL_error(L, "cannot index a 0-dim tensor; use :item()");
        if (i == 0 || i > t->shape[0] || i < -t->shape[0])
            luaL_error(L, "index %d is out of range for dim 1 of size %d (indices are 1-based)",
                       (int)i, (int)t->shape[0]);
        int64_t c = i > 0 ? i - 1 : i + t->shape[0];
        if (t->ndim == 1) {
            double v;
            if (zr_tensor_get(t, c, &v)) return zr_l_error(L);
            lua_pushnumber(L, v);
            return 1;
        }
        return zr_l_pushtensor(L, zr_select(t, 0, c));
    }
    const char *k = luaL_checkstring(L, 2);
    if (strcmp(k, "grad") == 0) {
        if (!t->grad) {
            lua_pushnil(L);
            return 1;
        }
        if (t->grad_stale) { /* the engine's zero_grad left stale values: they read as zeros */
            if (zr_tensor_fill_(t->grad, 0)) return zr_l_error(L);
            t->grad_stale = 0;
        }
        return zr_l_pushtensor(L, zr_tensor_retain(t->grad));
    }
    if (strcmp(k, "requires_grad") == 0) {
        lua_pushboolean(L, zr_tensor_needs_grad(t));
        return 1;
    }
    if (strcmp(k, "is_leaf") == 0) {
        lua_pushboolean(L, t->grad_fn == NULL);
        return 1;
    }
    if (strcmp(k, "grad_fn") == 0) {
        if (t->grad_fn) lua_pushstring(L, t->grad_fn->name);
        else lua_pushnil(L);
        return 1;
    }
    if (strcmp(k, "ndim") == 0) return l_dim(L);
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref_methods);
    lua_getfield(L, -1, k);
    return 1;
}

static int l_newindex(lua_State *L) {
    zr_tensor *t = zr_l_checktensor(L, 1);
    if (lua_type(L, 2) == LUA_TNUMBER) {
        int64_t i = (int64_t)lua_tonumber(L, 2);
        if (t->ndim == 0 || i == 0 || i > t->shape[0] || i < -t->shape[0])
            luaL_error(L, "index %d is out of range (indices are 1-based)", (int)i);
        int64_t c = i > 0 ? i - 1 : i + t->shape[0];
        zr_tensor *row = zr_tensor_narrow_raw(t, 0, c, 1);
        if (!row) return zr_l_error(L);
        zr_status st;
        zr_tensor *src = zr_l_totensor(L, 3);
        if (src) {
            zr_tensor *v = zr_tensor_detach(src);
            int64_t sh[ZR_MAX_DIMS];
            sh[0] = 1;
            memcpy(sh + 1, row->shape + 1, sizeof(int64_t) * (size_t)(row->ndim - 1));
            zr_tensor *e = v ? zr_tensor_expand_raw(v, row->ndim, row->shape) : NULL;
            if (!e && v && zr_tensor_numel(v) == zr_tensor_numel(row)) { /* (C) into (1,C) */
                zr_tensor *c2 = zr_tensor_contiguous_raw(v);
                e = c2 ? zr_tensor_view_raw(c2, row->ndim, row->shape) : NULL;
                zr_tensor_release(c2);
            }
            st = e ? zr_tensor_copy_(row, e) : ZR_ERR;
            zr_tensor_release(e);
            zr_tensor_release(v);
        } else
            st = zr_tensor_fill_(row, luaL_checknumber(L, 3));
        zr_tensor_release(row);
        if (st) return zr_l_error(L);
        return 0;
    }
    const char *k = luaL_checkstring(L, 2);
    if (strcmp(k, "requires_grad") == 0) {
        const int on = lua_toboolean(L, 3); /* read before the stack is cut to (t, on) */
        lua_settop(L, 1);
        lua_pushboolean(L, on);
        return l_requires_grad_(L);
    }
    if (strcmp(k, "grad") == 0) {
        zr_tensor *g = lua_isnil(L, 3) ? NULL : zr_l_checktensor(L, 3);
        if (g) zr_tensor_retain(g);
        zr_tensor_release(t->grad);
        t->grad = g;
        return 0;
    }
    return luaL_error(L, "cannot set field '%s' of a tensor", k);
}

static int l_eq(lua_State *L) {
    lua_pushboolean(L, zr_l_totensor(L, 1) == zr_l_totensor(L, 2));
    return 1;
}

/* ---------- memory and random ---------- */

static int l_memory_stats(lua_State *L) {
    zr_device dev = lua_isnoneornil(L, 1) ? zr_cpu() : zr_l_checkdevice(L, 1);
    zr_mem_stats s;
    zr_mem_get_stats(dev, &s);
    lua_newtable(L);
    for (int c = 0; c < ZR_MEM_NCATEGORIES; c++) {
        lua_newtable(L);
        lua_pushnumber(L, (lua_Number)s.current[c]);
        lua_setfield(L, -2, "current");
        lua_pushnumber(L, (lua_Number)s.peak[c]);
        lua_setfield(L, -2, "peak");
        lua_pushnumber(L, (lua_Number)s.at_peak[c]);
        lua_setfield(L, -2, "at_peak");
        lua_setfield(L, -2, zr_mem_category_name((zr_mem_category)c));
    }
    lua_pushnumber(L, (lua_Number)s.total_current);
    lua_setfield(L, -2, "total_current");
    lua_pushnumber(L, (lua_Number)s.total_peak);
    lua_setfield(L, -2, "total_peak");
    lua_pushnumber(L, (lua_Number)s.n_allocs);
    lua_setfield(L, -2, "n_allocs");
    int64_t host_runs, device_runs;
    zr_mem_collections(&host_runs, &device_runs);
    lua_pushnumber(L, (lua_Number)(dev.type == ZR_CPU ? host_runs : device_runs));
    lua_setfield(L, -2, "collections");
    if (dev.type == ZR_CPU) {
        lua_pushnumber(L, (lua_Number)zr_mem_host_kept());
        lua_setfield(L, -2, "host_kept");
    }
    return 1;
}
static int l_memory_reset_peak(lua_State *L) {
    zr_mem_reset_peak(lua_isnoneornil(L, 1) ? zr_cpu() : zr_l_checkdevice(L, 1));
    return 0;
}
static int l_set_default_category(lua_State *L) {
    const char *s = luaL_checkstring(L, 1);
    int c = zr_mem_category_parse(s);
    if (c < 0) luaL_error(L, "unknown memory category '%s'", s);
    lua_pushstring(L, zr_mem_category_name(zr_mem_set_default_category((zr_mem_category)c)));
    return 1;
}
static int l_manual_seed(lua_State *L) {
    zr_manual_seed((uint64_t)luaL_checknumber(L, 1));
    return 0;
}
static int l_random_state(lua_State *L) {
    if (!lua_isnoneornil(L, 1)) {
        zr_random_set_state((uint64_t)luaL_checknumber(L, 1), (uint64_t)luaL_checknumber(L, 2));
        return 0;
    }
    uint64_t s, o;
    zr_random_get_state(&s, &o);
    lua_pushnumber(L, (lua_Number)s);
    lua_pushnumber(L, (lua_Number)o);
    return 2;
}
/* An i64 tensor of 1..n (1-based for Lua) in the order perm(n, seed) writes 0..n-1. */
static int push_perm(lua_State *L, int64_t n, uint64_t seed, void (*perm)(int64_t, uint64_t, int64_t *)) {
    zr_tensor *t = zr_tensor_new(ZR_I64, zr_cpu(), 1, &n);
    if (!t) return zr_l_error(L);
    int64_t *p = zr_tensor_data(t);
    perm(n, seed, p);
    for (int64_t i = 0; i < n; i++) p[i] += 1;
    return zr_l_pushtensor(L, t);
}
/* randperm(n [, seed]) -> i64 tensor of 1..n in random order (1-based for Lua). */
static int l_randperm(lua_State *L) {
    int64_t n = (int64_t)luaL_checknumber(L, 1);
    if (n < 0) luaL_error(L, "randperm: n must be >= 0");
    uint64_t seed;
    if (lua_isnoneornil(L, 2)) seed = zr_random_reserve(1) * 0x9E3779B97F4A7C15ull + 1;
    else seed = (uint64_t)luaL_checknumber(L, 2);
    return push_perm(L, n, seed, zr_randperm);
}
/* n and a seed that must be a non-negative integer (randperm_torch, randperm_numpy: the libraries' seeds). */
static int64_t perm_args(lua_State *L, const char *name, uint64_t *seed) {
    int64_t n = (int64_t)luaL_checknumber(L, 1);
    lua_Number s = luaL_checknumber(L, 2);
    if (n < 0) luaL_error(L, "%s: n must be >= 0", name);
    if (s < 0 || s != (lua_Number)(int64_t)s) luaL_error(L, "%s: seed must be a non-negative integer", name);
    *seed = (uint64_t)s;
    return n;
}
/* randperm_torch(n, seed) -> i64 tensor of 1..n in torch.randperm(n, torch.Generator().manual_seed(seed))'s
 * order (1-based for Lua). */
static int l_randperm_torch(lua_State *L) {
    uint64_t seed;
    int64_t n = perm_args(L, "randperm_torch", &seed);
    return push_perm(L, n, seed, zr_randperm_torch);
}
/* randperm_numpy(n, seed) -> i64 tensor of 1..n in numpy.random.default_rng(seed).permutation(n)'s order
 * (1-based for Lua): Hugging Face datasets' shuffle(seed=). */
static int l_randperm_numpy(lua_State *L) {
    uint64_t seed;
    int64_t n = perm_args(L, "randperm_numpy", &seed);
    return push_perm(L, n, seed, zr_randperm_numpy);
}
static int l_is_tensor(lua_State *L) {
    lua_pushboolean(L, zr_l_totensor(L, 1) != NULL);
    return 1;
}
static int l_metatable(lua_State *L) {
    luaL_getmetatable(L, ZR_TENSOR_MT);
    return 1;
}
static int l_methods(lua_State *L) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref_methods);
    return 1;
}

static const luaL_Reg functions[] = {
    {"empty", l_empty}, {"zeros", l_zeros}, {"ones", l_ones}, {"full", l_full}, {"rand", l_rand},
    {"randn", l_randn}, {"arange", l_arange}, {"tensor", l_tensor}, {"set_grad_enabled", l_set_grad_enabled},
    {"is_grad_enabled", l_is_grad_enabled}, {"set_loss_grad_hint", l_set_loss_grad_hint},
    {"autograd_profile", l_autograd_profile}, {"autograd_profile_report", l_autograd_profile_report},
    {"autograd_profile_mark", l_autograd_profile_mark},
    {"memory_trace", l_memory_trace}, {"memory_stats", l_memory_stats},
    {"memory_reset_peak", l_memory_reset_peak}, {"set_default_category", l_set_default_category},
    {"manual_seed", l_manual_seed}, {"randperm", l_randperm}, {"randperm_torch", l_randperm_torch},
    {"randperm_numpy", l_randperm_numpy}, {"random_state", l_random_state}, {"is_tensor", l_is_tensor},
    {"tensor_metatable", l_metatable}, {"tensor_methods", l_methods}, {NULL, NULL}};

static const luaL_Reg methods[] = {
    {"shape", l_shape}, {"size", l_size}, {"stride", l_stride}, {"dim", l_dim}, {"numel", l_numel},
    {"is_contiguous", l_is_contiguous}, {"dtype", l_dtype}, {"device", l_device},
    {"category", l_category}, {"item", l_item}, {"get_flat", l_get_flat}, {"set_flat", l_set_flat},
    {"flat_table", l_flat_table}, {"backward", l_backward}, {"detach", l_detach},
    {"set_data", l_set_data}, {"requires_grad_", l_requires_grad_}, {"fill_", l_fill_}, {"zero_", l_zero_}, {"copy_", l_copy_},
    {"uniform_", l_uniform_}, {"normal_", l_normal_}, {"view", l_view}, {"reshape", l_reshape},
    {"expand", l_expand}, {"transpose", l_transpose}, {"permute", l_permute}, {"narrow", l_narrow},
    {"select", l_select}, {"unsqueeze", l_unsqueeze}, {"squeeze", l_squeeze},
    {"contiguous", l_contiguous}, {"clone", l_clone}, {"to", l_to}, {NULL, NULL}};

#define CALL_FAMILY(f)                                                                             \
    if (f) f(L)
extern void zr_bind_ops(lua_State *L) __attribute__((weak));
extern void zr_bind_nn_ops(lua_State *L) __attribute__((weak));
extern void zr_bind_layer_ops(lua_State *L) __attribute__((weak));
extern void zr_bind_tokenizer(lua_State *L) __attribute__((weak));
extern void zr_bind_io(lua_State *L) __attribute__((weak));
extern void zr_bind_cuda(lua_State *L) __attribute__((weak));
extern void zr_bind_optim(lua_State *L) __attribute__((weak));
extern void zr_bind_repl(lua_State *L) __attribute__((weak));
extern void zr_bind_system(lua_State *L) __attribute__((weak));
extern void zr_bind_handle(lua_State *L) __attribute__((weak));
extern void zr_bind_checkpoint(lua_State *L) __attribute__((weak));
extern void zr_bind_zero(lua_State *L) __attribute__((weak));
extern void zr_bind_comm(lua_State *L) __attribute__((weak));
extern void zr_bind_linear_multi(lua_State *L) __attribute__((weak));

int luaopen_zrun_C(lua_State *L) {
    lua_newtable(L); /* _C */
    lua_pushvalue(L, -1);
    ref_C = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_newtable(L);
    ref_methods = luaL_ref(L, LUA_REGISTRYINDEX);
    luaL_newmetatable(L, ZR_TENSOR_MT);
    lua_pushcfunction(L, zr_l_tensor_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, l_index);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_newindex);
    lua_setfield(L, -2, "__newindex");
    lua_pushcfunction(L, l_eq);
    lua_setfield(L, -2, "__eq");
    lua_pop(L, 1);
    zr_l_register_functions(L, functions);
    zr_l_register_methods(L, methods);
    CALL_FAMILY(zr_bind_ops);
    CALL_FAMILY(zr_bind_nn_ops);
    CALL_FAMILY(zr_bind_layer_ops);
    CALL_FAMILY(zr_bind_tokenizer);
    CALL_FAMILY(zr_bind_io);
    CALL_FAMILY(zr_bind_cuda);
    CALL_FAMILY(zr_bind_optim);
    CALL_FAMILY(zr_bind_repl);
    CALL_FAMILY(zr_bind_system);
    CALL_FAMILY(zr_bind_checkpoint);
    CALL_FAMILY(zr_bind_zero);
    CALL_FAMILY(zr_bind_comm);
    CALL_FAMILY(zr_bind_linear_multi);
    CALL_FAMILY(zr_bind_handle);
    return 1;
}
