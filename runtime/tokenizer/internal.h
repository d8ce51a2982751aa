/* Private to the files of runtime/tokenizer/: the loaded tokenizer's tables and the helpers the loader,
 * encoder and decoder share. Nothing outside the tokenizer includes this. */
#ifndef ZR_TOKENIZER_INTERNAL_H
#define ZR_TOKENIZER_INTERNAL_H

#include <stdint.h>

#include "kernels/base/hash.h"
#include "tokenizer/tokenizer.h"

/* PCRE2 (libpcre2-dev) is a dependency; a build without it gets a tokenizer whose load fails
 * with a message (tokenizer.c), so the rest of zrun still builds. */
#if defined(__has_include)
#if __has_include(<pcre2.h>)
#define ZR_TOKENIZER_HAVE_PCRE2 1
#endif
#endif

#ifdef ZR_TOKENIZER_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>

/* ---- string -> (a, b) hash map with its own string pool (keys are NUL-terminated) ---------- */

typedef struct {
    uint32_t off, len; /* key in pool */
    int32_t a, b;      /* values */
} tok_entry;

typedef struct {
    char *pool;
    int64_t pool_n, pool_cap;
    tok_entry *e;
    int64_t n, cap;
    uint64_t *slots; /* hash << 32 | (entry index + 1); 0 = empty */
    uint64_t mask;
} tok_strmap;

/* Inserts or overwrites; returns the entry index or -1 on out of memory. */
int64_t tok_strmap_put(tok_strmap *m, const char *s, int64_t n, int32_t a, int32_t b);
/* Entry index or -1. */
int64_t tok_strmap_find(const tok_strmap *m, const char *s, int64_t n);
void tok_strmap_clear(tok_strmap *m);
void tok_strmap_free(tok_strmap *m);
static inline const char *tok_strmap_key(const tok_strmap *m, int64_t i) {
    return m->pool + m->e[i].off;
}

/* ---- growable buffers -------------------------------------------------------------------- */

typedef struct {
    int32_t *v;
    int64_t n, cap;
} tok_ids;

typedef struct {
    char *v;
    int64_t n, cap;
} tok_buf;

int tok_ids_reserve(tok_ids *a, int64_t extra);
int tok_buf_reserve(tok_buf *b, int64_t extra);
static inline int tok_ids_push(tok_ids *a, int32_t id) {
    if (a->n == a->cap && tok_ids_reserve(a, 1)) return -1;
    a->v[a->n++] = id;
    return 0;
}
int tok_buf_append(tok_buf *b, const char *s, int64_t n);

/* ---- UTF-8 ------------------------------------------------------------------------------- */

/* Length of the char whose lead byte is c (1 for a stray byte). */
static inline int tok_utf8_len(unsigned char c) {
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF8 ? 4 : 1;
}
uint32_t tok_utf8_decode(const char *s, int *len);
int tok_utf8_encode(char *out, uint32_t cp);
/* Length of the UTF-8 sequence at p (n bytes left) if valid (*valid = 1), else of the maximal
 * invalid prefix that Rust's from_utf8_lossy replaces by one U+FFFD (*valid = 0). */
int64_t tok_utf8_step(const unsigned char *p, int64_t n, int *valid);
/* Index of the first byte that is not valid UTF-8, or n. */
int64_t tok_utf8_check(const char *s, int64_t n);
int tok_is_whitespace(uint32_t cp); /* Unicode White_Space, as Rust's char::is_whitespace */

/* ---- pipeline pieces --------------------------------------------------------------------- */

enum { NORM_PREPEND, NORM_REPLACE, NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_LOWERCASE,
       NORM_STRIP, NORM_STRIP_ACCENTS };
typedef struct {
    int kind;
    char *a, *b; /* prepend: a; replace: a -> b */
    int64_t alen, blen;
    int strip_left, strip_right; /* Strip */
} tok_normalizer;

enum { PRE_BYTELEVEL, PRE_SPLIT, PRE_METASPACE };
enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };
typedef struct {
    int kind;
    pcre2_code *re;       /* ByteLevel with use_regex, Split */
    int behavior, invert; /* Split */
    int add_prefix_space; /* ByteLevel */
    char repl[8];         /* Metaspace replacement char, UTF-8 */
    int repl_len, prepend_scheme, split;
} tok_pretok;

