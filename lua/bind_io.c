/* Lua bindings for file I/O: safetensors load/save/info, an open-file handle for loading tensors
 * one at a time, and the few file-system helpers lua/zrun/hf.lua needs (path_type, listdir,
 * makedirs, write_file_atomic, setenv). No policy here: HF directory logic lives in hf.lua. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bind.h"
#include "io/safetensors.h"
#include "io/safetensors_load.h"

#define ST_FILE_MT "zr.SafetensorsFile"

/* opts: {dtype=, device=} at idx; dtype -1 means "as stored". */
static void opt_load(lua_State *L, int idx, int *dt, zr_device *dev, const char *who, const char *known) {
    *dt = -1;
    *dev = zr_cpu();
    if (!lua_istable(L, idx)) return;
    zr_l_check_keys(L, idx, who, known);
    lua_getfield(L, idx, "dtype");
    if (!lua_isnil(L, -1)) *dt = (int)zr_l_checkdtype(L, lua_gettop(L));
    lua_pop(L, 1);
    lua_getfield(L, idx, "device");
    if (!lua_isnil(L, -1)) *dev = zr_l_checkdevice(L, lua_gettop(L));
    lua_pop(L, 1);
}

static void push_metadata(lua_State *L, const zr_safetensors *f) {
    lua_createtable(L, 0, (int)zr_safetensors_metadata_count(f));
    for (int64_t i = 0; i < zr_safetensors_metadata_count(f); i++) {
        lua_pushstring(L, zr_safetensors_metadata_value(f, i));
        lua_setfield(L, -2, zr_safetensors_metadata_key(f, i));
    }
}

static void push_entry_info(lua_State *L, const zr_safetensors_entry *e) {
    lua_createtable(L, 0, 5);
    lua_pushstring(L, zr_dtype_name(e->dtype));
    lua_setfield(L, -2, "dtype");
    lua_pushstring(L, zr_st_dtype_name(e->st_dtype));
    lua_setfield(L, -2, "stored");
    lua_createtable(L, e->ndim, 0);
    for (int d = 0; d < e->ndim; d++) {
        lua_pushnumber(L, (lua_Number)e->shape[d]);
        lua_rawseti(L, -2, d + 1);
    }
    lua_setfield(L, -2, "shape");
    lua_pushnumber(L, (lua_Number)e->numel);
    lua_setfield(L, -2, "numel");
    lua_pushnumber(L, (lua_Number)(e->end - e->begin));
    lua_setfield(L, -2, "nbytes");
}

/* Loads the tensors of f into a new table at the top of the stack; names_idx (0 = all) is a
 * list of names to load, each of which must exist. */
static void load_into_table(lua_State *L, zr_safetensors *f, int names_idx, int dt, zr_device dev) {
    if (names_idx) {
        int n = (int)lua_objlen(L, names_idx);
        lua_createtable(L, 0, n);
        for (int i = 1; i <= n; i++) {
            lua_rawgeti(L, names_idx, i);
            const char *name = lua_tostring(L, -1);
            if (!name) luaL_error(L, "load_safetensors: names[%d] is not a string", i);
            zr_tensor *t = zr_safetensors_get(f, name, dt, dev);
            if (!t) zr_l_error(L);
            zr_l_pushtensor(L, t);
            lua_settable(L, -3); /* pops name and tensor */
        }
        return;
    }
    int64_t n = zr_safetensors_count(f);
    lua_createtable(L, 0, (int)n);
    for (int64_t i = 0; i < n; i++) {
        const zr_safetensors_entry *e = zr_safetensors_entry_at(f, i);
        zr_tensor *t = zr_safetensors_get_entry(f, e, dt, dev);
        if (!t) zr_l_error(L);
        zr_l_pushtensor(L, t);
        lua_setfield(L, -2, e->name);
    }
}

/* ---------- the file handle (box created before the resource: __gc is always safe) ---------- */

