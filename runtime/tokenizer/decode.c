/* Decoding ids back to text: ids -> token strings -> the decoder chain of tokenizer.json
 * (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace), each step a list -> list function
 * as in Hugging Face's decode_chain, joined at the end. */
#include <stdlib.h>
#include <string.h>

#include "kernels/base/error.h"
#include "tokenizer/internal.h"
#ifdef ZR_TOKENIZER_HAVE_PCRE2

typedef struct {
    tok_buf buf;
    int64_t *off, *len;
    int64_t n, cap;
} strlist;

static int list_add(strlist *l, const char *s, int64_t n) {
    if (l->n == l->cap) {
        int64_t cap = l->cap ? l->cap * 2 : 64;
        int64_t *o = realloc(l->off, (size_t)cap * sizeof *o), *q;
        if (!o) return -1;
        l->off = o;
        if (!(q = realloc(l->len, (size_t)cap * sizeof *q))) return -1;
        l->len = q;
        l->cap = cap;
    }
    l->off[l->n] = l->buf.n;
    l->len[l->n] = n;
    if (tok_buf_append(&l->buf, s, n)) return -1;
    l->n++;
    return 0;
}

/* Appends to the last string (which must be the last thing in buf). */
static int list_extend(strlist *l, const char *s, int64_t n) {
    if (tok_buf_append(&l->buf, s, n)) return -1;
    l->len[l->n - 1] += n;
    return 0;
}

static void list_free(strlist *l) {
    free(l->buf.v), free(l->off), free(l->len);
    memset(l, 0, sizeof *l);
}

#define ITEM(l, i) ((l)->buf.v + (l)->off[i])

static int add_lossy(strlist *l, const char *s, int64_t n) {
    if (list_add(l, "", 0)) return -1;
    for (int64_t i = 0; i < n;) {
        int valid;
        int64_t k = tok_utf8_step((const unsigned char *)s + i, n - i, &valid);
        if (list_extend(l, valid ? s + i : "\xEF\xBF\xBD", valid ? k : 3)) return -1;
        i += k;
    }
    return 0;
}

static int is_valid_utf8(const char *s, int64_t n) {
    return tok_utf8_check(s, n) == n;
}

