/* Tensor handles: the Lua userdata that holds one zr_tensor reference. Every live handle is on
 * one list in creation order with a serial number, so C can free a scope's temporaries without
 * a full Lua collection (zr_l_release_since: zr.checkpoint's segments) and can bound what a
 * collection could free (zr_l_collectable_bytes) before paying for one: a full collection walks
 * the whole Lua heap (a tokenized dataset of 50k rows makes it ~130 ms), tensors are what it
 * frees. Lua states are single-threaded and zrun runs one, so the list needs no lock. */
#include <stdlib.h>
#include <string.h>

#include "bind.h"

typedef struct handle {
    zr_tensor *t; /* first: the box reads as a zr_tensor ** */
    struct handle *prev, *next;
    uint64_t serial;
    int linked;   /* on the list (not yet collected or released) */
    int released; /* freed by zr_l_release_since: using it is an error that says why */
    int pinned;   /* zr.persist(t): a cache, never freed by zr_l_release_since */
} handle;

static handle *head, *tail;
static uint64_t next_serial = 1;

static void unlink_handle(handle *h) {
    if (!h->linked) return;
    if (h->prev) h->prev->next = h->next;
    else head = h->next;
    if (h->next) h->next->prev = h->prev;
    else tail = h->prev;
    h->prev = h->next = NULL;
    h->linked = 0;
}

/* Drops the handle's reference now (a collection's __gc, or a release: then using it is an error
 * that says why). */
static void free_handle(handle *h, int released) {
    unlink_handle(h);
    zr_tensor_release(h->t);
    h->t = NULL;
    h->released = released;
}

static void released_error(lua_State *L, int idx) {
    luaL_error(L, "bad argument #%d: this tensor was freed (zr.release, or the zr.checkpoint function or model forward that made "
                  "it returned: a checkpointed function or a model's forward must return what it makes, or mark a cache it keeps with "
                  "zr.persist(t))", idx);
}

/* A released handle is an error wherever it is used, type tests included. */
zr_tensor *zr_l_totensor(lua_State *L, int idx) {
    handle *h = luaL_testudata(L, idx, ZR_TENSOR_MT);
    if (h && h->released) released_error(L, idx);
    return h ? h->t : NULL;
}

zr_tensor *zr_l_checktensor(lua_State *L, int idx) {
    zr_tensor *t = zr_l_totensor(L, idx);
    if (!t) luaL_error(L, "bad argument #%d: expected a tensor, got %s", idx, luaL_typename(L, idx));
    return t;
}

int zr_l_pushtensor(lua_State *L, zr_tensor *t) {
    if (!t) return zr_l_error(L);
    handle *h = lua_newuserdata(L, sizeof *h); /* box first, so __gc is always safe */
    memset(h, 0, sizeof *h);
    h->t = t;
    h->serial = next_serial++;
    h->prev = tail;
    if (tail) tail->next = h;
    else head = h;
    tail = h;
    h->linked = 1;
    luaL_getmetatable(L, ZR_TENSOR_MT);
    lua_setmetatable(L, -2);
    return 1;
}

int zr_l_tensor_gc(lua_State *L) {
    free_handle(luaL_checkudata(L, 1, ZR_TENSOR_MT), 0);
    return 0;
}

uint64_t zr_l_handle_serial(void) { return next_serial; }

/* Frees the handles made since serial (zr_l_handle_serial before the scope) except those whose
 * tensor is one of keep[0..nkeep): their references go now, as a collection would drop them.
 * Returns how many it freed. */
int zr_l_release_since(uint64_t serial, zr_tensor *const *keep, int nkeep) {
    int n = 0;
    handle *h = tail;
    while (h && h->serial >= serial) {
        handle *prev = h->prev;
        int kept = h->pinned;
        for (int i = 0; i < nkeep && !kept; i++) kept = keep[i] && h->t == keep[i];
        if (!kept) {
            free_handle(h, 1);
            n++;
        }
        h = prev;
    }
    return n;
}

/* ---------- what a full collection could free ---------- */

/* Small open-addressing map pointer -> count, for one walk of the list. */
typedef struct {
    const void **key;
    int *val;
    size_t cap;
} ptr_count;

