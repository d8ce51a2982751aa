/* Loading the pipeline parts of a tokenizer.json (normalizer, pre_tokenizer, post_processor,
 * decoder) into internal.h's step lists; the model and added tokens are loaded in
 * tokenizer.c. Unsupported types are errors that list what is supported. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "kernels/base/error.h"
#include "tokenizer/internal.h"
#ifdef ZR_TOKENIZER_HAVE_PCRE2

/* ---- pipeline ---------------------------------------------------------------------------- */

/* UTF + UCP so \s, \p{L}, \w mean what they mean in Oniguruma, which HF uses. */
static pcre2_code *compile_pattern(zr_tokenizer *tok, const char *s, int literal,
                                   const char *where) {
    int err;
    PCRE2_SIZE eo;
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)s, PCRE2_ZERO_TERMINATED,
                      PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0), &err, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return zr_error_null("%s: %s.pattern does not compile at offset %zu: %s", tok->path, where,
                             (size_t)eo, (char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT, pcre2_match still works */
    return re;
}

static pcre2_code *compile_re(zr_tokenizer *tok, const zr_json *pattern, const char *where) {
    const char *s = zr_json_get_string(pattern, "Regex", NULL);
    int literal = 0;
    if (!s) s = zr_json_get_string(pattern, "String", NULL), literal = 1;
    if (!s)
        return zr_error_null("%s: %s.pattern must be {\"Regex\": ...} or {\"String\": ...}",
                             tok->path, where);
    return compile_pattern(tok, s, literal, where);
}

static int utf8_single(const char *s, uint32_t *cp) {
    int n;
    if (!s || !*s) return 0;
    *cp = tok_utf8_decode(s, &n);
    return s[n] == 0;
}

static int prepend_scheme(const zr_json *o) {
    const char *s = zr_json_get_string(o, "prepend_scheme", NULL);
    if (!s) return zr_json_get_bool(o, "add_prefix_space", 1) ? PREPEND_ALWAYS : PREPEND_NEVER;
    return !strcmp(s, "first")   ? PREPEND_FIRST
           : !strcmp(s, "never") ? PREPEND_NEVER
                                 : PREPEND_ALWAYS;
}

/* The normalizers of normalize.c: NFC, NFD, NFKC, NFKD, Lowercase, StripAccents (utf8proc's), Strip. */
static int load_unicode_normalizer(zr_tokenizer *tok, tok_normalizer *n, const zr_json *o,
                                   const char *type, const char *where) {
    static const char *names[] = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Strip", "StripAccents"};
    static const int kinds[] = {NORM_NFC,       NORM_NFD,   NORM_NFKC,         NORM_NFKD,
                                NORM_LOWERCASE, NORM_STRIP, NORM_STRIP_ACCENTS};
    n->kind = -1;
    for (int i = 0; i < 7; i++)
        if (!strcmp(type, names[i])) n->kind = kinds[i];
    if (n->kind < 0)
        return zr_error("%s: %s type \"%s\" is not supported (Sequence, Prepend, Replace, NFC, NFD, "
                        "NFKC, NFKD, Lowercase, Strip, StripAccents are)",
                        tok->path, where, type);
    if (n->kind == NORM_STRIP) {
        n->strip_left = zr_json_get_bool(o, "strip_left", 1);
        n->strip_right = zr_json_get_bool(o, "strip_right", 1);
    } else if (!tok_have_unicode()) {
        return zr_error("%s: %s type \"%s\" needs utf8proc, which this zrun was built without "
                        "(install libutf8proc-dev, or unpack it into DEPS_PREFIX, and rebuild)",
                        tok->path, where, type);
    }
    return 0;
}

int tok_load_normalizer(zr_tokenizer *tok, const zr_json *o, const char *where) {
    if (zr_json_is_null(o)) return 0;
    const char *type = zr_json_get_string(o, "type", "");
    if (!strcmp(type, "Sequence")) {
        const zr_json *list = zr_json_get(o, "normalizers");
        for (int64_t i = 0; i < zr_json_len(list); i++)
            if (tok_load_normalizer(tok, zr_json_at(list, i), where)) return ZR_ERR;
        return 0;
    }
    tok_normalizer *nn = realloc(tok->norm, (size_t)(tok->n_norm + 1) * sizeof *nn);
    if (!nn) return zr_error("%s: out of memory", tok->path);
    tok->norm = nn;
    tok_normalizer *n = &nn[tok->n_norm];
    memset(n, 0, sizeof *n);
    if (!strcmp(type, "Prepend")) {
        const char *p = zr_json_get_string(o, "prepend", NULL);
        if (!p) return zr_error("%s: %s Prepend needs a string \"prepend\"", tok->path, where);
        n->kind = NORM_PREPEND;
        n->a = strdup(p), n->alen = (int64_t)strlen(p);
    } else if (!strcmp(type, "Replace")) {
        const char *pat = zr_json_get_string(zr_json_get(o, "pattern"), "String", NULL);
        const char *content = zr_json_get_string(o, "content", NULL);
        if (!pat || !*pat || !content)
            return zr_error("%s: %s Replace needs pattern {\"String\": non-empty} and a string "
                            "content (regex patterns are not supported)",
                            tok->path, where);
        n->kind = NORM_REPLACE;
        n->a = strdup(pat), n->alen = (int64_t)strlen(pat);
        n->b = strdup(content), n->blen = (int64_t)strlen(content);
    } else if (load_unicode_normalizer(tok, n, o, type, where)) {
        return ZR_ERR;
    }
    tok->n_norm++;
    return 0;
}

int tok_load_pretok(zr_tokenizer *tok, const zr_json *o) {
    if (zr_json_is_null(o)) return 0;
    const char *type = zr_json_get_string(o, "type", "");
    if (!strcmp(type, "Sequence")) {
        const zr_json *list = zr_json_get(o, "pretokenizers");
        for (int64_t i = 0; i < zr_json_len(list); i++)
            if (tok_load_pretok(tok, zr_json_at(list, i))) return ZR_ERR;
        return 0;
    }
    tok_pretok *pp = realloc(tok->pre, (size_t)(tok->n_pre + 1) * sizeof *pp);
    if (!pp) return zr_error("%s: out of memory", tok->path);
    tok->pre = pp;
    tok_pretok *p = &pp[tok->n_pre];
    memset(p, 0, sizeof *p);
    if (!strcmp(type, "ByteLevel")) {
        p->kind = PRE_BYTELEVEL;
        p->add_prefix_space = zr_json_get_bool(o, "add_prefix_space", 1);
        if (zr_json_get_bool(o, "use_regex", 1)) {
            static const char gpt2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| "
                                       "?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
            if (!(p->re = compile_pattern(tok, gpt2, 0, "pre_tokenizer ByteLevel"))) return ZR_ERR;
        }
    } else if (!strcmp(type, "Split")) {
        static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                      "Contiguous"};
        const char *b = zr_json_get_string(o, "behavior", "");
        p->kind = PRE_SPLIT;
        p->behavior = -1;
        for (int i = 0; i < 5; i++)
            if (!strcmp(b, names[i])) p->behavior = i;
        if (p->behavior < 0)
            return zr_error("%s: pre_tokenizer Split.behavior \"%s\" is not one of Removed, "
                            "Isolated, MergedWithPrevious, MergedWithNext, Contiguous",
                            tok->path, b);
        p->invert = zr_json_get_bool(o, "invert", 0);
        if (!(p->re = compile_re(tok, zr_json_get(o, "pattern"), "pre_tokenizer Split")))
            return ZR_ERR;
    } else if (!strcmp(type, "Metaspace")) {
        const char *r = zr_json_get_string(o, "replacement", "\xE2\x96\x81");
        uint32_t cp;
        if (!utf8_single(r, &cp))
            return zr_error("%s: pre_tokenizer Metaspace.replacement must be one char", tok->path);
        p->kind = PRE_METASPACE;
        p->repl_len = (int)strlen(r);
        memcpy(p->repl, r, (size_t)p->repl_len);
        p->prepend_scheme = prepend_scheme(o);
        p->split = zr_json_get_bool(o, "split", 1);
    } else {
        return zr_error("%s: pre_tokenizer type \"%s\" is not supported (ByteLevel, Split, "
                        "Metaspace, Sequence are)",
                        tok->path, type);
    }
    tok->n_pre++;
    return 0;
}

