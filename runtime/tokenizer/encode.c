/* Encoding, in Hugging Face's order: split out added tokens found in the raw text, normalize
 * each remaining piece, split out "normalized" added tokens, pre-tokenize (regex splits,
 * ByteLevel, Metaspace), run BPE per word (bpe.c), then the post-processor template.
 * Pieces flow depth-first through the pre-tokenizer steps, so no step materialises a list. */
#include <stdlib.h>
#include <string.h>

#include "kernels/base/error.h"
#include "tokenizer/internal.h"
#ifdef ZR_TOKENIZER_HAVE_PCRE2

#define MAX_STEPS 16

typedef struct {
    int64_t start, end;
    int is_match;
} range;

typedef struct {
    range *v;
    int64_t n, cap;
} ranges;

typedef struct {
    const zr_tokenizer *tok;
    tok_ids *out;
    pcre2_match_data *md[MAX_STEPS];
    tok_buf in[MAX_STEPS], map[MAX_STEPS]; /* per step: modified input, byte-mapped piece */
    ranges rg[MAX_STEPS];
    tok_buf norm;
} enc_ctx;

static int ranges_push(ranges *r, int64_t start, int64_t end, int is_match) {
    if (r->n == r->cap) {
        int64_t cap = r->cap ? r->cap * 2 : 256;
        range *v = realloc(r->v, (size_t)cap * sizeof *v);
        if (!v) return -1;
        r->v = v;
        r->cap = cap;
    }
    r->v[r->n++] = (range){start, end, is_match};
    return 0;
}

static int oom(const enc_ctx *c) {
    return zr_error("%s: out of memory while encoding", c->tok->path);
}

/* ---- normalizers ------------------------------------------------------------------------- */

int tok_normalize(const zr_tokenizer *tok, const char *s, int64_t n, tok_buf *out) {
    tok_buf a = {0}, b = {0};
    const char *cur = s;
    int64_t cur_n = n;
    int rc = 0;
    for (int64_t k = 0; k < tok->n_norm && !rc; k++) {
        const tok_normalizer *nm = &tok->norm[k];
        tok_buf *dst = (cur == a.v) ? &b : &a;
        dst->n = 0;
        if (nm->kind == NORM_PREPEND) {
            if (cur_n == 0) continue; /* HF prepends only to non-empty text */
            rc = tok_buf_append(dst, nm->a, nm->alen) || tok_buf_append(dst, cur, cur_n);
        } else if (nm->kind != NORM_REPLACE) {
            rc = tok_normalize_unicode(nm, cur, cur_n, dst);
        } else { /* non-overlapping, left to right */
            int64_t i = 0, last = 0;
            rc = tok_buf_reserve(dst, cur_n + 1);
            while (!rc && i + nm->alen <= cur_n) {
                const char *hit = memchr(cur + i, nm->a[0], (size_t)(cur_n - i));
                if (!hit || hit + nm->alen > cur + cur_n) break;
                i = hit - cur;
                if (memcmp(hit, nm->a, (size_t)nm->alen)) {
                    i++;
                    continue;
                }
                rc = tok_buf_append(dst, cur + last, i - last) ||
                     tok_buf_append(dst, nm->b, nm->blen);
                i += nm->alen;
                last = i;
            }
            if (!rc) rc = tok_buf_append(dst, cur + last, cur_n - last);
        }
        cur = dst->v, cur_n = dst->n;
    }
    if (!rc) rc = tok_buf_append(out, cur, cur_n);
    free(a.v), free(b.v);
    return rc ? -1 : 0;
}

/* ---- pre-tokenizers ---------------------------------------------------------------------- */

static int pre_apply(enc_ctx *c, int64_t step, const char *s, int64_t n, int at_start);

