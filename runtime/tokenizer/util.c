/* Small helpers for the tokenizer: a string hash map with its own pool, growable buffers,
 * UTF-8 utilities and the GPT-2 byte <-> char table of ByteLevel. No tokenizer logic here. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/internal.h"
#ifdef ZR_TOKENIZER_HAVE_PCRE2

static int strmap_grow_slots(tok_strmap *m) {
    uint64_t size = m->slots ? (m->mask + 1) * 2 : 64;
    uint64_t *s = calloc(size, sizeof *s);
    if (!s) return -1;
    for (uint64_t i = 0; m->slots && i <= m->mask; i++) {
        uint64_t v = m->slots[i];
        if (!v) continue;
        uint64_t h = (v >> 32) & (size - 1);
        while (s[h])
            h = (h + 1) & (size - 1);
        s[h] = v;
    }
    free(m->slots);
    m->slots = s;
    m->mask = size - 1;
    return 0;
}

int64_t tok_strmap_find(const tok_strmap *m, const char *s, int64_t n) {
    if (!m->slots) return -1;
    uint32_t h32 = (uint32_t)(zr_hash_bytes(s, n) >> 32);
    for (uint64_t h = h32 & m->mask;; h = (h + 1) & m->mask) {
        uint64_t v = m->slots[h];
        if (!v) return -1;
        if ((uint32_t)(v >> 32) != h32) continue;
        const tok_entry *e = &m->e[(uint32_t)v - 1];
        if (e->len == (uint32_t)n && !memcmp(m->pool + e->off, s, (size_t)n))
            return (uint32_t)v - 1;
    }
}

int64_t tok_strmap_put(tok_strmap *m, const char *s, int64_t n, int32_t a, int32_t b) {
    int64_t i = tok_strmap_find(m, s, n);
    if (i >= 0) {
        m->e[i].a = a;
        m->e[i].b = b;
        return i;
    }
    if ((!m->slots || (uint64_t)(m->n + 1) * 2 > m->mask + 1) && strmap_grow_slots(m)) return -1;
    if (m->n == m->cap) {
        int64_t cap = m->cap ? m->cap * 2 : 64;
        tok_entry *e = realloc(m->e, (size_t)cap * sizeof *e);
        if (!e) return -1;
        m->e = e;
        m->cap = cap;
    }
    if (m->pool_n + n + 1 > m->pool_cap) {
        int64_t cap = m->pool_cap ? m->pool_cap * 2 : 4096;
        while (cap < m->pool_n + n + 1)
            cap *= 2;
        char *p = realloc(m->pool, (size_t)cap);
        if (!p) return -1;
        m->pool = p;
        m->pool_cap = cap;
    }
    if (m->pool_n + n + 1 > UINT32_MAX) return -1;
    memcpy(m->pool + m->pool_n, s, (size_t)n);
    m->pool[m->pool_n + n] = 0;
    m->e[m->n] = (tok_entry){(uint32_t)m->pool_n, (uint32_t)n, a, b};
    m->pool_n += n + 1;
    uint32_t h32 = (uint32_t)(zr_hash_bytes(s, n) >> 32);
    uint64_t h = h32 & m->mask;
    while (m->slots[h])
        h = (h + 1) & m->mask;
    m->slots[h] = (uint64_t)h32 << 32 | (uint64_t)(m->n + 1);
    return m->n++;
}

void tok_strmap_clear(tok_strmap *m) {
    if (m->slots) memset(m->slots, 0, (m->mask + 1) * sizeof *m->slots);
    m->n = 0;
    m->pool_n = 0;
}

void tok_strmap_free(tok_strmap *m) {
    free(m->pool);
    free(m->e);
    free(m->slots);
    memset(m, 0, sizeof *m);
}

int tok_ids_reserve(tok_ids *a, int64_t extra) {
    if (a->n + extra <= a->cap) return 0;
    int64_t cap = a->cap ? a->cap * 2 : 256;
    while (cap < a->n + extra)
        cap *= 2;
    int32_t *v = realloc(a->v, (size_t)cap * sizeof *v);
    if (!v) return -1;
    a->v = v;
    a->cap = cap;
    return 0;
}

int tok_buf_reserve(tok_buf *b, int64_t extra) {
    if (b->n + extra <= b->cap) return 0;
    int64_t cap = b->cap ? b->cap * 2 : 1024;
    while (cap < b->n + extra)
        cap *= 2;
    char *v = realloc(b->v, (size_t)cap);
    if (!v) return -1;
    b->v = v;
    b->cap = cap;
    return 0;
}

int tok_buf_append(tok_buf *b, const char *s, int64_t n) {
    if (tok_buf_reserve(b, n + 1)) return -1;
    if (n) memcpy(b->v + b->n, s, (size_t)n);
    b->n += n;
    b->v[b->n] = 0;
    return 0;
}

uint32_t tok_utf8_decode(const char *s, int *len) {
    const unsigned char *p = (const unsigned char *)s;
    int n = tok_utf8_len(p[0]);
    *len = n;
    switch (n) {
    case 1:
        return p[0];
    case 2:
        return (uint32_t)(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
    case 3:
        return (uint32_t)(p[0] & 0x0F) << 12 | (uint32_t)(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
    default:
        return (uint32_t)(p[0] & 0x07) << 18 | (uint32_t)(p[1] & 0x3F) << 12 |
               (uint32_t)(p[2] & 0x3F) << 6 | (p[3] & 0x3F);
    }
}

int tok_utf8_encode(char *o, uint32_t c) {
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xC0 | c >> 6), o[1] = (char)(0x80 | (c & 63));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | c >> 12), o[1] = (char)(0x80 | (c >> 6 & 63));
        o[2] = (char)(0x80 | (c & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | c >> 18), o[1] = (char)(0x80 | (c >> 12 & 63));
    o[2] = (char)(0x80 | (c >> 6 & 63)), o[3] = (char)(0x80 | (c & 63));
    return 4;
}

/* Length of the UTF-8 sequence at p if valid (*valid = 1), else of the maximal invalid prefix
 * that Rust's from_utf8_lossy replaces by one U+FFFD (*valid = 0). */