enum { DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE };
typedef struct {
    int kind;
    char *a, *b; /* replace a -> b */
    int64_t alen, blen;
    uint32_t strip_char; /* Strip content; Metaspace replacement */
    int64_t start, stop; /* Strip */
    int prepend_scheme;  /* Metaspace */
} tok_decoder;

typedef struct {
    int is_sequence; /* else special ids */
    int32_t *ids;
    int64_t n;
} tok_template_item;

typedef struct {
    int32_t id;
    uint32_t off, len; /* content in added_pool */
    uint8_t special, lstrip, rstrip, single_word, normalized;
} tok_added;

/* Byte trie of added-token strings, for leftmost-longest matching. */
typedef struct {
    int32_t child, sibling, token; /* token: index into added[] or -1 */
    uint8_t byte;
} tok_trie_node;
typedef struct {
    tok_trie_node *nodes;
    int64_t n, cap;
    uint8_t first[256]; /* bytes that start some pattern */
    int empty;
} tok_trie;

struct zr_tokenizer {
    char *path;
    /* BPE model */
    tok_strmap vocab;     /* token -> id (a) */
    int64_t *id_entry;    /* id -> vocab entry index or -1; size n_ids */
    int64_t n_ids;        /* 1 + largest model id */
    uint64_t *merge_keys; /* (left << 32 | right), UINT64_MAX = empty */
    int32_t *merge_rank, *merge_new;
    uint64_t merge_mask;
    int32_t unk_id, byte_ids[256];
    int fuse_unk, byte_fallback, ignore_merges;
    int split_metaspace; /* words may be cut before each "X▁" boundary (see bpe.c) */
    char *cont_prefix, *eow_suffix; /* NULL when absent or empty */
    int32_t char_ids[0x800];        /* one-char tokens below U+0800, -1 absent */
    /* word cache: pre-token -> ids[a .. a+b) in cache_ids */
    pthread_mutex_t cache_lock;
    tok_strmap cache;
    tok_ids cache_ids;
    /* added tokens */
    tok_added *added;
    int64_t n_added;
    int32_t *added_by_id; /* id -> index in added or -1; size vocab_size */
    char *added_pool;
    tok_strmap added_map; /* content -> index in added (a) */
    tok_trie trie_raw, trie_norm;
    pcre2_code *re_word; /* ^\w for single_word */
    /* pipeline */
    tok_normalizer *norm;
    int64_t n_norm;
    tok_pretok *pre;
    int64_t n_pre;
    tok_template_item *tmpl;
    int64_t n_tmpl;
    tok_decoder *dec;
    int64_t n_dec;
    int has_decoder;
    int32_t bos, eos, pad;
    int truncate_left; /* truncation_side "left" (tokenizer_config.json's, else tokenizer.json's direction) */
    int64_t vocab_size;
};

/* pipeline.c: each appends the steps of one tokenizer.json part (null: none) */
struct zr_json;
int tok_load_normalizer(zr_tokenizer *tok, const struct zr_json *o, const char *where);
int tok_load_pretok(zr_tokenizer *tok, const struct zr_json *o);
int tok_load_post(zr_tokenizer *tok, const struct zr_json *o);
int tok_load_decoder(zr_tokenizer *tok, const struct zr_json *o);
/* encode.c: runs the normalizers over s[0..n), appending to out */
int tok_normalize(const zr_tokenizer *tok, const char *s, int64_t n, tok_buf *out);
/* normalize.c: the Unicode normalizers (NORM_NFC .. NORM_STRIP_ACCENTS) over s[0..n), appending
 * to out (-1: out of memory); tok_have_unicode() is 0 in a build without utf8proc, which has
 * only Strip */
int tok_normalize_unicode(const tok_normalizer *nm, const char *s, int64_t n, tok_buf *out);
int tok_have_unicode(void);
/* bpe.c */
int tok_bpe_word(const zr_tokenizer *tok, const char *w, int64_t n, tok_ids *out);
/* util.c: byte <-> char tables of the ByteLevel pre-tokenizer and decoder */
extern char tok_byte_char[256][3];
extern uint8_t tok_byte_char_len[256];
void tok_bytelevel_init(void);
int tok_char_to_byte(uint32_t cp); /* -1 if cp is not one of the 256 chars */

#endif /* ZR_TOKENIZER_HAVE_PCRE2 */

#endif
