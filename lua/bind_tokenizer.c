/* Lua bindings for the tokenizer (runtime/tokenizer/tokenizer.h): a Tokenizer userdata class.
 * Ids are plain Lua arrays of integers (the datasets layer turns batches into tensors). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bind.h"
#include "tokenizer/tokenizer.h"

#define TOK_MT "zr.Tokenizer"

/* Argument errors name the method and what it takes: LuaJIT cannot name a method reached through a
 * metatable, so luaL_check* would say "bad argument #2 to '?'". */
static zr_tokenizer *check_tok(lua_State *L, int idx) {
    zr_tokenizer **p = luaL_testudata(L, idx, TOK_MT);
    if (!p)
        luaL_error(L, "tokenizer method called on a %s instead of a tokenizer (call methods with a colon: "
                      "tok:encode(text))", luaL_typename(L, idx));
    if (!*p) luaL_error(L, "tokenizer was freed");
    return *p;
}
static const char *check_text(lua_State *L, int idx, const char *usage, const char *what, size_t *len) {
    if (!lua_isstring(L, idx)) luaL_error(L, "%s: %s must be a string, got %s", usage, what, luaL_typename(L, idx));
    return lua_tolstring(L, idx, len);
}

#define ENCODE_USAGE "tok:encode(text [, add_special_tokens [, max_length]])"
/* A flag argument: nil (absent) gives dflt; true/false; anything else (an options table, as
 * transformers' keyword arguments would be written) is refused rather than read as true. */
static int check_flag(lua_State *L, int idx, int dflt, const char *usage, const char *what) {
    if (lua_isnoneornil(L, idx)) return dflt;
    if (!lua_isboolean(L, idx))
        luaL_error(L, "%s: %s must be true or false, got a %s (the arguments are positional)", usage, what,
                   luaL_typename(L, idx));
    return lua_toboolean(L, idx);
}
#define DECODE_USAGE "tok:decode(ids [, skip_special_tokens])"

/* An id must be an integer an int32 holds: 0.5 or 2^32 must not quietly become id 0. Ids
 * outside the vocabulary (negative ones too) are the C decoder's to skip. */
static int id_ok(double v) {
    return v == v && v >= -2147483648.0 && v <= 2147483647.0 && v == (double)(int32_t)v;
}
/* "0.5", "inf", "nan", "string", ... for messages (lua_pushfstring has no %g). */
static void describe_number(lua_State *L, int idx, char *buf, size_t cap) {
    double v = lua_tonumber(L, idx);
    if (lua_type(L, idx) != LUA_TNUMBER) snprintf(buf, cap, "%s", luaL_typename(L, idx));
    else if (v != v) snprintf(buf, cap, "nan");
    else snprintf(buf, cap, "%.17g", v);
}

static int l_load(lua_State *L) {
    const char *path = luaL_checkstring(L, 1);
    zr_tokenizer **box = lua_newuserdata(L, sizeof *box);
    *box = NULL;
    luaL_getmetatable(L, TOK_MT);
    lua_setmetatable(L, -2);
    *box = zr_tokenizer_load(path);
    if (!*box) return zr_l_error(L);
    return 1;
}

static int l_gc(lua_State *L) {
    zr_tokenizer **p = luaL_checkudata(L, 1, TOK_MT);
    zr_tokenizer_free(*p);
    *p = NULL;
    return 0;
}

/* encode(text [, add_special_tokens=true [, max_length]]) -> {ids...}: at most max_length ids, the text's cut
 * (zr_tokenizer_truncate) as by a transformers tokenizer's truncation=True, max_length=... */
static int l_encode(lua_State *L) {
    zr_tokenizer *t = check_tok(L, 1);
    size_t len;
    const char *s = check_text(L, 2, ENCODE_USAGE, "text", &len);
    int add = check_flag(L, 3, 1, ENCODE_USAGE, "add_special_tokens");
    int64_t maxlen = -1;
    if (!lua_isnoneornil(L, 4)) {
        double m = lua_type(L, 4) == LUA_TNUMBER ? lua_tonumber(L, 4) : -1;
        if (!(m >= 0 && m <= 9e15 && m == (double)(int64_t)m)) {
            char got[64];
            describe_number(L, 4, got, sizeof got);
            return luaL_error(L, "%s: max_length must be a non-negative integer, got %s", ENCODE_USAGE, got);
        }
        maxlen = (int64_t)m;
    }
    int32_t *ids;
    int64_t n;
    if (zr_tokenizer_encode(t, s, len, add, &ids, &n)) return zr_l_error(L);
    if (maxlen >= 0 && zr_tokenizer_truncate(t, ids, &n, maxlen, add)) {
        free(ids);
        return luaL_error(L, "%s: %s", ENCODE_USAGE, zr_last_error());
    }
    lua_createtable(L, (int)n, 0);
    for (int64_t i = 0; i < n; i++) {
        lua_pushinteger(L, ids[i]);
        lua_rawseti(L, -2, (int)(i + 1));
    }
    free(ids);
    return 1;
}