int64_t tok_utf8_step(const unsigned char *p, int64_t n, int *valid) {
    unsigned c = p[0];
    int len;
    unsigned lo = 0x80, hi = 0xBF;
    *valid = 0;
    if (c < 0x80) return *valid = 1, 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else
        return 1;
    if (n < 2 || p[1] < lo || p[1] > hi) return 1;
    int i = 2;
    while (i < len && i < n && (p[i] & 0xC0) == 0x80)
        i++;
    if (i == len) *valid = 1;
    return i;
}

int64_t tok_utf8_check(const char *s, int64_t n) {
    const unsigned char *p = (const unsigned char *)s;
    int64_t i = 0;
    while (i < n) {
        /* ASCII fast path, 8 bytes at a time */
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        unsigned c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int valid;
        int64_t len = tok_utf8_step(p + i, n - i, &valid);
        if (!valid) return i;
        i += len;
    }
    return n;
}

int tok_is_whitespace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
 * map to U+0100.. in byte order, so every byte becomes a visible char. */
char tok_byte_char[256][3];
uint8_t tok_byte_char_len[256];
static int16_t char_to_byte[0x144];
static pthread_once_t bytelevel_once = PTHREAD_ONCE_INIT;

static void bytelevel_build(void) {
    int extra = 0;
    for (int i = 0; i < 0x144; i++)
        char_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        uint32_t cp = printable ? (uint32_t)b : 256u + (uint32_t)extra++;
        tok_byte_char_len[b] = (uint8_t)tok_utf8_encode(tok_byte_char[b], cp);
        char_to_byte[cp] = (int16_t)b;
    }
}

void tok_bytelevel_init(void) {
    pthread_once(&bytelevel_once, bytelevel_build);
}

int tok_char_to_byte(uint32_t cp) {
    return cp < 0x144 ? char_to_byte[cp] : -1;
}

#endif /* ZR_TOKENIZER_HAVE_PCRE2 */
