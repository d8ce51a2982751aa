/* The BPE model: one pre-token ("word") -> ids, exactly as Hugging Face's BPE::tokenize (chars
 * to ids with byte fallback and unk fusing, then merges by lowest rank, leftmost first), plus a
 * word cache shared by all threads behind a mutex. Pre-tokenization lives in encode.c. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/internal.h"
#ifdef ZR_TOKENIZER_HAVE_PCRE2

#define CACHE_MAX_WORD 256          /* bytes; as HF, longer words are not cached */
#define CACHE_MAX_ENTRIES (1 << 18) /* then the cache starts over */
#define SMALL_WORD 48               /* symbols; up to this an O(n^2) scan beats a heap */

static inline int merge_find(const zr_tokenizer *tok, int32_t a, int32_t b, int32_t *rank,
                             int32_t *new_id) {
    if (!tok->merge_keys) return 0;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    h = (h ^ (h >> 31)) & tok->merge_mask;
    for (;; h = (h + 1) & tok->merge_mask) {
        uint64_t k = tok->merge_keys[h];
        if (k == key) {
            *rank = tok->merge_rank[h];
            *new_id = tok->merge_new[h];
            return 1;
        }
        if (k == UINT64_MAX) return 0;
    }
}

/* Symbols of a word before merging: ids and byte lengths, as HF's merge_word builds them. */
typedef struct {
    int32_t *id;
    int64_t n;
} symbols;

static int64_t symbol_cap(const zr_tokenizer *tok, int64_t n) {
    /* one symbol per byte, more only when byte fallback spells out prefix/suffix bytes */
    int64_t pre_n = tok->cont_prefix ? (int64_t)strlen(tok->cont_prefix) : 0;
    int64_t suf_n = tok->eow_suffix ? (int64_t)strlen(tok->eow_suffix) : 0;
    return n * (1 + pre_n) + suf_n;
}

static int32_t lookup_piece(const zr_tokenizer *tok, const char *s, int64_t n) {
    int64_t e = tok_strmap_find(&tok->vocab, s, n);
    return e < 0 ? -1 : tok->vocab.e[e].a;
}

/* Fills sym->id, which has room for symbol_cap(tok, n) entries. */
static int word_symbols(const zr_tokenizer *tok, const char *w, int64_t n, symbols *sym) {
    int32_t unk = -1; /* a pending unk symbol (HF adds it lazily so fuse_unk can extend it) */
    int64_t k = 0;
    const char *pre = tok->cont_prefix, *suf = tok->eow_suffix;
    size_t pre_n = pre ? strlen(pre) : 0, suf_n = suf ? strlen(suf) : 0;
    char tmp[64];
    for (int64_t i = 0; i < n;) {
        int clen = tok_utf8_len((unsigned char)w[i]);
        if (i + clen > n) clen = (int)(n - i);
        int first = i == 0, last = i + clen == n;
        const char *s = w + i;
        int64_t slen = clen;
        int32_t id;
        if ((!pre || first) && (!suf || !last)) {
            int cl;
            uint32_t cp = tok_utf8_decode(s, &cl);
            id = cp < 0x800 ? tok->char_ids[cp] : lookup_piece(tok, s, slen);
        } else {
            slen = (int64_t)((first ? 0 : pre_n) + (size_t)clen + (last ? suf_n : 0));
            char *buf = slen <= (int64_t)sizeof tmp ? tmp : malloc((size_t)slen);
            if (!buf) return -1;
            size_t o = 0;
            if (!first && pre) memcpy(buf, pre, pre_n), o = pre_n;
            memcpy(buf + o, w + i, (size_t)clen);
            o += (size_t)clen;
            if (last && suf) memcpy(buf + o, suf, suf_n);
            id = lookup_piece(tok, buf, slen);
            if (id < 0 && tok->byte_fallback) {
                /* byte fallback covers the bytes of the decorated piece, as in HF */
                int ok = 1;
                for (int64_t b = 0; b < slen; b++)
                    ok &= tok->byte_ids[(unsigned char)buf[b]] >= 0;
                if (ok) {
                    for (int64_t b = 0; b < slen; b++)
                        sym->id[k++] = tok->byte_ids[(unsigned char)buf[b]];
                    if (buf != tmp) free(buf);
                    i += clen;
                    continue;
                }
            }
            if (buf != tmp) free(buf);
            s = NULL;
        }
        if (id >= 0) {
            if (unk >= 0) sym->id[k++] = unk, unk = -1;
            sym->id[k++] = id;
        } else {
            if (s && tok->byte_fallback) {
                int ok = 1;
                for (int b = 0; b < clen; b++)
                    ok &= tok->byte_ids[(unsigned char)s[b]] >= 0;
                if (ok) {
                    /* HF leaves a pending unk pending here, so it lands after these bytes */
                    for (int b = 0; b < clen; b++)
                        sym->id[k++] = tok->byte_ids[(unsigned char)s[b]];
                    i += clen;
                    continue;
                }
            }
            if (tok->unk_id >= 0) {
                if (unk >= 0 && !tok->fuse_unk) sym->id[k++] = unk;
                unk = tok->unk_id;
            }
        }
        i += clen;
    }
    if (unk >= 0) sym->id[k++] = unk;
    sym->n = k;
    return 0;
}