static int pc_init(ptr_count *m, size_t n) {
    m->cap = 64;
    while (m->cap < 2 * n + 1) m->cap *= 2;
    m->key = calloc(m->cap, sizeof *m->key);
    m->val = calloc(m->cap, sizeof *m->val);
    return m->key && m->val;
}
static void pc_free(ptr_count *m) {
    free(m->key);
    free(m->val);
}
static int *pc_slot(ptr_count *m, const void *k) {
    size_t i = ((uintptr_t)k >> 4) * 11400714819323198485ull & (m->cap - 1);
    while (m->key[i] && m->key[i] != k) i = (i + 1) & (m->cap - 1);
    m->key[i] = k;
    return &m->val[i];
}

/* Bytes on device dev (any device when dev_type < 0) of storages that only live handles hold,
 * caches marked with zr.persist and (unless model_states) parameters, gradients and optimizer
 * states aside: an upper bound on what a full collection would free now of a forward's tensors,
 * short of the graph a dead handle's tensor may own (its saved tensors are freed by the backward
 * that runs it). Reachable handles count too: a collection then runs that frees nothing. */
int64_t zr_l_collectable_bytes(int dev_type, int dev_index, int model_states) {
    size_t n = 0;
    for (handle *h = head; h; h = h->next) n++;
    ptr_count per_tensor = {0}, per_storage = {0};
    if (!pc_init(&per_tensor, n) || !pc_init(&per_storage, n)) {
        pc_free(&per_tensor);
        pc_free(&per_storage);
        return -1; /* unknown: the caller collects */
    }
    for (handle *h = head; h; h = h->next) (*pc_slot(&per_tensor, h->t))++;
    for (handle *h = head; h; h = h->next) { /* tensors held by handles only: count per storage */
        zr_tensor *t = h->t;
        int *c = pc_slot(&per_tensor, t);
        if (*c <= 0 || *c != t->refcount || !t->storage) continue;
        *c = -1; /* once per tensor */
        (*pc_slot(&per_storage, t->storage))++;
    }
    int64_t bytes = 0;
    for (handle *h = head; h; h = h->next) {
        zr_tensor *t = h->t;
        if (*pc_slot(&per_tensor, t) != -1) continue; /* shared with C (a graph, an optimizer) */
        zr_storage *s = t->storage;
        int *c = pc_slot(&per_storage, s);
        if (*c <= 0 || *c != s->refcount || s->external) continue;
        *c = 0; /* once per storage */
        if (h->pinned) continue;
        /* model states held only from Lua (a frozen reference model, a previous engine's) are
         * not a forward's leftovers: counting them would collect every step and free nothing */
        if (!model_states && (s->category == ZR_MEM_PARAMS || s->category == ZR_MEM_GRADS ||
                              s->category == ZR_MEM_OPTIMIZER))
            continue;
        if (dev_type >= 0 && ((int)s->device.type != dev_type || s->device.index != dev_index)) continue;
        bytes += (int64_t)s->nbytes;
    }
    pc_free(&per_tensor);
    pc_free(&per_storage);
    return bytes;
}

/* ---------- Lua functions ---------- */

static int l_handle_serial(lua_State *L) {
    lua_pushnumber(L, (lua_Number)zr_l_handle_serial());
    return 1;
}

/* C.release_since(serial, ...): frees the handles made since serial except those holding the
 * tensors among ... (tensors, or tables of tensors one level deep). Returns how many it freed. */
static int l_release_since(lua_State *L) {
    uint64_t serial = (uint64_t)luaL_checknumber(L, 1);
    int top = lua_gettop(L), n = 0;
    for (int pass = 0; pass < 2; pass++) { /* count, then fill */
        zr_tensor **keep = pass ? lua_newuserdata(L, (size_t)(n ? n : 1) * sizeof *keep) : NULL;
        n = 0;
        for (int i = 2; i <= top; i++) {
            zr_tensor *t = zr_l_totensor(L, i);
            if (t) {
                if (keep) keep[n] = t;
                n++;
            } else if (lua_istable(L, i)) {
                lua_pushnil(L);
                while (lua_next(L, i)) {
                    zr_tensor *v = zr_l_totensor(L, -1);
                    if (v && keep) keep[n] = v;
                    n += v != NULL;
                    lua_pop(L, 1);
                }
            }
        }
        if (keep) lua_pushinteger(L, zr_l_release_since(serial, keep, n));
    }
    return 1;
}

/* C.collect_tensor_garbage(device): a full Lua collection when it could free more than 1/256 of
 * the bytes live on device (or the count is unknown); otherwise none. Returns whether it ran. */
