/* Strict JSON DOM parser (see json.h): recursive descent into an arena, children collected on a
 * scratch stack and copied out when their array/object closes, hash index for objects with more
 * than 8 members. Numbers are parsed in the C locale whatever setlocale() says. */
#define _GNU_SOURCE
#include "io/json.h"

#include <locale.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/base/error.h"
#include "kernels/base/hash.h"

#define JSON_MAX_DEPTH 512
#define ARENA_BLOCK (1 << 20)

typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    _Alignas(16) char data[];
} arena_block;

struct zr_json_doc {
    arena_block *blocks;
    zr_json root;
};

typedef struct {
    const char *start, *p, *end;
    const char *name;
    zr_json_doc *doc;
    zr_json_member *stack; /* children of the open arrays/objects */
    int64_t stack_n, stack_cap;
    int depth;
} parser;

static void *arena_alloc(zr_json_doc *doc, size_t n) {
    n = (n + 15) & ~(size_t)15;
    arena_block *b = doc->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > ARENA_BLOCK ? n : ARENA_BLOCK;
        b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->cap = cap;
        b->used = 0;
        b->next = doc->blocks;
        doc->blocks = b;
    }
    void *r = b->data + b->used;
    b->used += n;
    return r;
}

/* ---- errors ---------------------------------------------------------------------------- */

static void describe_at(const parser *ps, const char *at, char *buf, size_t cap) {
    if (at >= ps->end)
        snprintf(buf, cap, "end of input");
    else if (*at >= 0x20 && *at < 0x7f)
        snprintf(buf, cap, "'%c'", *at);
    else
        snprintf(buf, cap, "byte 0x%02X", (unsigned char)*at);
}

static int fail_at(parser *ps, const char *at, const char *what) {
    int64_t line = 1, col = 1;
    for (const char *q = ps->start; q < at && q < ps->end; q++) {
        if (*q == '\n')
            line++, col = 1;
        else
            col++;
    }
    char got[32];
    describe_at(ps, at, got, sizeof got);
    return zr_error("%s:%lld:%lld: expected %s, got %s", ps->name, (long long)line, (long long)col,
                    what, got);
}

/* ---- helpers --------------------------------------------------------------------------- */

