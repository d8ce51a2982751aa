/* Fuzz target: the JSON parser (runtime/io/json.c). Any input must parse or fail with a message,
 * never crash or leak; a parsed document is walked through every accessor, and every string must
 * survive zr_json_escape and a second parse byte for byte. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "kernels/base/error.h"

#define FUZZ_ASSERT(c)                                                                              \
    do {                                                                                            \
        if (!(c)) __builtin_trap();                                                                 \
    } while (0)

/* zr_json_escape(s) parsed again must give s back. */
static void check_escape(const char *s, int64_t len) {
    int64_t need = zr_json_escape(NULL, 0, s, len);
    char *buf = malloc((size_t)need + 1);
    FUZZ_ASSERT(buf);
    FUZZ_ASSERT(zr_json_escape(buf, need + 1, s, len) == need && buf[need] == 0);
    zr_json_doc *d = zr_json_parse(buf, need, "escaped");
    FUZZ_ASSERT(d);
    const zr_json *r = zr_json_root(d);
    FUZZ_ASSERT(zr_json_is(r, ZR_JSON_STRING) && r->len == len && !memcmp(r->u.str, s, (size_t)len));
    zr_json_doc_free(d);
    free(buf);
}

static void walk(const zr_json *v, int depth) {
    (void)zr_json_type_name(v);
    (void)zr_json_is_null(v);
    switch (v->type) {
    case ZR_JSON_NUMBER:
        if (v->is_int_literal) FUZZ_ASSERT(v->is_int);
        if (v->is_int) FUZZ_ASSERT((double)v->u.n.i == v->u.n.num);
        break;
    case ZR_JSON_STRING:
        FUZZ_ASSERT(v->u.str[v->len] == 0);
        if (depth < 4) check_escape(v->u.str, v->len);
        break;
    case ZR_JSON_ARRAY:
        FUZZ_ASSERT(zr_json_at(v, -1) == NULL && zr_json_at(v, v->len) == NULL);
        for (int64_t i = 0; i < zr_json_len(v); i++)
            walk(zr_json_at(v, i), depth + 1);
        break;
    case ZR_JSON_OBJECT:
        for (int64_t i = 0; i < zr_json_len(v); i++) {
            const zr_json_member *m = zr_json_member_at(v, i);
            FUZZ_ASSERT(m && m->key[m->key_len] == 0);
            /* a lookup finds this key (the last duplicate's value) */
            const zr_json *got = zr_json_getn(v, m->key, m->key_len);
            FUZZ_ASSERT(got);
            (void)zr_json_get_int(v, m->key, 0);
            (void)zr_json_get_number(v, m->key, 0);
            (void)zr_json_get_string(v, m->key, NULL);
            (void)zr_json_get_bool(v, m->key, 0);
            if (depth < 4) check_escape(m->key, m->key_len);
            walk(&m->value, depth + 1);
        }
        FUZZ_ASSERT(zr_json_member_at(v, v->len) == NULL);
        break;
    default:
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    zr_json_doc *d = zr_json_parse((const char *)data, (int64_t)size, "fuzz.json");
    if (!d) {
        FUZZ_ASSERT(zr_last_error_message()[0]);
        zr_clear_error();
        return 0;
    }
    walk(zr_json_root(d), 0);
    zr_json_doc_free(d);
    return 0;
}