/* Few symbols: repeatedly merge the lowest-ranked adjacent pair, leftmost on ties. This is the
 * order HF's heap produces (its stale entries never win: a pair at a position only changes by
 * growing, and a grown pair has another new id). */
static void merge_small(const zr_tokenizer *tok, int32_t *ids, int64_t *pn) {
    int64_t n = *pn;
    int32_t rank[SMALL_WORD], nid[SMALL_WORD];
    for (int64_t i = 0; i + 1 < n; i++)
        if (!merge_find(tok, ids[i], ids[i + 1], &rank[i], &nid[i])) rank[i] = INT32_MAX;
    while (n > 1) {
        int64_t best = 0;
        for (int64_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == INT32_MAX) break;
        ids[best] = nid[best];
        for (int64_t i = best + 1; i + 1 < n; i++)
            ids[i] = ids[i + 1];
        for (int64_t i = best + 1; i + 2 < n; i++)
            rank[i] = rank[i + 1], nid[i] = nid[i + 1];
        n--;
        if (best > 0 && !merge_find(tok, ids[best - 1], ids[best], &rank[best - 1], &nid[best - 1]))
            rank[best - 1] = INT32_MAX;
        if (best + 1 < n && !merge_find(tok, ids[best], ids[best + 1], &rank[best], &nid[best]))
            rank[best] = INT32_MAX;
    }
    *pn = n;
}

typedef struct {
    uint64_t key; /* rank << 32 | position: the min-heap order of HF's Merge */
    int32_t new_id;
} heap_entry;

static void heap_push(heap_entry *h, int64_t *n, heap_entry e) {
    int64_t i = (*n)++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (h[p].key <= e.key) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static heap_entry heap_pop(heap_entry *h, int64_t *n) {
    heap_entry top = h[0], last = h[--(*n)];
    int64_t i = 0, m = *n;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && h[c + 1].key < h[c].key) c++;
        if (last.key <= h[c].key) break;
        h[i] = h[c];
        i = c;
    }
    if (m) h[i] = last;
    return top;
}

/* Many symbols (long words, whole SentencePiece lines): HF's algorithm with a linked list. */
static int merge_large(const zr_tokenizer *tok, int32_t *ids, int64_t *pn) {
    int64_t n = *pn;
    int32_t *prev = malloc((size_t)n * sizeof *prev), *next = malloc((size_t)n * sizeof *next);
    uint8_t *dead = calloc((size_t)n, 1);
    heap_entry *h = malloc((size_t)(3 * n + 1) * sizeof *h);
    int64_t hn = 0;
    if (!prev || !next || !dead || !h) {
        free(prev), free(next), free(dead), free(h);
        return -1;
    }
    for (int64_t i = 0; i < n; i++)
        prev[i] = (int32_t)i - 1, next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    for (int64_t i = 0; i + 1 < n; i++) {
        int32_t r, nid;
        if (merge_find(tok, ids[i], ids[i + 1], &r, &nid))
            heap_push(h, &hn, (heap_entry){(uint64_t)r << 32 | (uint64_t)i, nid});
    }
    while (hn) {
        heap_entry top = heap_pop(h, &hn);
        int64_t pos = (int64_t)(uint32_t)top.key;
        if (dead[pos] || next[pos] < 0) continue;
        int32_t r, nid, right = next[pos];
        if (!merge_find(tok, ids[pos], ids[right], &r, &nid) || nid != top.new_id) continue;
        ids[pos] = nid;
        dead[right] = 1;
        next[pos] = next[right];
        if (next[right] >= 0) prev[next[right]] = (int32_t)pos;
        if (prev[pos] >= 0 && merge_find(tok, ids[prev[pos]], ids[pos], &r, &nid))
            heap_push(h, &hn, (heap_entry){(uint64_t)r << 32 | (uint64_t)prev[pos], nid});
        if (next[pos] >= 0 && merge_find(tok, ids[pos], ids[next[pos]], &r, &nid))
            heap_push(h, &hn, (heap_entry){(uint64_t)r << 32 | (uint64_t)pos, nid});
    }
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        if (!dead[i]) ids[k++] = ids[i];
    *pn = k;
    free(prev), free(next), free(dead), free(h);
    return 0;
}