static void skip_ws(parser *ps) {
    const char *p = ps->p;
    while (p < ps->end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    ps->p = p;
}

static int push(parser *ps, const zr_json_member *m) {
    if (ps->stack_n == ps->stack_cap) {
        int64_t cap = ps->stack_cap ? ps->stack_cap * 2 : 256;
        zr_json_member *s = realloc(ps->stack, (size_t)cap * sizeof *s);
        if (!s) return zr_error("%s: out of memory", ps->name);
        ps->stack = s;
        ps->stack_cap = cap;
    }
    ps->stack[ps->stack_n++] = *m;
    return 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_hex4(parser *ps, const char *p, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int h = p + i < ps->end ? hexval(p[i]) : -1;
        if (h < 0) return fail_at(ps, p + i, "4 hex digits after \\u");
        v = v * 16 + (uint32_t)h;
    }
    *out = v;
    return 0;
}

static char *put_utf8(char *o, uint32_t c) {
    if (c < 0x80)
        *o++ = (char)c;
    else if (c < 0x800)
        *o++ = (char)(0xC0 | c >> 6), *o++ = (char)(0x80 | (c & 63));
    else if (c < 0x10000)
        *o++ = (char)(0xE0 | c >> 12), *o++ = (char)(0x80 | (c >> 6 & 63)),
        *o++ = (char)(0x80 | (c & 63));
    else
        *o++ = (char)(0xF0 | c >> 18), *o++ = (char)(0x80 | (c >> 12 & 63)),
        *o++ = (char)(0x80 | (c >> 6 & 63)), *o++ = (char)(0x80 | (c & 63));
    return o;
}

/* Length of the valid UTF-8 sequence at p (lead byte >= 0x80), or 0. */
static int utf8_valid_len(const unsigned char *p, const unsigned char *end) {
    unsigned c = p[0];
    int n;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F; /* no UTF-16 surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 0;
    if (end - p < n) return 0;
    if (p[1] < lo || p[1] > hi) return 0;
    for (int i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF) return 0;
    return n;
}

/* ---- values ---------------------------------------------------------------------------- */

static int parse_value(parser *ps, zr_json *out);

static int parse_string(parser *ps, const char **str, int64_t *len) {
    const char *q = ps->p + 1; /* after the opening quote */
    const char *close = q;
    while (close < ps->end && *close != '"')
        close += (*close == '\\') ? 2 : 1;
    if (close >= ps->end) return fail_at(ps, ps->end, "'\"' to close the string");
    char *buf = arena_alloc(ps->doc, (size_t)(close - q) + 1), *o = buf;
    if (!buf) return zr_error("%s: out of memory", ps->name);
    while (q < close) {
        unsigned char c = (unsigned char)*q;
        if (c >= 0x20 && c != '\\' && c < 0x80) {
            *o++ = (char)c;
            q++;
        } else if (c >= 0x80) {
            int n = utf8_valid_len((const unsigned char *)q, (const unsigned char *)close);
            if (!n) return fail_at(ps, q, "valid UTF-8 in string");
            memcpy(o, q, (size_t)n);
            o += n;
            q += n;
        } else if (c < 0x20) {
            return fail_at(ps, q, "a string character (control characters must be escaped)");
        } else { /* backslash */
            char e = q[1];
            q += 2;
            switch (e) {
            case '"':
                *o++ = '"';
                break;
            case '\\':
                *o++ = '\\';
                break;
            case '/':
                *o++ = '/';
                break;
            case 'b':
                *o++ = '\b';
                break;
            case 'f':
                *o++ = '\f';
                break;
            case 'n':
                *o++ = '\n';
                break;
            case 'r':
                *o++ = '\r';
                break;
            case 't':
                *o++ = '\t';
                break;
            case 'u': {
                uint32_t cp = 0;
                if (read_hex4(ps, q, &cp)) return ZR_ERR;
                q += 4;
                if (cp >= 0xDC00 && cp <= 0xDFFF)
                    return fail_at(ps, q - 6,
                                   "a high surrogate before a low one (\\uDC00-\\uDFFF)");
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    uint32_t lo = 0;
                    if (q + 1 >= ps->end || q[0] != '\\' || q[1] != 'u')
                        return fail_at(ps, q, "a \\uDC00-\\uDFFF low surrogate after a high one");
                    if (read_hex4(ps, q + 2, &lo)) return ZR_ERR;
                    if (lo < 0xDC00 || lo > 0xDFFF)
                        return fail_at(ps, q, "a \\uDC00-\\uDFFF low surrogate after a high one");
                    q += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                o = put_utf8(o, cp);
                break;
            }
            default:
                return fail_at(ps, q - 1, "an escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
            }
        }
    }
    *o = 0;
    *str = buf;
    *len = o - buf;
    ps->p = close + 1;
    return 0;
}

static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;
static void c_locale_init(void) {
    c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
}

static int parse_number(parser *ps, zr_json *out) {
    const char *p = ps->p, *s = p, *end = ps->end;
    int neg = 0, simple = 1;
    if (p < end && *p == '-') neg = 1, p++;
    if (p >= end || *p < '0' || *p > '9') return fail_at(ps, p, "a digit");
    uint64_t mag = 0;
    int overflow = 0;
    if (*p == '0')
        p++;
    else
        for (; p < end && *p >= '0' && *p <= '9'; p++) {
            if (mag > (UINT64_MAX - 9) / 10) overflow = 1;
            mag = mag * 10 + (uint64_t)(*p - '0');
        }
    if (p < end && *p == '.') {
        simple = 0, p++;
        if (p >= end || *p < '0' || *p > '9') return fail_at(ps, p, "a digit after '.'");
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        simple = 0, p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return fail_at(ps, p, "a digit in the exponent");
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    }
    out->type = ZR_JSON_NUMBER;
    if (simple && !overflow && mag <= (uint64_t)INT64_MAX + (uint64_t)neg) {
        out->is_int = out->is_int_literal = 1;
        out->u.n.i = neg ? (int64_t)(0 - mag) : (int64_t)mag;
        out->u.n.num = (double)out->u.n.i;
    } else {
        char tmp[64], *big = NULL, *buf = tmp;
        size_t n = (size_t)(p - s);
        if (n >= sizeof tmp && !(buf = big = malloc(n + 1)))
            return zr_error("%s: out of memory", ps->name);
        memcpy(buf, s, n);
        buf[n] = 0;
        pthread_once(&c_locale_once, c_locale_init);
        double d = c_locale ? strtod_l(buf, NULL, c_locale) : strtod(buf, NULL);
        free(big);
        out->u.n.num = d;
        /* Digits alone reach here only when out of int64 range. Range before the cast: converting
         * a double outside int64 (1e400 is inf) is undefined behaviour. */
        out->is_int = !simple && d >= -9223372036854775808.0 && d < 9223372036854775808.0 &&
                      d == (double)(int64_t)d;
        out->u.n.i = out->is_int ? (int64_t)d : 0;
    }
    ps->p = p;
    return 0;
}

static int expect_word(parser *ps, const char *w, zr_json_type t, zr_json *out) {
    size_t n = strlen(w);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, w, n) != 0)
        return fail_at(ps, ps->p, "a value (object, array, string, number, true, false, null)");
    ps->p += n;
    out->type = (uint8_t)t;
    return 0;
}

static int close_container(parser *ps, int64_t base, int is_object, zr_json *out) {
    int64_t n = ps->stack_n - base;
    out->len = n;
    if (!is_object) {
        out->type = ZR_JSON_ARRAY;
        zr_json *items = n ? arena_alloc(ps->doc, (size_t)n * sizeof *items) : NULL;
        if (n && !items) return zr_error("%s: out of memory", ps->name);
        for (int64_t i = 0; i < n; i++)
            items[i] = ps->stack[base + i].value;
        out->u.items = items;
    } else {
        out->type = ZR_JSON_OBJECT;
        zr_json_member *m = n ? arena_alloc(ps->doc, (size_t)n * sizeof *m) : NULL;
        if (n && !m) return zr_error("%s: out of memory", ps->name);
        if (n) memcpy(m, ps->stack + base, (size_t)n * sizeof *m);
        out->u.o.members = m;
        out->u.o.index = NULL;
        if (n > 8) {
            uint32_t size = 16;
            while (size < 2 * (uint64_t)n)
                size *= 2;
            uint32_t *idx = arena_alloc(ps->doc, size * sizeof *idx);
            if (!idx) return zr_error("%s: out of memory", ps->name);
            memset(idx, 0, size * sizeof *idx);
            for (int64_t i = 0; i < n; i++) {
                uint32_t h = (uint32_t)zr_hash_bytes(m[i].key, m[i].key_len) & (size - 1);
                while (idx[h]) {
                    const zr_json_member *o = &m[idx[h] - 1];
                    if (o->key_len == m[i].key_len && !memcmp(o->key, m[i].key, (size_t)o->key_len))
                        break; /* duplicate key: the later one wins */
                    h = (h + 1) & (size - 1);
                }
                idx[h] = (uint32_t)i + 1;
            }
            out->u.o.index = idx;
            out->u.o.index_mask = size - 1;
        }
    }
    ps->stack_n = base;
    return 0;
}

static int parse_container(parser *ps, zr_json *out, int is_object) {
    if (++ps->depth > JSON_MAX_DEPTH) return fail_at(ps, ps->p, "at most 512 levels of nesting");
    char closer = is_object ? '}' : ']';
    int64_t base = ps->stack_n;
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == closer) {
        ps->p++;
    } else {
        for (;;) {
            zr_json_member m;
            memset(&m, 0, sizeof m);
            if (is_object) {
                if (ps->p >= ps->end || *ps->p != '"')
                    return fail_at(ps, ps->p,
                                   ps->stack_n == base ? "'\"' to start a key or '}'"
                                                       : "'\"' to start a key");
                if (parse_string(ps, &m.key, &m.key_len)) return ZR_ERR;
                skip_ws(ps);
                if (ps->p >= ps->end || *ps->p != ':')
                    return fail_at(ps, ps->p, "':' after the object key");
                ps->p++;
                skip_ws(ps);
            }
            if (parse_value(ps, &m.value)) return ZR_ERR;
            if (push(ps, &m)) return ZR_ERR;
            skip_ws(ps);
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                skip_ws(ps);
                continue;
            }
            if (ps->p < ps->end && *ps->p == closer) {
                ps->p++;
                break;
            }
            return fail_at(ps, ps->p,
                           is_object ? "',' or '}' after an object member"
                                     : "',' or ']' after an array element");
        }
    }
    ps->depth--;
    return close_container(ps, base, is_object, out);
}