static zr_safetensors **check_file(lua_State *L, int idx) {
    zr_safetensors **p = luaL_checkudata(L, idx, ST_FILE_MT);
    if (!*p) luaL_error(L, "safetensors file is closed");
    return p;
}
static int f_gc(lua_State *L) {
    zr_safetensors **p = luaL_checkudata(L, 1, ST_FILE_MT);
    zr_safetensors_close(*p);
    *p = NULL;
    return 0;
}
/* An empty file handle on the stack (its __gc is safe before the file is opened into it). */
static zr_safetensors **new_file_box(lua_State *L) {
    zr_safetensors **p = lua_newuserdata(L, sizeof *p);
    *p = NULL;
    luaL_getmetatable(L, ST_FILE_MT);
    lua_setmetatable(L, -2);
    return p;
}
static int l_safetensors_open(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    zr_safetensors **p = new_file_box(L);
    if (!(*p = zr_safetensors_open(path))) return zr_l_error(L);
    return 1;
}
/* zr.safetensors_open_view(path, {{name=, stored="BF16", shape={...}, offset=bytes}, ...}) -> an open
 * file (the safetensors handle) over tensors stored raw at those byte offsets (io/safetensors.h). */
static int l_safetensors_open_view(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    int n = (int)lua_objlen(L, 2);
    zr_safetensors_view_entry *v = lua_newuserdata(L, ((size_t)n + 1) * sizeof *v);
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, 2, i + 1);
        int t = lua_gettop(L);
        if (!lua_istable(L, t)) luaL_error(L, "safetensors_open_view: entry %d is not a table", i + 1);
        lua_getfield(L, t, "name");
        lua_getfield(L, t, "stored");
        lua_getfield(L, t, "offset");
        lua_getfield(L, t, "shape");
        v[i].name = luaL_checkstring(L, t + 1); /* kept alive by the argument table */
        const char *st = luaL_checkstring(L, t + 2);
        v[i].st_dtype = ZR_ST_NDTYPES;
        for (int k = 0; k < ZR_ST_NDTYPES; k++)
            if (strcmp(st, zr_st_dtype_name((zr_st_dtype)k)) == 0) v[i].st_dtype = (zr_st_dtype)k;
        if (v[i].st_dtype == ZR_ST_NDTYPES) luaL_error(L, "safetensors_open_view: unknown stored dtype '%s'", st);
        v[i].offset = (int64_t)luaL_checknumber(L, t + 3);
        luaL_checktype(L, t + 4, LUA_TTABLE);
        v[i].ndim = (int)lua_objlen(L, t + 4);
        if (v[i].ndim > ZR_MAX_DIMS) luaL_error(L, "safetensors_open_view: '%s' has %d dimensions, at most %d", v[i].name, v[i].ndim, ZR_MAX_DIMS);
        for (int d = 0; d < v[i].ndim; d++) {
            lua_rawgeti(L, t + 4, d + 1);
            v[i].shape[d] = (int64_t)luaL_checknumber(L, -1);
            lua_pop(L, 1);
        }
        lua_settop(L, t - 1);
    }
    zr_safetensors **p = new_file_box(L);
    if (!(*p = zr_safetensors_open_view(path, v, n))) return zr_l_error(L);
    return 1;
}
static int f_keys(lua_State *L) {
    zr_safetensors *f = *check_file(L, 1);
    int64_t n = zr_safetensors_count(f);
    lua_createtable(L, (int)n, 0);
    for (int64_t i = 0; i < n; i++) {
        lua_pushstring(L, zr_safetensors_entry_at(f, i)->name);
        lua_rawseti(L, -2, (int)i + 1);
    }
    return 1;
}
static int f_info(lua_State *L) {
    zr_safetensors *f = *check_file(L, 1);
    if (!lua_isnoneornil(L, 2)) {
        const zr_safetensors_entry *e = zr_safetensors_find(f, luaL_checkstring(L, 2));
        if (!e) return 0;
        push_entry_info(L, e);
        return 1;
    }
    lua_newtable(L);
    for (int64_t i = 0; i < zr_safetensors_count(f); i++) {
        push_entry_info(L, zr_safetensors_entry_at(f, i));
        lua_setfield(L, -2, zr_safetensors_entry_at(f, i)->name);
    }
    return 1;
}
static int f_get(lua_State *L) {
    zr_safetensors *f = *check_file(L, 1);
    const char *name = luaL_checkstring(L, 2);
    int dt;
    zr_device dev;
    opt_load(L, 3, &dt, &dev, "f:get", "dtype device");
    return zr_l_pushtensor(L, zr_safetensors_get(f, name, dt, dev));
}
/* f:get_slice(name, start, count [, {dtype=, device=}]) -> 1-D tensor of elements start ..
 * start+count-1 (1-based) of tensor `name` taken flat; reads only those bytes of the mapping
 * (checkpoint resharding reads one parameter chunk at a time). */
