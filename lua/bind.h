/* Shared helpers for the Lua bindings (the only C that includes lua.h). A tensor is a full
 * userdata holding one zr_tensor reference; __gc releases it (idempotent).
 * Conventions: dims and indices are 1-based in Lua (negative counts from the end); the
 * helpers below convert to 0-based. Runtime errors become Lua errors via zr_l_error. */
#ifndef ZR_BIND_H
#define ZR_BIND_H

#include <lauxlib.h>
#include <lua.h>

#include "core/tensor.h"

#define ZR_TENSOR_MT "zr.Tensor"

/* Checked cast: the tensor at idx, or a Lua error naming the argument. */
zr_tensor *zr_l_checktensor(lua_State *L, int idx);
zr_tensor *zr_l_totensor(lua_State *L, int idx); /* NULL if not a tensor */
/* Pushes t, taking over the caller's reference. When t is NULL raises the runtime error. */
int zr_l_pushtensor(lua_State *L, zr_tensor *t);
int zr_l_tensor_gc(lua_State *L); /* the handles' __gc */
/* Handles (bind_handle.c): the serial the next handle gets; frees the handles made since a serial
 * except those holding keep[]; bytes a full collection could free (-1: unknown). */
uint64_t zr_l_handle_serial(void);
int zr_l_release_since(uint64_t serial, zr_tensor *const *keep, int nkeep);
int64_t zr_l_collectable_bytes(int dev_type, int dev_index, int model_states);
/* The allocators' collector (core/alloc.h zr_mem_set_collector): ctx is the main lua_State. */
int zr_l_alloc_collect(void *L, zr_device dev, int failed);
double zr_l_now(void); /* monotonic wall clock, seconds (C.now) */
/* Raises zr_last_error() as a Lua error (never returns). */
int zr_l_error(lua_State *L);
/* 1-based (or negative) Lua dim at idx -> 0-based (or negative) C dim; 0 is an error. */
int zr_l_checkdim(lua_State *L, int idx);
int zr_l_optdim(lua_State *L, int idx, int def_c);
/* Shape from a table {2,3} or from numbers at idx, idx+1, ...; returns the index after it. */
int zr_l_checkshape(lua_State *L, int idx, int *ndim, int64_t *shape);
/* Options table fields: dtype (string), device (string). Leaves defaults when absent. */
void zr_l_opt_dtype_device(lua_State *L, int idx, zr_dtype *dt, zr_device *dev);
/* An options table at idx (anything else: nothing to check) whose keys must be among `known`
 * (space-separated names); another key raises "<who>: unknown option 'k'; it takes <known>". */
void zr_l_check_keys(lua_State *L, int idx, const char *who, const char *known);
zr_dtype zr_l_checkdtype(lua_State *L, int idx);
zr_device zr_l_checkdevice(lua_State *L, int idx);
/* Options-table fields of the table at idx: a number (def when absent; an error naming op and the
 * field when it is not a number) and a boolean (Lua truthiness; absent is false). */
double zr_l_numfield(lua_State *L, int idx, const char *key, double def, const char *op);
int zr_l_boolfield(lua_State *L, int idx, const char *key);

/* Registers functions into the zrun._C module table and/or the Tensor method table. Called from
 * each family's zr_bind_<family>(L). */
void zr_l_register_functions(lua_State *L, const luaL_Reg *fns);
void zr_l_register_methods(lua_State *L, const luaL_Reg *fns);

/* Creates the metatable `name` for a userdata class: __gc and an __index table of methods. */
void zr_l_newclass(lua_State *L, const char *name, lua_CFunction gc, const luaL_Reg *methods);

/* The note main.c's Ctrl-C handler prints after "interrupted" (bind_system.c; "" for none). */
const char *zr_l_interrupt_note(void);

/* Family registration entry points (weak: a family that is not linked in is skipped). */
void zr_bind_ops(lua_State *L);
void zr_bind_nn_ops(lua_State *L);
void zr_bind_layer_ops(lua_State *L);
void zr_bind_tokenizer(lua_State *L);
void zr_bind_io(lua_State *L);
void zr_bind_cuda(lua_State *L);
void zr_bind_optim(lua_State *L);
void zr_bind_repl(lua_State *L);
void zr_bind_system(lua_State *L);
void zr_bind_checkpoint(lua_State *L);
void zr_bind_zero(lua_State *L);
void zr_bind_comm(lua_State *L);
void zr_bind_linear_multi(lua_State *L);
void zr_bind_handle(lua_State *L);

int luaopen_zrun_C(lua_State *L);

#endif