/* Regex matches and the gaps between them, in order, like HF's Pattern::find_matches. */
static int find_matches(enc_ctx *c, int64_t step, pcre2_code *re, const char *s, int64_t n,
                        ranges *r) {
    r->n = 0;
    if (!c->md[step] && !(c->md[step] = pcre2_match_data_create_from_pattern(re, NULL)))
        return oom(c);
    int64_t off = 0, prev = 0;
    while (off <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, (PCRE2_SIZE)n, (PCRE2_SIZE)off, PCRE2_NO_UTF_CHECK,
                             c->md[step], NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return zr_error("%s: pre-tokenizer regex failed: %s", c->tok->path, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md[step]);
        int64_t ms = (int64_t)ov[0], me = (int64_t)ov[1];
        if (ms != prev && ranges_push(r, prev, ms, 0)) return oom(c);
        if (ranges_push(r, ms, me, 1)) return oom(c);
        prev = me;
        if (me > ms)
            off = me;
        else if (ms >= n)
            break;
        else
            off = ms + tok_utf8_len((unsigned char)s[ms]); /* empty match: step one char */
    }
    if (prev != n && ranges_push(r, prev, n, 0)) return oom(c);
    return 0;
}

/* Applies a SplitDelimiterBehavior to find_matches' ranges in place (HF normalizer.rs split). */
static void apply_behavior(ranges *r, int behavior, int invert) {
    int64_t k = 0;
    int prev_match = 0;
    if (invert)
        for (int64_t i = 0; i < r->n; i++)
            r->v[i].is_match = !r->v[i].is_match;
    switch (behavior) {
    case SPLIT_ISOLATED:
        return;
    case SPLIT_REMOVED:
        for (int64_t i = 0; i < r->n; i++)
            if (!r->v[i].is_match) r->v[k++] = r->v[i];
        break;
    case SPLIT_CONTIGUOUS:
        for (int64_t i = 0; i < r->n; i++) {
            if (k && r->v[i].is_match == prev_match)
                r->v[k - 1].end = r->v[i].end;
            else
                r->v[k++] = r->v[i];
            prev_match = r->v[i].is_match;
        }
        break;
    case SPLIT_MERGED_PREV:
        for (int64_t i = 0; i < r->n; i++) {
            if (k && r->v[i].is_match && !prev_match)
                r->v[k - 1].end = r->v[i].end;
            else
                r->v[k++] = r->v[i];
            prev_match = r->v[i].is_match;
        }
        break;
    case SPLIT_MERGED_NEXT: /* HF folds from the right */
        k = r->n;
        for (int64_t i = r->n - 1; i >= 0; i--) {
            int m = r->v[i].is_match;
            if (k < r->n && m && !prev_match)
                r->v[k].start = r->v[i].start;
            else
                r->v[--k] = r->v[i];
            prev_match = m;
        }
        memmove(r->v, r->v + k, (size_t)(r->n - k) * sizeof *r->v);
        k = r->n - k;
        break;
    }
    r->n = k;
}

static int split_recurse(enc_ctx *c, int64_t step, const char *s, ranges *r, int at_start) {
    for (int64_t i = 0; i < r->n; i++) {
        const range g = r->v[i]; /* r may be reused below this step only */
        if (g.end > g.start &&
            pre_apply(c, step + 1, s + g.start, g.end - g.start, at_start && !g.start))
            return ZR_ERR;
    }
    return 0;
}

static int byte_map(enc_ctx *c, int64_t step, const char *s, int64_t n, int at_start) {
    tok_buf *m = &c->map[step];
    m->n = 0;
    if (tok_buf_reserve(m, 2 * n + 1)) return oom(c);
    char *o = m->v;
    for (int64_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        o[0] = tok_byte_char[b][0];
        o[1] = tok_byte_char[b][1];
        o += tok_byte_char_len[b];
    }
    m->n = o - m->v;
    return pre_apply(c, step + 1, m->v, m->n, at_start);
}