static int f_get_slice(lua_State *L) {
    zr_safetensors *f = *check_file(L, 1);
    const char *name = luaL_checkstring(L, 2);
    int64_t start = (int64_t)luaL_checknumber(L, 3), count = (int64_t)luaL_checknumber(L, 4);
    int dt;
    zr_device dev;
    opt_load(L, 5, &dt, &dev, "f:get_slice", "dtype device");
    const zr_safetensors_entry *e = zr_safetensors_find(f, name);
    if (!e) return zr_l_pushtensor(L, zr_safetensors_get(f, name, dt, dev)); /* raises "no tensor named" */
    if (start < 1 || count < 0 || start - 1 + count > e->numel) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s: get_slice('%s', %lld, %lld) is out of range: the tensor has %lld elements",
                 zr_safetensors_path(f), name, (long long)start, (long long)count, (long long)e->numel);
        lua_pushstring(L, msg);
        return lua_error(L);
    }
    zr_safetensors_entry s = *e;
    int64_t es = (int64_t)zr_st_dtype_size(e->st_dtype);
    s.begin = e->begin + (start - 1) * es;
    s.end = s.begin + count * es;
    s.ndim = 1;
    s.shape[0] = count;
    s.numel = count;
    return zr_l_pushtensor(L, zr_safetensors_get_entry(f, &s, dt, dev));
}

static int f_metadata(lua_State *L) {
    push_metadata(L, *check_file(L, 1));
    return 1;
}
static int f_path(lua_State *L) {
    lua_pushstring(L, zr_safetensors_path(*check_file(L, 1)));
    return 1;
}
static int f_tostring(lua_State *L) {
    zr_safetensors **p = luaL_checkudata(L, 1, ST_FILE_MT);
    if (!*p) lua_pushstring(L, "SafetensorsFile (closed)");
    else lua_pushfstring(L, "SafetensorsFile %s (%d tensors)", zr_safetensors_path(*p),
                         (int)zr_safetensors_count(*p));
    return 1;
}

/* ---------- whole-file functions ---------- */

/* zr.load_safetensors(path [, {dtype=, device=, names={...}}]) -> tensors, metadata */
static int l_load_safetensors(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    int dt;
    zr_device dev;
    opt_load(L, 2, &dt, &dev, "load_safetensors", "dtype device names");
    int names_idx = 0;
    if (lua_istable(L, 2)) {
        lua_getfield(L, 2, "names");
        if (lua_istable(L, -1)) names_idx = lua_gettop(L);
        else if (!lua_isnil(L, -1)) luaL_error(L, "load_safetensors: names must be a list of strings");
        else lua_pop(L, 1);
    }
    /* The handle is a userdata so an error mid-load still closes the file (via __gc). */
    lua_pushcfunction(L, l_safetensors_open);
    lua_pushvalue(L, 1);
    lua_call(L, 1, 1);
    int fidx = lua_gettop(L);
    zr_safetensors *f = *check_file(L, fidx);
    (void)path;
    load_into_table(L, f, names_idx, dt, dev);
    push_metadata(L, f);
    lua_pushcfunction(L, f_gc);
    lua_pushvalue(L, fidx);
    lua_call(L, 1, 0);
    return 2;
}

/* zr.safetensors_load_into({{file, name, tensor}, ...} [, threads]): every named tensor of the
 * open files read into its (contiguous, same-numel) tensor in place, in one multi-threaded pass
 * (io/safetensors_load.h). threads: 0 or nil picks min(8, CPUs). */
