/* Activation (gradient) checkpointing: zr.checkpoint(fn, inputs...) runs fn without recording,
 * keeps only its inputs, and re-runs fn with grad on during backward (restoring the random
 * generator so dropout masks repeat). The backward node calls back into Lua, so it lives here.
 * The tensors a segment makes are freed when it returns (zr_l_release_since), not by the Lua
 * collector: a checkpointed function must not keep them. */
#include <stdlib.h>
#include <string.h>

#include "bind.h"
#include "core/autograd.h"
#include "core/random.h"

typedef struct {
    lua_State *L;
    int fn_ref;
    int n;
    zr_tensor **inputs; /* detached, retained */
    uint64_t seed, offset;
} ckpt_ctx;

static void ckpt_free(void *p) {
    ckpt_ctx *c = p;
    for (int i = 0; i < c->n; i++) zr_tensor_release(c->inputs[i]);
    luaL_unref(c->L, LUA_REGISTRYINDEX, c->fn_ref);
    free(c->inputs);
    free(c);
}

static zr_status ckpt_backward(zr_node *n, zr_tensor *g, zr_tensor **gin) {
    ckpt_ctx *c = n->ctx;
    lua_State *L = c->L;
    uint64_t s0, o0;
    zr_random_get_state(&s0, &o0);
    zr_random_set_state(c->seed, c->offset);
    int top = lua_gettop(L);
    uint64_t serial = zr_l_handle_serial();
    zr_tensor **xs = calloc((size_t)c->n, sizeof *xs);
    if (!xs) return zr_error("checkpoint: out of host memory");
    lua_rawgeti(L, LUA_REGISTRYINDEX, c->fn_ref);
    for (int i = 0; i < c->n; i++) {
        xs[i] = zr_tensor_detach(c->inputs[i]);
        if (!xs[i]) goto fail;
        xs[i]->requires_grad = zr_node_needs_grad(n, i);
        zr_l_pushtensor(L, zr_tensor_retain(xs[i]));
    }
    int old = zr_set_grad_enabled(1);
    int rc = lua_pcall(L, c->n, 1, 0);
    zr_set_grad_enabled(old);
    zr_random_set_state(s0, o0);
    if (rc) {
        zr_error("checkpoint: re-running the function in backward failed: %s", lua_tostring(L, -1));
        goto fail;
    }
    zr_tensor *out = zr_l_totensor(L, -1);
    if (!out) {
        zr_error("checkpoint: the function returned a %s in backward, expected a tensor", luaL_typename(L, -1));
        goto fail;
    }
    old = zr_set_grad_enabled(1);
    zr_status st = zr_tensor_needs_grad(out) ? zr_backward(out, g, 0) : ZR_OK;
    zr_set_grad_enabled(old);
    if (st) goto fail;
    for (int i = 0; i < c->n; i++) {
        if (zr_node_needs_grad(n, i) && xs[i]->grad) gin[i] = zr_tensor_retain(xs[i]->grad);
        zr_tensor_release(xs[i]);
    }
    free(xs);
    lua_settop(L, top);
    zr_l_release_since(serial, NULL, 0); /* the recomputed segment is garbage once its backward ran */
    return ZR_OK;
fail:
    for (int i = 0; i < c->n; i++) zr_tensor_release(xs[i]);
    free(xs);
    lua_settop(L, top);
    zr_l_release_since(serial, NULL, 0);
    return ZR_ERR;
}

/* zr.checkpoint(fn, x1, x2, ...) -> fn(x1, ...) with activations recomputed in backward */
static int l_checkpoint(lua_State *L) {
    luaL_checktype(L, 1, LUA_TFUNCTION);
    int n = lua_gettop(L) - 1;
    zr_tensor **ins = calloc((size_t)(n ? n : 1), sizeof *ins);
    if (!ins) return luaL_error(L, "checkpoint: out of host memory");
    for (int i = 0; i < n; i++) ins[i] = zr_l_checktensor(L, i + 2);
    uint64_t seed, off;
    zr_random_get_state(&seed, &off);
    uint64_t serial = zr_l_handle_serial();
    lua_pushvalue(L, 1);
    for (int i = 0; i < n; i++) lua_pushvalue(L, i + 2);
    int old = zr_set_grad_enabled(0);
    int rc = lua_pcall(L, n, 1, 0);
    zr_set_grad_enabled(old);
    if (rc) {
        free(ins);
        return lua_error(L);
    }
    zr_tensor *out = zr_tensor_retain(zr_l_totensor(L, -1));
    /* The segment's temporaries are garbage now: free every handle it made (its output's too: the
     * result is a fresh header) without a full collection, which walks the whole Lua heap, 16-32
     * times a micro-batch. What the function kept is freed too: the handle then says so. */
    zr_l_release_since(serial, NULL, 0);
    if (!out) {
        free(ins);
        return luaL_error(L, "checkpoint: the function must return one tensor, got %s", luaL_typename(L, -1));
    }
    if (!old) { /* under no_grad: nothing to record */
        free(ins);
        return zr_l_pushtensor(L, out);
    }
    zr_node *node;
    /* The function may have returned one of its inputs or a view: give it a fresh header. */
    zr_tensor *res = zr_tensor_detach(out);
    zr_tensor_release(out);
    if (!res || zr_autograd_record_always(res, "checkpoint", ckpt_backward, n, ins, &node)) {
        zr_tensor_release(res);
        free(ins);
        return zr_l_error(L);
    }
    if (node) {
        ckpt_ctx *c = calloc(1, sizeof *c);
        c->L = L;
        c->n = n;
        c->inputs = calloc((size_t)(n ? n : 1), sizeof *c->inputs);
        c->seed = seed;
        c->offset = off;
        for (int i = 0; i < n; i++) c->inputs[i] = zr_tensor_detach(ins[i]);
        lua_pushvalue(L, 1);
        c->fn_ref = luaL_ref(L, LUA_REGISTRYINDEX);
        node->ctx = c;
        node->ctx_free = ckpt_free;
    }
    free(ins);
    return zr_l_pushtensor(L, res);
}

static const luaL_Reg fns[] = {{"checkpoint", l_checkpoint}, {NULL, NULL}};
void zr_bind_checkpoint(lua_State *L) { zr_l_register_functions(L, fns); }