/* The ids of a Lua table at idx (malloc'd; *n of them), or an error naming the bad element. */
static int32_t *table_ids(lua_State *L, int idx, int64_t *n) {
    *n = (int64_t)lua_objlen(L, idx);
    int32_t *ids = malloc(sizeof *ids * (size_t)(*n ? *n : 1));
    if (!ids) luaL_error(L, "%s: out of memory", DECODE_USAGE);
    for (int64_t i = 0; i < *n; i++) {
        lua_rawgeti(L, idx, (int)(i + 1));
        double v = lua_type(L, -1) == LUA_TNUMBER ? lua_tonumber(L, -1) : 0.5;
        if (!id_ok(v)) {
            char got[64];
            describe_number(L, -1, got, sizeof got);
            free(ids);
            luaL_error(L, "%s: ids[%d] must be an integer from -2^31 to 2^31-1, got %s", DECODE_USAGE, (int)(i + 1), got);
        }
        ids[i] = (int32_t)v;
        lua_pop(L, 1);
    }
    return ids;
}

/* Pushes the text of ids[0..n); nonzero (nothing pushed) when decoding fails. */
static int push_decoded(lua_State *L, zr_tokenizer *t, const int32_t *ids, int64_t n, int skip) {
    char *out;
    int64_t len;
    if (zr_tokenizer_decode_len(t, ids, n, skip, &out, &len)) return 1;
    lua_pushlstring(L, out, (size_t)len);
    free(out);
    return 0;
}

/* decode({ids} or i32/i64 tensor or an id [, skip_special_tokens=false]) -> string; a batch (a table of
 * tables, a 2-D tensor) -> a table of strings, one a row (transformers' decode of a batch) */
static int l_decode(lua_State *L) {
    zr_tokenizer *t = check_tok(L, 1);
    int skip = check_flag(L, 3, 0, DECODE_USAGE, "skip_special_tokens");
    int64_t n;
    int32_t *ids;
    zr_tensor *tt = zr_l_totensor(L, 2);
    if (tt) {
        if (tt->ndim > 2)
            return luaL_error(L, "%s: ids must be a 1-D tensor (or 2-D: a batch), got %d dimensions", DECODE_USAGE, tt->ndim);
        double *d = zr_tensor_to_doubles(tt);
        if (!d) return zr_l_error(L);
        n = zr_tensor_numel(tt);
        ids = malloc(sizeof *ids * (size_t)(n ? n : 1));
        if (!ids) {
            free(d);
            return luaL_error(L, "%s: out of memory", DECODE_USAGE);
        }
        for (int64_t i = 0; i < n; i++) {
            if (!id_ok(d[i])) {
                double v = d[i];
                free(d);
                free(ids);
                char msg[160];
                snprintf(msg, sizeof msg, "%s: element %lld of the ids tensor must be an integer from "
                         "-2^31 to 2^31-1, got %.17g (use an i32 or i64 tensor)", DECODE_USAGE,
                         (long long)i + 1, v);
                return luaL_error(L, "%s", msg);
            }
            ids[i] = (int32_t)d[i];
        }
        free(d);
        if (tt->ndim == 2) {
            int64_t rows = tt->shape[0], cols = tt->shape[1];
            lua_createtable(L, (int)rows, 0);
            for (int64_t r = 0; r < rows; r++) {
                if (push_decoded(L, t, ids + r * cols, cols, skip)) {
                    free(ids);
                    return zr_l_error(L);
                }
                lua_rawseti(L, -2, (int)(r + 1));
            }
            free(ids);
            return 1;
        }
    } else if (lua_type(L, 2) == LUA_TNUMBER) { /* one id, as transformers' decode(int) */
        if (!id_ok(lua_tonumber(L, 2))) {
            char got[64];
            describe_number(L, 2, got, sizeof got);
            return luaL_error(L, "%s: an id must be an integer from -2^31 to 2^31-1, got %s", DECODE_USAGE, got);
        }
        n = 1;
        ids = malloc(sizeof *ids);
        if (!ids) return luaL_error(L, "%s: out of memory", DECODE_USAGE);
        ids[0] = (int32_t)lua_tonumber(L, 2);
    } else {
        if (!lua_istable(L, 2))
            return luaL_error(L, "%s: ids must be a table of integers, an integer tensor or an id, got %s",
                              DECODE_USAGE, luaL_typename(L, 2));
        lua_rawgeti(L, 2, 1);
        int batch = lua_istable(L, -1);
        lua_pop(L, 1);
        if (batch) {
            n = (int64_t)lua_objlen(L, 2);
            lua_createtable(L, (int)n, 0);
            for (int64_t r = 0; r < n; r++) {
                lua_rawgeti(L, 2, (int)(r + 1));
                if (!lua_istable(L, -1))
                    return luaL_error(L, "%s: a batch's rows must be tables of ids, row %d is a %s", DECODE_USAGE,
                                      (int)(r + 1), luaL_typename(L, -1));
                int64_t m;
                int32_t *row = table_ids(L, lua_gettop(L), &m);
                lua_pop(L, 1);
                int st = push_decoded(L, t, row, m, skip);
                free(row);
                if (st) return zr_l_error(L);
                lua_rawseti(L, -2, (int)(r + 1));
            }
            return 1;
        }
        ids = table_ids(L, 2, &n);
    }
    int st = push_decoded(L, t, ids, n, skip);
    free(ids);
    return st ? zr_l_error(L) : 1;
}