static int pre_apply(enc_ctx *c, int64_t step, const char *s, int64_t n, int at_start) {
    const zr_tokenizer *tok = c->tok;
    if (step == tok->n_pre) return tok_bpe_word(tok, s, n, c->out) ? oom(c) : 0;
    const tok_pretok *p = &tok->pre[step];
    tok_buf *in = &c->in[step];
    ranges *r = &c->rg[step];
    switch (p->kind) {
    case PRE_BYTELEVEL:
        if (p->add_prefix_space && s[0] != ' ') {
            in->n = 0;
            if (tok_buf_append(in, " ", 1) || tok_buf_append(in, s, n)) return oom(c);
            s = in->v, n = in->n;
        }
        if (!p->re) return byte_map(c, step, s, n, at_start);
        if (find_matches(c, step, p->re, s, n, r)) return ZR_ERR;
        for (int64_t i = 0; i < r->n; i++) {
            const range g = r->v[i];
            if (g.end > g.start &&
                byte_map(c, step, s + g.start, g.end - g.start, at_start && !g.start))
                return ZR_ERR;
        }
        return 0;
    case PRE_SPLIT:
        if (find_matches(c, step, p->re, s, n, r)) return ZR_ERR;
        apply_behavior(r, p->behavior, p->invert);
        return split_recurse(c, step, s, r, at_start);
    default: { /* PRE_METASPACE */
        in->n = 0;
        /* (HF replaces the spaces first, then prepends unless the text starts with the replacement:
         * a leading space is not doubled) */
        int starts = (n > 0 && s[0] == ' ') || (n >= p->repl_len && !memcmp(s, p->repl, (size_t)p->repl_len));
        if (!starts && (p->prepend_scheme == PREPEND_ALWAYS ||
                        (p->prepend_scheme == PREPEND_FIRST && at_start)))
            if (tok_buf_append(in, p->repl, p->repl_len)) return oom(c);
        for (int64_t i = 0, last = 0; i <= n; i++)
            if (i == n || s[i] == ' ') {
                if (tok_buf_append(in, s + last, i - last)) return oom(c);
                if (i < n && tok_buf_append(in, p->repl, p->repl_len)) return oom(c);
                last = i + 1;
            }
        if (!p->split) return pre_apply(c, step + 1, in->v, in->n, at_start);
        /* split on the replacement, each piece keeping it at its front (MergedWithNext) */
        r->n = 0;
        int64_t prev = 0;
        for (int64_t i = 0; i + p->repl_len <= in->n; i++)
            if (!memcmp(in->v + i, p->repl, (size_t)p->repl_len)) {
                if ((i > prev && ranges_push(r, prev, i, 0)) ||
                    ranges_push(r, i, i + p->repl_len, 1))
                    return oom(c);
                i += p->repl_len - 1;
                prev = i + 1;
            }
        if (prev < in->n && ranges_push(r, prev, in->n, 0)) return oom(c);
        apply_behavior(r, SPLIT_MERGED_NEXT, 0);
        return split_recurse(c, step, in->v, r, at_start);
    }
    }
}

/* ---- added tokens ------------------------------------------------------------------------ */

static int is_word_char(const zr_tokenizer *tok, const char *ch, int len) {
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    int rc = md ? pcre2_match(tok->re_word, (PCRE2_SPTR)ch, (PCRE2_SIZE)len, 0, PCRE2_NO_UTF_CHECK,
                              md, NULL)
                : -1;
    pcre2_match_data_free(md);
    return rc >= 0;
}

static int segment(enc_ctx *c, int level, const char *s, int64_t n, int at_start);

/* Leftmost-longest added-token matches, with HF's single_word / lstrip / rstrip handling
 * (added_vocabulary.rs find_matches); text between them goes on to the next stage. */