static int add_template_item(zr_tokenizer *tok, int is_seq, const int32_t *ids, int64_t n) {
    tok_template_item *t = realloc(tok->tmpl, (size_t)(tok->n_tmpl + 1) * sizeof *t);
    if (!t) return -1;
    tok->tmpl = t;
    t[tok->n_tmpl] = (tok_template_item){is_seq, NULL, n};
    if (n && !(t[tok->n_tmpl].ids = malloc((size_t)n * sizeof(int32_t)))) return -1;
    if (n) memcpy(t[tok->n_tmpl].ids, ids, (size_t)n * sizeof(int32_t));
    tok->n_tmpl++;
    return 0;
}

int tok_load_post(zr_tokenizer *tok, const zr_json *o) {
    const char *P = tok->path;
    if (zr_json_is_null(o)) return 0;
    const char *type = zr_json_get_string(o, "type", "");
    if (!strcmp(type, "Sequence")) {
        const zr_json *list = zr_json_get(o, "processors");
        for (int64_t i = 0; i < zr_json_len(list); i++)
            if (tok_load_post(tok, zr_json_at(list, i))) return ZR_ERR;
        return 0;
    }
    if (!strcmp(type, "ByteLevel")) return 0; /* only changes offsets */
    if (tok->n_tmpl) return zr_error("%s: more than one post_processor adds tokens", P);
    if (!strcmp(type, "TemplateProcessing")) {
        const zr_json *single = zr_json_get(o, "single"),
                      *specials = zr_json_get(o, "special_tokens");
        for (int64_t i = 0; i < zr_json_len(single); i++) {
            const zr_json *it = zr_json_at(single, i), *sp = zr_json_get(it, "SpecialToken");
            if (zr_json_get(it, "Sequence")) {
                if (add_template_item(tok, 1, NULL, 0)) return zr_error("%s: out of memory", P);
                continue;
            }
            const char *name = zr_json_get_string(sp, "id", NULL);
            const zr_json *ids = zr_json_get(zr_json_get(specials, name ? name : ""), "ids");
            if (!name || !zr_json_is(ids, ZR_JSON_ARRAY))
                return zr_error("%s: post_processor.single[%lld] names a special token that "
                                "post_processor.special_tokens does not define",
                                P, (long long)i);
            int32_t buf[64];
            int64_t n = zr_json_len(ids) < 64 ? zr_json_len(ids) : 64;
            for (int64_t k = 0; k < n; k++) {
                const zr_json *id = zr_json_at(ids, k);
                if (!zr_json_is(id, ZR_JSON_NUMBER) || !id->is_int_literal || id->u.n.i < 0 ||
                    id->u.n.i > INT32_MAX)
                    return zr_error("%s: post_processor.special_tokens[\"%s\"].ids[%lld] is not a "
                                    "token id",
                                    P, name, (long long)k);
                buf[k] = (int32_t)id->u.n.i;
            }
            if (add_template_item(tok, 0, buf, n)) return zr_error("%s: out of memory", P);
        }
    } else if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        const zr_json *cls = zr_json_at(zr_json_get(o, "cls"), 1),
                      *sep = zr_json_at(zr_json_get(o, "sep"), 1);
        if (!zr_json_is(cls, ZR_JSON_NUMBER) || !zr_json_is(sep, ZR_JSON_NUMBER) ||
            !cls->is_int_literal || !sep->is_int_literal || cls->u.n.i < 0 ||
            cls->u.n.i > INT32_MAX || sep->u.n.i < 0 || sep->u.n.i > INT32_MAX)
            return zr_error("%s: post_processor %s needs cls and sep as [token, id] with an id "
                            "from 0 to 2147483647",
                            P, type);
        int32_t c = (int32_t)cls->u.n.i, s = (int32_t)sep->u.n.i;
        if (add_template_item(tok, 0, &c, 1) || add_template_item(tok, 1, NULL, 0) ||
            add_template_item(tok, 0, &s, 1))
            return zr_error("%s: out of memory", P);
    } else {
        return zr_error("%s: post_processor type \"%s\" is not supported (TemplateProcessing, "
                        "ByteLevel, RobertaProcessing, BertProcessing, Sequence are)",
                        P, type);
    }
    return 0;
}