static int l_safetensors_load_into(lua_State *L) {
    luaL_checktype(L, 1, LUA_TTABLE);
    int threads = (int)luaL_optinteger(L, 2, 0);
    int n = (int)lua_objlen(L, 1);
    zr_safetensors_load_item *items = lua_newuserdata(L, ((size_t)n + 1) * sizeof *items);
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, 1, i + 1);
        if (!lua_istable(L, -1)) luaL_error(L, "safetensors_load_into: item %d is not a {file, name, tensor} table", i + 1);
        int top = lua_gettop(L);
        lua_rawgeti(L, top, 1);
        lua_rawgeti(L, top, 2);
        lua_rawgeti(L, top, 3);
        zr_safetensors *f = *check_file(L, top + 1);
        const char *name = luaL_checkstring(L, top + 2);
        const zr_safetensors_entry *e = zr_safetensors_find(f, name);
        if (!e) return zr_l_pushtensor(L, zr_safetensors_get(f, name, -1, zr_cpu())); /* "no tensor named" */
        items[i] = (zr_safetensors_load_item){f, e, zr_l_checktensor(L, top + 3)};
        lua_settop(L, top - 1); /* the files and tensors stay referenced by the argument table */
    }
    if (zr_safetensors_load_into(items, n, threads)) return zr_l_error(L);
    return 0;
}

/* zr.safetensors_info(path) -> {name = {dtype=, stored=, shape=, numel=, nbytes=}}, metadata */
static int l_safetensors_info(lua_State *L) {
    luaL_checkstring(L, 1);
    lua_settop(L, 1);
    l_safetensors_open(L);
    lua_pushcfunction(L, f_info);
    lua_pushvalue(L, 2);
    lua_call(L, 1, 1);
    push_metadata(L, *check_file(L, 2));
    lua_pushcfunction(L, f_gc);
    lua_pushvalue(L, 2);
    lua_call(L, 1, 0);
    return 2;
}

/* zr.save_safetensors(path, {name = tensor, ...} [, {key = "value", ...}]) */
static int l_save_safetensors(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    if (!lua_isnoneornil(L, 3)) luaL_checktype(L, 3, LUA_TTABLE);
    int n = 0, nm = 0;
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        if (lua_type(L, -2) != LUA_TSTRING)
            luaL_error(L, "save_safetensors: tensor names must be strings, got a %s key", luaL_typename(L, -2));
        if (!zr_l_totensor(L, -1))
            luaL_error(L, "save_safetensors: value for '%s' is a %s, expected a tensor", lua_tostring(L, -2),
                       luaL_typename(L, -1));
        n++;
        lua_pop(L, 1);
    }
    if (lua_istable(L, 3)) {
        lua_pushnil(L);
        while (lua_next(L, 3)) {
            if (lua_type(L, -2) != LUA_TSTRING || (lua_type(L, -1) != LUA_TSTRING && lua_type(L, -1) != LUA_TNUMBER))
                luaL_error(L, "save_safetensors: metadata must map strings to strings (key %s, value %s)",
                           luaL_typename(L, -2), luaL_typename(L, -1));
            nm++;
            lua_pop(L, 1);
        }
    }
    /* Pointers borrow from the tables at 2 and 3, which stay on the stack for the call; the string
     * forms of numeric metadata values are kept alive in an anchor table. */
    const char **names = lua_newuserdata(L, ((size_t)n + 1) * sizeof *names);
    zr_tensor **ts = lua_newuserdata(L, ((size_t)n + 1) * sizeof *ts);
    zr_safetensors_kv *kv = lua_newuserdata(L, ((size_t)nm + 1) * sizeof *kv);
    lua_newtable(L);
    int anchor = lua_gettop(L);
    int i = 0;
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        names[i] = lua_tostring(L, -2);
        ts[i] = zr_l_totensor(L, -1);
        i++;
        lua_pop(L, 1);
    }
    i = 0;
    if (nm) {
        lua_pushnil(L);
        while (lua_next(L, 3)) {
            kv[i].key = lua_tostring(L, -2);
            lua_pushstring(L, lua_tostring(L, -1)); /* converts the value slot, never the key */
            kv[i].value = lua_tostring(L, -1);
            lua_rawseti(L, anchor, i + 1);
            i++;
            lua_pop(L, 1);
        }
    }
    if (zr_safetensors_write(path, names, ts, n, kv, nm)) return zr_l_error(L);
    return 0;
}