static int l_vocab_size(lua_State *L) {
    lua_pushnumber(L, (lua_Number)zr_tokenizer_vocab_size(check_tok(L, 1)));
    return 1;
}
static int push_id(lua_State *L, int32_t id) {
    if (id < 0) lua_pushnil(L);
    else lua_pushinteger(L, id);
    return 1;
}
static int l_token_to_id(lua_State *L) {
    zr_tokenizer *t = check_tok(L, 1);
    return push_id(L, zr_tokenizer_token_to_id(t, check_text(L, 2, "tok:token_to_id(token)", "token", NULL)));
}
static int l_id_to_token(lua_State *L) {
    int64_t len;
    zr_tokenizer *t = check_tok(L, 1);
    if (lua_type(L, 2) != LUA_TNUMBER || !id_ok(lua_tonumber(L, 2))) {
        char got[64];
        describe_number(L, 2, got, sizeof got);
        luaL_error(L, "tok:id_to_token(id): id must be an integer, got %s", got);
    }
    const char *s = zr_tokenizer_id_to_token(t, (int32_t)lua_tonumber(L, 2), &len);
    if (!s) lua_pushnil(L);
    else lua_pushlstring(L, s, (size_t)len);
    return 1;
}
/* tok:use_metaspace(scheme): transformers 5's SentencePiece-BPE pipeline (zr_tokenizer_use_metaspace);
 * scheme "always", "first" or "never". */
static int l_use_metaspace(lua_State *L) {
    zr_tokenizer *t = check_tok(L, 1);
    const char *s = check_text(L, 2, "tok:use_metaspace(prepend_scheme)", "prepend_scheme", NULL);
    int scheme = !strcmp(s, "always") ? ZR_PREPEND_ALWAYS
                 : !strcmp(s, "first") ? ZR_PREPEND_FIRST
                 : !strcmp(s, "never") ? ZR_PREPEND_NEVER
                                       : -1;
    if (scheme < 0) return luaL_error(L, "tok:use_metaspace(prepend_scheme): \"always\", \"first\" or \"never\", got \"%s\"", s);
    if (zr_tokenizer_use_metaspace(t, scheme)) return luaL_error(L, "%s", zr_last_error());
    return 0;
}
/* tok:set_add_prefix_space(on): the ByteLevel pre-tokenizers' flag (zr_tokenizer_set_add_prefix_space). */
static int l_set_add_prefix_space(lua_State *L) {
    zr_tokenizer_set_add_prefix_space(check_tok(L, 1), check_flag(L, 2, 0, "tok:set_add_prefix_space(on)", "on"));
    return 0;
}
/* tok:set_pipeline(json): parts of the pipeline replaced by tokenizer.json's "normalizer", "pre_tokenizer",
 * "decoder" of a JSON object (zr_tokenizer_set_pipeline). */
static int l_set_pipeline(lua_State *L) {
    size_t len;
    zr_tokenizer *t = check_tok(L, 1);
    const char *s = check_text(L, 2, "tok:set_pipeline(json)", "json", &len);
    if (zr_tokenizer_set_pipeline(t, s, len)) return luaL_error(L, "%s", zr_last_error());
    return 0;
}
static int l_bos(lua_State *L) { return push_id(L, zr_tokenizer_bos_id(check_tok(L, 1))); }
static int l_eos(lua_State *L) { return push_id(L, zr_tokenizer_eos_id(check_tok(L, 1))); }
static int l_pad(lua_State *L) { return push_id(L, zr_tokenizer_pad_id(check_tok(L, 1))); }

static const luaL_Reg methods[] = {{"encode", l_encode}, {"decode", l_decode}, {"vocab_size", l_vocab_size},
                                   {"token_to_id", l_token_to_id}, {"id_to_token", l_id_to_token},
                                   {"bos_id", l_bos}, {"eos_id", l_eos}, {"pad_id", l_pad},
                                   {"use_metaspace", l_use_metaspace},
                                   {"set_add_prefix_space", l_set_add_prefix_space},
                                   {"set_pipeline", l_set_pipeline}, {NULL, NULL}};
static const luaL_Reg fns[] = {{"tokenizer_load", l_load}, {NULL, NULL}};

void zr_bind_tokenizer(lua_State *L) {
    zr_l_newclass(L, TOK_MT, l_gc, methods);
    zr_l_register_functions(L, fns);
}