int tok_load_decoder(zr_tokenizer *tok, const zr_json *o) {
    const char *P = tok->path;
    if (zr_json_is_null(o)) return 0;
    tok->has_decoder = 1;
    const char *type = zr_json_get_string(o, "type", "");
    if (!strcmp(type, "Sequence")) {
        const zr_json *list = zr_json_get(o, "decoders");
        for (int64_t i = 0; i < zr_json_len(list); i++)
            if (tok_load_decoder(tok, zr_json_at(list, i))) return ZR_ERR;
        return 0;
    }
    tok_decoder *dd = realloc(tok->dec, (size_t)(tok->n_dec + 1) * sizeof *dd);
    if (!dd) return zr_error("%s: out of memory", P);
    tok->dec = dd;
    tok_decoder *d = &dd[tok->n_dec];
    memset(d, 0, sizeof *d);
    if (!strcmp(type, "ByteLevel"))
        d->kind = DEC_BYTELEVEL;
    else if (!strcmp(type, "ByteFallback"))
        d->kind = DEC_BYTEFALLBACK;
    else if (!strcmp(type, "Fuse"))
        d->kind = DEC_FUSE;
    else if (!strcmp(type, "Replace")) {
        const char *pat = zr_json_get_string(zr_json_get(o, "pattern"), "String", NULL);
        const char *content = zr_json_get_string(o, "content", NULL);
        if (!pat || !*pat || !content)
            return zr_error("%s: decoder Replace needs pattern {\"String\": non-empty} and a "
                            "string content",
                            P);
        d->kind = DEC_REPLACE;
        d->a = strdup(pat), d->alen = (int64_t)strlen(pat);
        d->b = strdup(content), d->blen = (int64_t)strlen(content);
    } else if (!strcmp(type, "Strip")) {
        d->kind = DEC_STRIP;
        if (!utf8_single(zr_json_get_string(o, "content", NULL), &d->strip_char))
            return zr_error("%s: decoder Strip.content must be one char", P);
        d->start = zr_json_get_int(o, "start", 0);
        d->stop = zr_json_get_int(o, "stop", 0);
    } else if (!strcmp(type, "Metaspace")) {
        d->kind = DEC_METASPACE;
        if (!utf8_single(zr_json_get_string(o, "replacement", "\xE2\x96\x81"), &d->strip_char))
            return zr_error("%s: decoder Metaspace.replacement must be one char", P);
        d->prepend_scheme = prepend_scheme(o);
    } else {
        return zr_error("%s: decoder type \"%s\" is not supported (ByteLevel, Replace, "
                        "ByteFallback, Fuse, Strip, Metaspace, Sequence are)",
                        P, type);
    }
    tok->n_dec++;
    return 0;
}

#endif /* ZR_TOKENIZER_HAVE_PCRE2 */