/* ---------- file-system helpers for hf.lua ---------- */

/* zr.path_type(path) -> "file" | "dir" | "other" | nil (follows symlinks) */
static int l_path_type(lua_State *L) {
    struct stat sb;
    if (stat(luaL_checkstring(L, 1), &sb) != 0) return 0;
    lua_pushstring(L, S_ISREG(sb.st_mode) ? "file" : S_ISDIR(sb.st_mode) ? "dir" : "other");
    return 1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* zr.listdir(path) -> sorted list of names (without . and ..), or nil, message */
static int l_listdir(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    DIR *d = opendir(path);
    if (!d) {
        lua_pushnil(L);
        lua_pushfstring(L, "%s: %s", path, strerror(errno));
        return 2;
    }
    char **names = NULL;
    int n = 0, cap = 0, oom = 0;
    struct dirent *e;
    while (!oom && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 32;
            char **nn = realloc(names, (size_t)cap * sizeof *nn);
            if (!nn) { oom = 1; break; }
            names = nn;
        }
        if (!(names[n] = strdup(e->d_name))) oom = 1;
        else n++;
    }
    closedir(d);
    if (oom) { /* a partial listing would pass for the whole directory */
        for (int i = 0; i < n; i++) free(names[i]);
        free(names);
        lua_pushnil(L);
        lua_pushfstring(L, "%s: out of host memory listing the directory (%d names read)", path, n);
        return 2;
    }
    if (n > 1) qsort(names, (size_t)n, sizeof *names, cmp_str); /* names is NULL when n == 0 */
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_pushstring(L, names[i]);
        lua_rawseti(L, -2, i + 1);
        free(names[i]);
    }
    free(names);
    return 1;
}

/* zr.makedirs(path): mkdir -p; raises an error naming the part that failed. */
static int l_makedirs(lua_State *L) {
    size_t len;
    const char *path = luaL_checklstring(L, 1, &len);
    char *p = lua_newuserdata(L, len + 1);
    memcpy(p, path, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (p[i] != '/' && p[i] != 0) continue;
        char c = p[i];
        p[i] = 0;
        struct stat sb;
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            luaL_error(L, "cannot create directory %s: %s", p, strerror(errno));
        if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode))
            luaL_error(L, "cannot create directory %s: a file of that name is in the way", p);
        p[i] = c;
    }
    return 0;
}

/* zr.save_safetensors_stream(path, {{name=, dtype=, shape={...}}, ...}, get [, metadata]):
 * writes atomically with bounded memory: get(i) is called once per spec (1-based index, in the
 * file's data order) and returns that tensor, which may be freed right after. */
typedef struct {
    lua_State *L;
    int fn;     /* stack index of get */
    int failed; /* get raised a Lua error: its message is at the top of the stack */
} stream_ctx;

static zr_tensor *stream_get(void *vctx, int64_t i) {
    stream_ctx *c = vctx;
    lua_State *L = c->L;
    lua_pushvalue(L, c->fn);
    lua_pushnumber(L, (lua_Number)(i + 1));
    if (lua_pcall(L, 1, 1, 0)) {
        c->failed = 1; /* keep the message on the stack for after the writer has cleaned up */
        return zr_error_null("the get function raised an error");
    }
    zr_tensor *t = zr_l_totensor(L, -1);
    if (!t) {
        zr_error("get(%lld) returned a %s, expected a tensor", (long long)i + 1, luaL_typename(L, -1));
        lua_pop(L, 1);
        return NULL;
    }
    zr_tensor_retain(t);
    lua_pop(L, 1);
    return t;
}