static int parse_value(parser *ps, zr_json *out) {
    memset(out, 0, sizeof *out);
    if (ps->p >= ps->end)
        return fail_at(ps, ps->p, "a value (object, array, string, number, true, false, null)");
    switch (*ps->p) {
    case '{':
        return parse_container(ps, out, 1);
    case '[':
        return parse_container(ps, out, 0);
    case '"':
        out->type = ZR_JSON_STRING;
        return parse_string(ps, &out->u.str, &out->len);
    case 't':
        return expect_word(ps, "true", ZR_JSON_TRUE, out);
    case 'f':
        return expect_word(ps, "false", ZR_JSON_FALSE, out);
    case 'n':
        return expect_word(ps, "null", ZR_JSON_NULL, out);
    default:
        if (*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9')) return parse_number(ps, out);
        return fail_at(ps, ps->p, "a value (object, array, string, number, true, false, null)");
    }
}

/* ---- public ---------------------------------------------------------------------------- */

zr_json_doc *zr_json_parse(const char *text, int64_t len, const char *name) {
    zr_json_doc *doc = calloc(1, sizeof *doc);
    if (!doc) return zr_error_null("%s: out of memory", name);
    parser ps = {
        .start = text, .p = text, .end = text + len, .name = name ? name : "json", .doc = doc};
    skip_ws(&ps);
    int rc = parse_value(&ps, &doc->root);
    if (!rc) {
        skip_ws(&ps);
        if (ps.p < ps.end) rc = fail_at(&ps, ps.p, "end of input after the top-level value");
    }
    free(ps.stack);
    if (rc) {
        zr_json_doc_free(doc);
        return NULL;
    }
    return doc;
}

zr_json_doc *zr_json_parse_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return zr_error_null("%s: cannot open (%m)", path);
    char *buf = NULL;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return zr_error_null("%s: cannot determine the file size", path);
    }
    buf = malloc((size_t)size + 1);
    if (!buf) {
        fclose(f);
        return zr_error_null("%s: out of memory reading %ld bytes", path, size);
    }
    size_t got = fread(buf, 1, (size_t)size, f);
    fclose(f);
    if (got != (size_t)size) {
        free(buf);
        return zr_error_null("%s: short read (%zu of %ld bytes)", path, got, size);
    }
    zr_json_doc *doc = zr_json_parse(buf, size, path);
    free(buf);
    return doc;
}