static int byte_token(const char *s, int64_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int h = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

static int apply(const tok_decoder *d, const strlist *in, strlist *out) {
    tok_buf tmp = {0};
    int rc = 0;
    switch (d->kind) {
    case DEC_BYTELEVEL: /* every token's chars back to bytes; a token with a foreign char as is */
        for (int64_t i = 0; i < in->n && !rc; i++) {
            const char *s = ITEM(in, i);
            int64_t n = in->len[i], start = tmp.n;
            for (int64_t j = 0; j < n && !rc;) {
                int cl, b = tok_char_to_byte(tok_utf8_decode(s + j, &cl));
                if (b < 0) {
                    tmp.n = start;
                    rc = tok_buf_append(&tmp, s, n);
                    break;
                }
                char cb = (char)b;
                rc = tok_buf_append(&tmp, &cb, 1);
                j += cl;
            }
        }
        rc = rc || add_lossy(out, tmp.v ? tmp.v : "", tmp.n);
        break;
    case DEC_REPLACE:
        for (int64_t i = 0; i < in->n && !rc; i++) {
            const char *s = ITEM(in, i);
            int64_t n = in->len[i], last = 0;
            rc = list_add(out, "", 0);
            for (int64_t j = 0; j + d->alen <= n && !rc;) {
                if (memcmp(s + j, d->a, (size_t)d->alen)) {
                    j++;
                    continue;
                }
                rc = list_extend(out, s + last, j - last) || list_extend(out, d->b, d->blen);
                j += d->alen;
                last = j;
            }
            rc = rc || list_extend(out, s + last, n - last);
        }
        break;
    case DEC_BYTEFALLBACK:
        for (int64_t i = 0; i <= in->n && !rc; i++) {
            int b = i < in->n ? byte_token(ITEM(in, i), in->len[i]) : -1;
            if (b >= 0) {
                char cb = (char)b;
                rc = tok_buf_append(&tmp, &cb, 1);
                continue;
            }
            if (tmp.n) { /* flush pending bytes: one string if valid UTF-8, else one U+FFFD each */
                if (is_valid_utf8(tmp.v, tmp.n))
                    rc = list_add(out, tmp.v, tmp.n);
                else
                    for (int64_t k = 0; k < tmp.n && !rc; k++)
                        rc = list_add(out, "\xEF\xBF\xBD", 3);
                tmp.n = 0;
            }
            if (i < in->n) rc = rc || list_add(out, ITEM(in, i), in->len[i]);
        }
        break;
    case DEC_FUSE:
        rc = list_add(out, "", 0);
        for (int64_t i = 0; i < in->n && !rc; i++)
            rc = list_extend(out, ITEM(in, i), in->len[i]);
        break;
    case DEC_STRIP:
        for (int64_t i = 0; i < in->n && !rc; i++) {
            const char *s = ITEM(in, i);
            int64_t n = in->len[i], a = 0, z = n;
            for (int64_t k = 0; k < d->start && a < z; k++) {
                int cl;
                if (tok_utf8_decode(s + a, &cl) != d->strip_char) break;
                a += cl;
            }
            for (int64_t k = 0; k < d->stop && z > a; k++) {
                int64_t b = z - 1;
                while (b > a && ((unsigned char)s[b] & 0xC0) == 0x80)
                    b--;
                int cl;
                if (tok_utf8_decode(s + b, &cl) != d->strip_char) break;
                z = b;
            }
            rc = list_add(out, s + a, z - a);
        }
        break;
    case DEC_METASPACE:
        for (int64_t i = 0; i < in->n && !rc; i++) {
            const char *s = ITEM(in, i);
            int64_t n = in->len[i];
            rc = list_add(out, "", 0);
            for (int64_t j = 0; j < n && !rc;) {
                int cl;
                uint32_t cp = tok_utf8_decode(s + j, &cl);
                if (cp != d->strip_char)
                    rc = list_extend(out, s + j, cl);
                else if (i != 0 || d->prepend_scheme == PREPEND_NEVER)
                    rc = list_extend(out, " ", 1);
                j += cl;
            }
        }
        break;
    }
    free(tmp.v);
    return rc;
}

int zr_tokenizer_decode_len(const zr_tokenizer *tok, const int32_t *ids, int64_t n,
                            int skip_special_tokens, char **out, int64_t *len) {
    *out = NULL;
    if (len) *len = 0;
    strlist a = {0}, b = {0};
    int rc = 0;
    for (int64_t i = 0; i < n && !rc; i++) {
        int32_t id = ids[i];
        int32_t ai = id >= 0 && id < tok->vocab_size ? tok->added_by_id[id] : -1;
        if (ai >= 0) {
            if (!(skip_special_tokens && tok->added[ai].special))
                rc = list_add(&a, tok->added_pool + tok->added[ai].off, tok->added[ai].len);
        } else if (id >= 0 && id < tok->n_ids && tok->id_entry[id] >= 0) {
            const tok_entry *e = &tok->vocab.e[tok->id_entry[id]];
            rc = list_add(&a, tok->vocab.pool + e->off, e->len);
        }
    }
    for (int64_t k = 0; k < tok->n_dec && !rc; k++) {
        b.n = 0;
        b.buf.n = 0;
        rc = apply(&tok->dec[k], &a, &b);
        strlist t = a;
        a = b, b = t;
    }
    tok_buf res = {0};
    for (int64_t i = 0; i < a.n && !rc; i++) {
        if (i && !tok->has_decoder) rc = tok_buf_append(&res, " ", 1);
        rc = rc || tok_buf_append(&res, ITEM(&a, i), a.len[i]);
    }
    rc = rc || tok_buf_append(&res, "", 0); /* NUL-terminates, also when empty */
    list_free(&a), list_free(&b);
    if (rc) {
        free(res.v);
        return zr_error("%s: out of memory while decoding", tok->path);
    }
    *out = res.v;
    if (len) *len = res.n;
    return ZR_OK;
}

int zr_tokenizer_decode(const zr_tokenizer *tok, const int32_t *ids, int64_t n,
                        int skip_special_tokens, char **out) {
    return zr_tokenizer_decode_len(tok, ids, n, skip_special_tokens, out, NULL);
}

#endif /* ZR_TOKENIZER_HAVE_PCRE2 */
