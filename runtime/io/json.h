/* Strict JSON (RFC 8259) DOM parser: one arena per document, members kept in file order with a
 * hash index on big objects, errors as "name:line:col: expected X, got Y". Used for tokenizer.json
 * and safetensors headers. Not a streaming parser and not a general JSON writer (only escaping).
 *
 *   zr_json_doc *doc = zr_json_parse_file("tokenizer.json");     // NULL + zr_last_error()
 *   const zr_json *model = zr_json_get(zr_json_root(doc), "model");
 *   const char *type = zr_json_get_string(model, "type", "BPE"); // default when absent
 *   for (int64_t i = 0; i < zr_json_len(arr); i++) use(zr_json_at(arr, i));
 *   zr_json_doc_free(doc);                                        // frees every value
 */
#ifndef ZR_JSON_H
#define ZR_JSON_H

#include <stdint.h>

typedef enum {
    ZR_JSON_NULL,
    ZR_JSON_FALSE,
    ZR_JSON_TRUE,
    ZR_JSON_NUMBER,
    ZR_JSON_STRING,
    ZR_JSON_ARRAY,
    ZR_JSON_OBJECT,
} zr_json_type;

typedef struct zr_json zr_json;
typedef struct zr_json_member zr_json_member;

/* A value. Everything it points to lives in its document's arena. */
struct zr_json {
    uint8_t type;   /* zr_json_type */
    uint8_t is_int; /* number: integral and representable as int64 (then i is exact) */
    uint8_t is_int_literal; /* number: is_int and written as digits only (no fraction, no
                             * exponent): what a schema asking for an integer accepts (2e0
                             * and 3.0 are integral values but not integers as written) */
    int64_t len;    /* string: bytes (without the NUL); array/object: element count */
    union {
        struct {
            double num;
            int64_t i;
        } n;
        const char *str; /* NUL-terminated UTF-8 (may also contain \u0000 as a 0 byte) */
        const zr_json *items;
        struct {
            const zr_json_member *members; /* file order */
            const uint32_t *index;         /* open-addressing table (member idx + 1), or NULL */
            uint32_t index_mask;
        } o;
    } u;
};

struct zr_json_member {
    const char *key; /* NUL-terminated */
    int64_t key_len;
    zr_json value;
};

typedef struct zr_json_doc zr_json_doc;

/* Parses text[0..len). name appears in error messages (a file name, or "safetensors header"). */
zr_json_doc *zr_json_parse(const char *text, int64_t len, const char *name);
/* Reads and parses a file; the path is the name in error messages. */
zr_json_doc *zr_json_parse_file(const char *path);
void zr_json_doc_free(zr_json_doc *doc);
const zr_json *zr_json_root(const zr_json_doc *doc);

/* Access helpers; all accept NULL and wrong types (returning NULL / 0 / the default). */
const zr_json *zr_json_get(const zr_json *obj, const char *key); /* last duplicate wins */
const zr_json *zr_json_getn(const zr_json *obj, const char *key, int64_t key_len);
const zr_json *zr_json_at(const zr_json *arr, int64_t i);
const zr_json_member *zr_json_member_at(const zr_json *obj, int64_t i);
int64_t zr_json_len(const zr_json *v); /* array/object count, string bytes, else 0 */
int zr_json_is(const zr_json *v, zr_json_type type);
int zr_json_is_null(const zr_json *v); /* absent (NULL) or JSON null */
const char *zr_json_get_string(const zr_json *obj, const char *key, const char *dflt);
int64_t zr_json_get_int(const zr_json *obj, const char *key, int64_t dflt);
double zr_json_get_number(const zr_json *obj, const char *key, double dflt);
int zr_json_get_bool(const zr_json *obj, const char *key, int dflt);
const char *zr_json_type_name(const zr_json *v); /* "null", "string", ..., "absent" */

/* Writes s[0..len) as a quoted JSON string into dst (at most cap bytes, NUL-terminated when
 * cap > 0) and returns the full length it needs without the NUL, like snprintf. Bytes >= 0x80
 * are copied as they are; control characters become \n, \t, ... or \u00XX. */
int64_t zr_json_escape(char *dst, int64_t cap, const char *s, int64_t len);

#endif