void zr_json_doc_free(zr_json_doc *doc) {
    if (!doc) return;
    for (arena_block *b = doc->blocks, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    free(doc);
}

const zr_json *zr_json_root(const zr_json_doc *doc) {
    return doc ? &doc->root : NULL;
}

const zr_json *zr_json_getn(const zr_json *obj, const char *key, int64_t key_len) {
    if (!obj || obj->type != ZR_JSON_OBJECT) return NULL;
    const zr_json_member *m = obj->u.o.members;
    if (obj->u.o.index) {
        uint32_t mask = obj->u.o.index_mask, h = (uint32_t)zr_hash_bytes(key, key_len) & mask;
        for (uint32_t e; (e = obj->u.o.index[h]); h = (h + 1) & mask)
            if (m[e - 1].key_len == key_len && !memcmp(m[e - 1].key, key, (size_t)key_len))
                return &m[e - 1].value;
        return NULL;
    }
    for (int64_t i = obj->len - 1; i >= 0; i--)
        if (m[i].key_len == key_len && !memcmp(m[i].key, key, (size_t)key_len)) return &m[i].value;
    return NULL;
}

const zr_json *zr_json_get(const zr_json *obj, const char *key) {
    return zr_json_getn(obj, key, (int64_t)strlen(key));
}

const zr_json *zr_json_at(const zr_json *arr, int64_t i) {
    if (!arr || arr->type != ZR_JSON_ARRAY || i < 0 || i >= arr->len) return NULL;
    return &arr->u.items[i];
}

const zr_json_member *zr_json_member_at(const zr_json *obj, int64_t i) {
    if (!obj || obj->type != ZR_JSON_OBJECT || i < 0 || i >= obj->len) return NULL;
    return &obj->u.o.members[i];
}

int64_t zr_json_len(const zr_json *v) {
    if (!v) return 0;
    return (v->type == ZR_JSON_ARRAY || v->type == ZR_JSON_OBJECT || v->type == ZR_JSON_STRING)
               ? v->len
               : 0;
}

int zr_json_is(const zr_json *v, zr_json_type type) {
    return v && v->type == type;
}
int zr_json_is_null(const zr_json *v) {
    return !v || v->type == ZR_JSON_NULL;
}

const char *zr_json_get_string(const zr_json *obj, const char *key, const char *dflt) {
    const zr_json *v = zr_json_get(obj, key);
    return v && v->type == ZR_JSON_STRING ? v->u.str : dflt;
}

int64_t zr_json_get_int(const zr_json *obj, const char *key, int64_t dflt) {
    const zr_json *v = zr_json_get(obj, key);
    return v && v->type == ZR_JSON_NUMBER && v->is_int ? v->u.n.i : dflt;
}

double zr_json_get_number(const zr_json *obj, const char *key, double dflt) {
    const zr_json *v = zr_json_get(obj, key);
    return v && v->type == ZR_JSON_NUMBER ? v->u.n.num : dflt;
}

int zr_json_get_bool(const zr_json *obj, const char *key, int dflt) {
    const zr_json *v = zr_json_get(obj, key);
    if (v && v->type == ZR_JSON_TRUE) return 1;
    if (v && v->type == ZR_JSON_FALSE) return 0;
    return dflt;
}

const char *zr_json_type_name(const zr_json *v) {
    static const char *names[] = {"null", "false", "true", "number", "string", "array", "object"};
    return v ? names[v->type] : "absent";
}

int64_t zr_json_escape(char *dst, int64_t cap, const char *s, int64_t len) {
    int64_t n = 0;
#define PUT(c)                                                                                     \
    do {                                                                                           \
        if (n + 1 < cap) dst[n] = (c);                                                             \
        n++;                                                                                       \
    } while (0)
    PUT('"');
    for (int64_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        switch (c) {
        case '"':
            esc = "\\\"";
            break;
        case '\\':
            esc = "\\\\";
            break;
        case '\n':
            esc = "\\n";
            break;
        case '\r':
            esc = "\\r";
            break;
        case '\t':
            esc = "\\t";
            break;
        case '\b':
            esc = "\\b";
            break;
        case '\f':
            esc = "\\f";
            break;
        }
        if (esc) {
            PUT(esc[0]);
            PUT(esc[1]);
        } else if (c < 0x20) {
            char u[7];
            snprintf(u, sizeof u, "\\u%04x", c);
            for (int k = 0; k < 6; k++)
                PUT(u[k]);
        } else
            PUT((char)c);
    }
    PUT('"');
#undef PUT
    if (cap > 0) dst[n < cap ? n : cap - 1] = 0;
    return n;
}