static int l_save_safetensors_stream(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    luaL_checktype(L, 3, LUA_TFUNCTION);
    if (!lua_isnoneornil(L, 4)) luaL_checktype(L, 4, LUA_TTABLE);
    lua_settop(L, 4);
    int n = (int)lua_objlen(L, 2), nm = 0;
    zr_safetensors_spec *specs = lua_newuserdata(L, ((size_t)n + 1) * sizeof *specs);
    for (int i = 0; i < n; i++) {
        lua_rawgeti(L, 2, i + 1);
        if (!lua_istable(L, -1)) luaL_error(L, "save_safetensors_stream: specs[%d] is not a table", i + 1);
        int top = lua_gettop(L);
        lua_getfield(L, top, "name");
        specs[i].name = lua_tostring(L, -1); /* the string stays alive in the specs table */
        if (!specs[i].name) luaL_error(L, "save_safetensors_stream: specs[%d].name is not a string", i + 1);
        lua_getfield(L, top, "dtype");
        specs[i].dtype = zr_l_checkdtype(L, lua_gettop(L));
        lua_getfield(L, top, "shape");
        if (!lua_istable(L, -1)) luaL_error(L, "save_safetensors_stream: specs[%d].shape is not a table", i + 1);
        zr_l_checkshape(L, lua_gettop(L), &specs[i].ndim, specs[i].shape);
        lua_settop(L, top - 1);
    }
    if (lua_istable(L, 4)) {
        lua_pushnil(L);
        while (lua_next(L, 4)) {
            if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
                luaL_error(L, "save_safetensors_stream: metadata must map strings to strings");
            nm++;
            lua_pop(L, 1);
        }
    }
    zr_safetensors_kv *kv = lua_newuserdata(L, ((size_t)nm + 1) * sizeof *kv);
    int i = 0;
    if (nm) {
        lua_pushnil(L);
        while (lua_next(L, 4)) {
            kv[i].key = lua_tostring(L, -2);
            kv[i].value = lua_tostring(L, -1);
            i++;
            lua_pop(L, 1);
        }
    }
    stream_ctx c = {L, 3, 0};
    if (zr_safetensors_write_stream(path, specs, n, stream_get, &c, kv, nm)) {
        if (c.failed) return lua_error(L); /* the get function's own message */
        return zr_l_error(L);
    }
    return 0;
}

/* zr.write_file_atomic(path, string) */
static int l_write_file_atomic(lua_State *L) {
    size_t len;
    const char *path = luaL_checkstring(L, 1);
    const char *s = luaL_checklstring(L, 2, &len);
    if (zr_file_write_atomic(path, s, (int64_t)len)) return zr_l_error(L);
    return 0;
}

/* zr.setenv(name, value or nil) — lets tests and recipes point HF_HOME etc. somewhere. */
static int l_setenv(lua_State *L) {
    const char *name = luaL_checkstring(L, 1);
    int rc = lua_isnoneornil(L, 2) ? unsetenv(name) : setenv(name, luaL_checkstring(L, 2), 1);
    if (rc != 0) luaL_error(L, "setenv %s: %s", name, strerror(errno));
    return 0;
}

void zr_bind_io(lua_State *L) {
    static const luaL_Reg file_methods[] = {
        {"keys", f_keys}, {"info", f_info}, {"get", f_get}, {"metadata", f_metadata},
        {"path", f_path}, {"close", f_gc},  {"get_slice", f_get_slice}, {NULL, NULL}};
    if (luaL_newmetatable(L, ST_FILE_MT)) {
        lua_newtable(L);
        for (const luaL_Reg *r = file_methods; r->name; r++) {
            lua_pushcfunction(L, r->func);
            lua_setfield(L, -2, r->name);
        }
        lua_setfield(L, -2, "__index");
        lua_pushcfunction(L, f_gc);
        lua_setfield(L, -2, "__gc");
        lua_pushcfunction(L, f_tostring);
        lua_setfield(L, -2, "__tostring");
    }
    lua_pop(L, 1);
    static const luaL_Reg fns[] = {
        {"load_safetensors", l_load_safetensors},
        {"save_safetensors", l_save_safetensors},
        {"safetensors_info", l_safetensors_info},
        {"safetensors_open", l_safetensors_open},
        {"safetensors_open_view", l_safetensors_open_view},
        {"safetensors_load_into", l_safetensors_load_into},
        {"path_type", l_path_type},
        {"listdir", l_listdir},
        {"makedirs", l_makedirs},
        {"write_file_atomic", l_write_file_atomic},
        {"setenv", l_setenv},
        {"save_safetensors_stream", l_save_safetensors_stream},
        {NULL, NULL},
    };
    zr_l_register_functions(L, fns);
}