static int bpe_piece(const zr_tokenizer *tok, const char *w, int64_t n, tok_ids *out) {
    if (n <= 0) return 0;
    if (tok->ignore_merges) {
        int32_t id = lookup_piece(tok, w, n);
        if (id >= 0) return tok_ids_push(out, id);
    }
    zr_tokenizer *mut = (zr_tokenizer *)tok; /* only the cache changes, under its lock */
    if (n < CACHE_MAX_WORD) {
        pthread_mutex_lock(&mut->cache_lock);
        int64_t e = tok_strmap_find(&tok->cache, w, n);
        if (e >= 0) {
            int32_t off = tok->cache.e[e].a, cnt = tok->cache.e[e].b;
            int rc = tok_ids_reserve(out, cnt);
            if (!rc && cnt) { /* a word may encode to no id: then both buffers may be NULL */
                memcpy(out->v + out->n, tok->cache_ids.v + off, (size_t)cnt * sizeof(int32_t));
                out->n += cnt;
            }
            pthread_mutex_unlock(&mut->cache_lock);
            return rc;
        }
        pthread_mutex_unlock(&mut->cache_lock);
    }
    int32_t small[CACHE_MAX_WORD];
    symbols sym = {small, 0};
    int64_t cap = symbol_cap(tok, n);
    if (cap > CACHE_MAX_WORD && !(sym.id = malloc((size_t)cap * sizeof(int32_t)))) return -1;
    int rc = word_symbols(tok, w, n, &sym);
    if (!rc) {
        if (sym.n <= SMALL_WORD)
            merge_small(tok, sym.id, &sym.n);
        else
            rc = merge_large(tok, sym.id, &sym.n);
    }
    if (!rc && sym.n && !(rc = tok_ids_reserve(out, sym.n))) {
        memcpy(out->v + out->n, sym.id, (size_t)sym.n * sizeof(int32_t));
        out->n += sym.n;
    }
    if (!rc && n < CACHE_MAX_WORD) {
        pthread_mutex_lock(&mut->cache_lock);
        if (mut->cache.n >= CACHE_MAX_ENTRIES) {
            tok_strmap_clear(&mut->cache);
            mut->cache_ids.n = 0;
        }
        if (tok_strmap_find(&tok->cache, w, n) < 0 && !tok_ids_reserve(&mut->cache_ids, sym.n)) {
            int32_t off = (int32_t)mut->cache_ids.n;
            if (sym.n) memcpy(mut->cache_ids.v + off, sym.id, (size_t)sym.n * sizeof(int32_t));
            if (tok_strmap_put(&mut->cache, w, n, off, (int32_t)sym.n) >= 0)
                mut->cache_ids.n += sym.n;
        }
        pthread_mutex_unlock(&mut->cache_lock);
    }
    if (sym.id != small) free(sym.id);
    return rc;
}

/* With split_metaspace, a word is cut before every "▁" that follows another char: no vocab
 * token (so no merge result) spans such a cut, the char "▁" itself is in the vocab (so a
 * pending unk is flushed there anyway), and the pieces give exactly the ids of the whole word.
 * This turns a SentencePiece line into cacheable words. */
int tok_bpe_word(const zr_tokenizer *tok, const char *w, int64_t n, tok_ids *out) {
    if (!tok->split_metaspace) return bpe_piece(tok, w, n, out);
    int64_t start = 0;
    for (int64_t i = 3; i + 3 <= n; i++) {
        const char *h = memchr(w + i, '\xE2', (size_t)(n - i));
        if (!h || h + 3 > w + n) break;
        i = h - w;
        if (h[1] == '\x96' && h[2] == '\x81' && memcmp(h - 3, "\xE2\x96\x81", 3)) {
            if (bpe_piece(tok, w + start, i - start, out)) return -1;
            start = i;
        }
    }
    return bpe_piece(tok, w + start, n - start, out);
}

#endif /* ZR_TOKENIZER_HAVE_PCRE2 */