static int collections, skipped;
static double collect_seconds;
static int l_collect_tensor_garbage(lua_State *L) {
    zr_device dev = zr_l_checkdevice(L, 1);
    int64_t b = zr_l_collectable_bytes(dev.type, dev.index, 0);
    zr_mem_stats st;
    zr_mem_get_stats(dev, &st);
    int run = b < 0 || b > st.total_current / 256;
    if (run) {
        double t0 = zr_l_now();
        lua_gc(L, LUA_GCCOLLECT, 0);
        collect_seconds += zr_l_now() - t0;
        collections++;
    } else skipped++;
    lua_pushboolean(L, run);
    return 1;
}
/* The allocators' collector (core/alloc.h zr_mem_set_collector; main.c sets it with the main
 * state): a full collection, so that tensors no longer reached from Lua (a loop's earlier results,
 * awaiting the collector, replaced .grad tensors included) are freed. For the host's soft limit it
 * declines when the tensors only Lua holds (zr_l_collectable_bytes with model states: an upper
 * bound on what it could free; what C structures hold aside) are under a quarter of the floor:
 * host memory that grows by its owners' own allocations (ZeRO-Offload's optimizer states) then
 * costs no walks of the Lua heap (~130 ms with 50,000 tokenized rows). */
int zr_l_alloc_collect(void *L, zr_device dev, int failed) {
    if (!failed) {
        const int64_t b = zr_l_collectable_bytes(dev.type, dev.index, 1);
        if (b >= 0 && b < zr_mem_collect_floor() / 4) return 0;
    }
    lua_gc((lua_State *)L, LUA_GCCOLLECT, 0);
    return 1;
}
/* C.collectable_bytes(device) -> what a full collection could free there (zr_l_collectable_bytes) */
static int l_collectable_bytes(lua_State *L) {
    zr_device dev = zr_l_checkdevice(L, 1);
    lua_pushnumber(L, (lua_Number)zr_l_collectable_bytes(dev.type, dev.index, 0));
    return 1;
}
/* C.tensor_gc_counts() -> collections run, collections skipped by collect_tensor_garbage, and the
 * seconds the ones run took */
static int l_tensor_gc_counts(lua_State *L) {
    lua_pushinteger(L, collections);
    lua_pushinteger(L, skipped);
    lua_pushnumber(L, collect_seconds);
    return 3;
}

/* zr.persist(t) -> t: t outlives the forward or checkpointed function that made it (a cache
 * built inside one); the scopes that free their temporaries keep it. */
static int l_persist(lua_State *L) {
    zr_l_checktensor(L, 1);
    ((handle *)lua_touserdata(L, 1))->pinned = 1;
    lua_settop(L, 1);
    return 1;
}

static void release_args(lua_State *L, int first, uint64_t since) {
    int top = lua_gettop(L);
    for (int i = first; i <= top; i++) {
        handle *h = luaL_testudata(L, i, ZR_TENSOR_MT);
        if (!h || !h->t || h->pinned || h->serial < since) continue;
        free_handle(h, 1);
    }
}
/* zr.release(t1, t2, ...): frees these handles' tensors now, as `del t` does in PyTorch (their
 * memory goes when nothing else holds it); using one afterwards is an error that says so. Values
 * that are not tensors, and handles freed already, are skipped. */
static int l_release(lua_State *L) {
    release_args(L, 1, 0);
    return 0;
}
/* C.release_made_since(serial, t1, t2, ...): zr.release of those among t1, ... made since serial
 * (C.handle_serial): what a collator or a model made for this batch, not a tensor it keeps. */
static int l_release_made_since(lua_State *L) {
    release_args(L, 2, (uint64_t)luaL_checknumber(L, 1));
    return 0;
}

static const luaL_Reg fns[] = {{"handle_serial", l_handle_serial},
                               {"release", l_release},
                               {"release_made_since", l_release_made_since},
                               {"persist", l_persist},
                               {"release_since", l_release_since},
                               {"collect_tensor_garbage", l_collect_tensor_garbage},
                               {"tensor_gc_counts", l_tensor_gc_counts},
                               {"collectable_bytes", l_collectable_bytes},
                               {NULL, NULL}};
void zr_bind_handle(lua_State *L) { zr_l_register_functions(L, fns); }
