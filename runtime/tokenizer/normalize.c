/* The Unicode normalizers of a tokenizer.json (NFC, NFD, NFKC, NFKD, Lowercase, Strip,
 * StripAccents), each one pass from a string to a buffer, as the `tokenizers` library's
 * NormalizedString methods do it. Normalization forms and character properties come from
 * utf8proc (libutf8proc-dev); a build without it refuses these normalizers when loading. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/internal.h"
#ifdef ZR_TOKENIZER_HAVE_PCRE2
#ifdef ZR_HAVE_UTF8PROC
#include <utf8proc.h>

int tok_have_unicode(void) { return 1; }

/* utf8proc_map's options of a normalization form (its buffer is malloc'd: free() frees it). */
static int form_options(int kind) {
    int o = UTF8PROC_STABLE;
    if (kind == NORM_NFC || kind == NORM_NFKC) o |= UTF8PROC_COMPOSE;
    if (kind == NORM_NFD || kind == NORM_NFKD) o |= UTF8PROC_DECOMPOSE;
    if (kind == NORM_NFKC || kind == NORM_NFKD) o |= UTF8PROC_COMPAT;
    return o;
}

/* ASCII text is the same in the four normalization forms (most lines of most corpora): copied as is. */
static int all_ascii(const char *s, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return 0;
    return 1;
}

static int norm_form(int kind, const char *s, int64_t n, tok_buf *out) {
    if (all_ascii(s, n)) return tok_buf_append(out, s, n) ? -1 : 0;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)form_options(kind));
    int rc = m < 0 || tok_buf_append(out, (const char *)dst, (int64_t)m);
    free(dst);
    return rc ? -1 : 0;
}

/* Rust's char::to_lowercase, one char at a time (no final-sigma context, as HF's lowercase):
 * the simple mapping, except U+0130, whose full lowercase is "i" + U+0307. */
static int norm_lowercase(const char *s, int64_t n, tok_buf *out) {
    char enc[4];
    for (int64_t i = 0; i < n;) {
        int len;
        uint32_t cp = tok_utf8_decode(s + i, &len);
        i += len;
        if (cp == 0x130) {
            if (tok_buf_append(out, "i\xCC\x87", 3)) return -1;
            continue;
        }
        if (tok_buf_append(out, enc, tok_utf8_encode(enc, (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp))))
            return -1;
    }
    return 0;
}

/* Drops the combining marks (general category Mn, Mc, Me), as HF's StripAccents. */
static int norm_strip_accents(const char *s, int64_t n, tok_buf *out) {
    for (int64_t i = 0; i < n;) {
        int len;
        utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)tok_utf8_decode(s + i, &len));
        if (c != UTF8PROC_CATEGORY_MN && c != UTF8PROC_CATEGORY_MC && c != UTF8PROC_CATEGORY_ME &&
            tok_buf_append(out, s + i, len))
            return -1;
        i += len;
    }
    return 0;
}

#else
int tok_have_unicode(void) { return 0; }
static int norm_form(int kind, const char *s, int64_t n, tok_buf *out) { return -1; }
static int norm_lowercase(const char *s, int64_t n, tok_buf *out) { return -1; }
static int norm_strip_accents(const char *s, int64_t n, tok_buf *out) { return -1; }
#endif /* ZR_HAVE_UTF8PROC */

/* HF's Strip: White_Space chars off the left and/or the right end. */
static int norm_strip(const tok_normalizer *nm, const char *s, int64_t n, tok_buf *out) {
    int64_t a = 0, b = n;
    while (nm->strip_left && a < b) {
        int len;
        if (!tok_is_whitespace(tok_utf8_decode(s + a, &len))) break;
        a += len;
    }
    while (nm->strip_right && b > a) {
        int64_t k = b - 1, len;
        while (k > a && ((unsigned char)s[k] & 0xC0) == 0x80)
            k--;
        int cl;
        if (!tok_is_whitespace(tok_utf8_decode(s + k, &cl))) break;
        len = b - k;
        b -= len;
    }
    return tok_buf_append(out, s + a, b - a) ? -1 : 0;
}

int tok_normalize_unicode(const tok_normalizer *nm, const char *s, int64_t n, tok_buf *out) {
    switch (nm->kind) {
    case NORM_LOWERCASE:
        return norm_lowercase(s, n, out);
    case NORM_STRIP:
        return norm_strip(nm, s, n, out);
    case NORM_STRIP_ACCENTS:
        return norm_strip_accents(s, n, out);
    default:
        return norm_form(nm->kind, s, n, out);
    }
}

#endif /* ZR_TOKENIZER_HAVE_PCRE2 */