static int split_added(enc_ctx *c, int level, const char *s, int64_t n, int at_start) {
    const zr_tokenizer *tok = c->tok;
    const tok_trie *t = level == 0 ? &tok->trie_raw : &tok->trie_norm;
    if (t->n <= 1) return segment(c, level, s, n, at_start);
    int64_t start_offset = 0, pos = 0;
    while (pos < n) {
        int64_t ms = -1, mlen = 0;
        int32_t tk = -1;
        for (int64_t i = pos; i < n && ms < 0; i++) {
            if (!t->first[(unsigned char)s[i]]) continue;
            int32_t node = 0;
            for (int64_t j = i; j < n; j++) {
                int32_t ch = t->nodes[node].child;
                while (ch >= 0 && t->nodes[ch].byte != (uint8_t)s[j])
                    ch = t->nodes[ch].sibling;
                if (ch < 0) break;
                node = ch;
                if (t->nodes[node].token >= 0) ms = i, mlen = j + 1 - i, tk = t->nodes[node].token;
            }
        }
        if (ms < 0) break;
        pos = ms + mlen;
        const tok_added *a = &tok->added[tk];
        int64_t start = ms, stop = ms + mlen;
        if (a->single_word) {
            int64_t b = start - 1; /* first byte of the char before the match */
            while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80)
                b--;
            int start_space = start == 0 || !is_word_char(tok, s + b, (int)(start - b));
            int stop_space =
                stop == n || !is_word_char(tok, s + stop, tok_utf8_len((unsigned char)s[stop]));
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            int64_t ns = start;
            while (ns > 0) {
                int64_t b = ns - 1;
                while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80)
                    b--;
                int cl;
                if (!tok_is_whitespace(tok_utf8_decode(s + b, &cl))) break;
                ns = b;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            int cl;
            while (stop < n && tok_is_whitespace(tok_utf8_decode(s + stop, &cl)))
                stop += cl;
        }
        if (start > start_offset && segment(c, level, s + start_offset, start - start_offset,
                                            at_start && start_offset == 0))
            return ZR_ERR;
        if (tok_ids_push(c->out, a->id)) return oom(c);
        start_offset = stop;
    }
    if (start_offset < n)
        return segment(c, level, s + start_offset, n - start_offset, at_start && start_offset == 0);
    return 0;
}

/* Text between added tokens: level 0 is raw text (normalize, then look for normalized added
 * tokens), level 1 is normalized text (pre-tokenize). */
static int segment(enc_ctx *c, int level, const char *s, int64_t n, int at_start) {
    if (n == 0) return 0;
    if (level == 1) return pre_apply(c, 0, s, n, at_start);
    if (!c->tok->n_norm) return split_added(c, 1, s, n, at_start);
    c->norm.n = 0;
    if (tok_normalize(c->tok, s, n, &c->norm)) return oom(c);
    return split_added(c, 1, c->norm.v, c->norm.n, at_start);
}

int zr_tokenizer_encode(const zr_tokenizer *tok, const char *text, size_t len,
                        int add_special_tokens, int32_t **ids, int64_t *n) {
    *ids = NULL;
    *n = 0;
    int64_t bad = tok_utf8_check(text, (int64_t)len);
    if (bad < (int64_t)len)
        return zr_error("%s: encode: input is not valid UTF-8 at byte %lld", tok->path,
                        (long long)bad);
    if (tok->n_pre > MAX_STEPS)
        return zr_error("%s: more than %d pre-tokenizer steps", tok->path, MAX_STEPS);
    tok_ids out = {0};
    enc_ctx c = {.tok = tok, .out = &out};
    int rc = tok_ids_reserve(&out, (int64_t)len / 3 + 16) ? oom(&c) : 0;
    int body_done = 0;
    for (int64_t i = 0; !rc && add_special_tokens && i < tok->n_tmpl; i++) {
        const tok_template_item *t = &tok->tmpl[i];
        if (t->is_sequence && !body_done) {
            rc = split_added(&c, 0, text, (int64_t)len, 1);
            body_done = 1;
        } else if (!t->is_sequence) {
            for (int64_t k = 0; !rc && k < t->n; k++)
                rc = tok_ids_push(&out, t->ids[k]) ? oom(&c) : 0;
        }
    }
    if (!rc && !body_done) rc = split_added(&c, 0, text, (int64_t)len, 1);
    for (int i = 0; i < MAX_STEPS; i++) {
        pcre2_match_data_free(c.md[i]);
        free(c.in[i].v), free(c.map[i].v), free(c.rg[i].v);
    }
    free(c.norm.v);
    if (rc) {
        free(out.v);
        return ZR_ERR;
    }
    *ids = out.v;
    *n = out.n;
    return ZR_OK;
}

#endif /* ZR_TOKENIZER_HAVE_PCRE2 */
