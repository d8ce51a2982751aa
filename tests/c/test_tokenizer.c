/* Tests for runtime/io/json.c and runtime/tokenizer/: JSON good/bad input with error positions,
 * hand-made tiny tokenizers of the GPT-2, Llama-3 and SentencePiece shapes with ids derived by
 * hand, and (when ../shared/data is present) exact equality with Hugging Face reference ids. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "io/json.h"
#include "kernels/base/error.h"
#include "tokenizer/tokenizer.h"

/* ---- helpers ----------------------------------------------------------------------------- */

static const char *data_dir(void) {
    const char *d = getenv("ZRUN_TEST_DATA");
    return d && *d ? d : "../shared/data";
}

static char *data_path(const char *rel) {
    char *p = NULL;
    if (asprintf(&p, "%s/%s", data_dir(), rel) < 0) return NULL;
    return p;
}

static int have_data(const char *name, const char *rel) {
    char *p = data_path(rel);
    int ok = p && access(p, R_OK) == 0;
    if (!ok) printf("SKIP %s: data not found at %s\n", name, p ? p : rel);
    free(p);
    return ok;
}

static char *read_file(const char *path, int64_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = 0, *len = n;
    return buf;
}

/* Writes a tokenizer.json into a fresh temp dir and loads it. */
static zr_tokenizer *load_text(const char *json) {
    char dir[] = "/tmp/zr_tok_XXXXXX";
    if (!mkdtemp(dir)) return NULL;
    char path[64];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "wb");
    fputs(json, f);
    fclose(f);
    zr_tokenizer *t = zr_tokenizer_load(path);
    unlink(path);
    rmdir(dir);
    return t;
}

/* CHECKs that encoding text gives want[0..nwant). */
#define CHECK_ENCODE(tok, text, special, ...)                                                      \
    do {                                                                                           \
        const int32_t want_[] = {__VA_ARGS__};                                                     \
        check_encode(tok, text, special, want_, (int64_t)(sizeof want_ / sizeof want_[0]),         \
                     __LINE__);                                                                    \
    } while (0)

static void check_encode(zr_tokenizer *tok, const char *text, int special, const int32_t *want,
                         int64_t nwant, int line) {
    int32_t *ids = NULL;
    int64_t n = 0;
    int rc = zr_tokenizer_encode(tok, text, strlen(text), special, &ids, &n);
    CHECK_MSG(rc == 0, "line %d: encode failed: %s", line, zr_last_error());
    int same = rc == 0 && n == nwant;
    for (int64_t i = 0; same && i < n; i++)
        same = ids[i] == want[i];
    if (!same && rc == 0) {
        char got[256] = "";
        for (int64_t i = 0, o = 0; i < n && o < 200; i++)
            o += snprintf(got + o, sizeof got - (size_t)o, "%d ", ids[i]);
        CHECK_MSG(0, "line %d: encode(\"%s\") gave [%s] (%lld ids, want %lld)", line, text, got,
                  (long long)n, (long long)nwant);
    }
    free(ids);
}

static void check_decode(zr_tokenizer *tok, const int32_t *ids, int64_t n, int skip,
                         const char *want, int line) {
    char *s = NULL;
    int rc = zr_tokenizer_decode(tok, ids, n, skip, &s);
    CHECK_MSG(rc == 0 && s && !strcmp(s, want), "line %d: decode gave \"%s\", want \"%s\"", line,
              s ? s : "(null)", want);
    free(s);
}
#define CHECK_DECODE(tok, skip, want, ...)                                                         \
    do {                                                                                           \
        const int32_t ids_[] = {__VA_ARGS__};                                                      \
        check_decode(tok, ids_, (int64_t)(sizeof ids_ / sizeof ids_[0]), skip, want, __LINE__);    \
    } while (0)

/* ---- JSON -------------------------------------------------------------------------------- */

TEST(json_values) {
    const char *text = " {\"a\": [1, -2.5e3, 9007199254740993, -9223372036854775808, 1e400, 0.5],\n"
                       "  \"s\": \"q\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\u2581\\ud83d\\ude00\",\n"
                       "  \"t\": true, \"f\": false, \"n\": null, \"e\": {}, \"z\": [],\n"
                       "  \"dup\": 1, \"dup\": 2, \"nul\": \"a\\u0000b\" } ";
    zr_json_doc *d = zr_json_parse(text, (int64_t)strlen(text), "t.json");
    CHECK_MSG(d, "parse failed: %s", zr_last_error());
    if (!d) return;
    const zr_json *r = zr_json_root(d), *a = zr_json_get(r, "a");
    CHECK(zr_json_is(r, ZR_JSON_OBJECT) && zr_json_len(r) == 10);
    CHECK(zr_json_len(a) == 6);
    CHECK(zr_json_at(a, 0)->is_int && zr_json_at(a, 0)->u.n.i == 1);
    CHECK(!zr_json_at(a, 1)->is_int || zr_json_at(a, 1)->u.n.i == -2500);
    CHECK(zr_json_at(a, 1)->u.n.num == -2500.0);
    CHECK(zr_json_at(a, 2)->is_int && zr_json_at(a, 2)->u.n.i == 9007199254740993LL);
    CHECK(zr_json_at(a, 3)->is_int && zr_json_at(a, 3)->u.n.i == INT64_MIN);
    CHECK(!zr_json_at(a, 4)->is_int && zr_json_at(a, 4)->u.n.num > 1e308);
    CHECK(!zr_json_at(a, 5)->is_int && zr_json_at(a, 5)->u.n.num == 0.5);
    CHECK(zr_json_at(a, 0)->is_int_literal && zr_json_at(a, 2)->is_int_literal &&
          zr_json_at(a, 3)->is_int_literal && !zr_json_at(a, 1)->is_int_literal);
    CHECK(zr_json_at(a, 6) == NULL);
    const zr_json *s = zr_json_get(r, "s");
    const char want[] = "q\"\\/\b\f\n\r\t\xC3\xA9\xE2\x96\x81\xF0\x9F\x98\x80";
    CHECK(s && s->len == (int64_t)strlen(want) && !memcmp(s->u.str, want, sizeof want));
    CHECK(zr_json_get_bool(r, "t", 0) == 1 && zr_json_get_bool(r, "f", 1) == 0);
    CHECK(zr_json_is(zr_json_get(r, "n"), ZR_JSON_NULL) && zr_json_is_null(zr_json_get(r, "nope")));
    CHECK(zr_json_len(zr_json_get(r, "e")) == 0 && zr_json_is(zr_json_get(r, "z"), ZR_JSON_ARRAY));
    CHECK(zr_json_get_int(r, "dup", 0) == 2); /* last duplicate wins, like Python */
    CHECK(zr_json_get(r, "nul")->len == 3);
    CHECK(!strcmp(zr_json_member_at(r, 1)->key, "s")); /* file order */
    CHECK(!strcmp(zr_json_type_name(zr_json_get(r, "z")), "array"));
    zr_json_doc_free(d);
}

/* Integral values vs integers as written, and numbers out of int64's range (1e400 converted to
 * int64 before the range check was undefined behaviour, issue 16). */
TEST(json_integers) {
    static const struct {
        const char *text;
        int is_int, literal;
        int64_t i;
    } cases[] = {
        {"0", 1, 1, 0},
        {"-0", 1, 1, 0},
        {"2e0", 1, 0, 2},
        {"3.0", 1, 0, 3},
        {"-7E+1", 1, 0, -70},
        {"0.5", 0, 0, 0},
        {"9223372036854775807", 1, 1, INT64_MAX},
        {"9223372036854775808", 0, 0, 0},
        {"-9223372036854775809", 0, 0, 0}, /* rounds to -2^63 as a double, but is not it */
        {"18446744073709551616", 0, 0, 0},
        {"1e19", 0, 0, 0},
        {"-9.223372036854775808e18", 1, 0, INT64_MIN},
        {"1e400", 0, 0, 0},
        {"-1e400", 0, 0, 0},
        {"1e-400", 1, 0, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        zr_json_doc *d = zr_json_parse(cases[k].text, (int64_t)strlen(cases[k].text), "n.json");
        const zr_json *v = zr_json_root(d);
        CHECK_MSG(d && v->is_int == cases[k].is_int && v->is_int_literal == cases[k].literal &&
                      (!v->is_int || v->u.n.i == cases[k].i),
                  "%s: is_int %d literal %d i %lld", cases[k].text, d ? v->is_int : -1,
                  d ? v->is_int_literal : -1, d ? (long long)v->u.n.i : 0);
        zr_json_doc_free(d);
    }
}

TEST(json_big_object) {
    /* an object big enough for the hash index, with keys that share prefixes */
    int n = 5000;
    char *buf = malloc((size_t)n * 32 + 16), *o = buf;
    *o++ = '{';
    for (int i = 0; i < n; i++)
        o += sprintf(o, "%s\"key%d\":%d", i ? "," : "", i, i * 3);
    o += sprintf(o, ",\"key7\":-1}");
    zr_json_doc *d = zr_json_parse(buf, o - buf, "big");
    CHECK_MSG(d, "%s", zr_last_error());
    const zr_json *r = zr_json_root(d);
    int ok = 1;
    for (int i = 0; i < n; i++) {
        char k[16];
        snprintf(k, sizeof k, "key%d", i);
        ok &= zr_json_get_int(r, k, -99) == (i == 7 ? -1 : i * 3);
    }
    CHECK(ok);
    CHECK(zr_json_get(r, "key5000") == NULL && zr_json_len(r) == n + 1);
    zr_json_doc_free(d);
    free(buf);
}

TEST(json_errors) {
    static const struct {
        const char *text, *want; /* want: a substring of the message */
    } cases[] = {
        {"", "t.json:1:1: expected a value"},
        {"{\"a\":1,}", "t.json:1:8: expected '\"' to start a key, got '}'"},
        {"[1 2]", "t.json:1:4: expected ',' or ']' after an array element, got '2'"},
        {"{\"a\" 1}", "t.json:1:6: expected ':' after the object key, got '1'"},
        {"[1,\n  2,\n  x]", "t.json:3:3: expected a value"},
        {"\"abc", "t.json:1:5: expected '\"' to close the string, got end of input"},
        {"\"a\\x\"", "t.json:1:4: expected an escape"},
        {"\"\\ud800\"", "t.json:1:8: expected a \\uDC00-\\uDFFF low surrogate"},
        {"\"\\udc00\"", "t.json:1:2: expected a high surrogate"},
        {"\"\\u12g4\"", "t.json:1:6: expected 4 hex digits"},
        {"\"a\tb\"",
         "t.json:1:3: expected a string character (control characters must be escaped)"},
        {"\"\xC3\x28\"", "t.json:1:2: expected valid UTF-8 in string, got byte 0xC3"},
        {"\"\xED\xA0\x80\"", "t.json:1:2: expected valid UTF-8"},
        {"01", "t.json:1:2: expected end of input after the top-level value, got '1'"},
        {"1.", "t.json:1:3: expected a digit after '.'"},
        {"-", "t.json:1:2: expected a digit"},
        {"1e+", "t.json:1:4: expected a digit in the exponent"},
        {"tru", "t.json:1:1: expected a value"},
        {"{} {}", "t.json:1:4: expected end of input"},
        {"{\"a\":{\"b\":[}}", "t.json:1:12: expected a value"},
        {"NaN", "t.json:1:1: expected a value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        zr_json_doc *d = zr_json_parse(cases[i].text, (int64_t)strlen(cases[i].text), "t.json");
        CHECK_MSG(!d, "case %zu parsed but should not", i);
        const char *m = zr_last_error_message();
        CHECK_MSG(d || strstr(m, cases[i].want), "case %zu: message \"%s\" lacks \"%s\"", i, m,
                  cases[i].want);
        zr_json_doc_free(d);
    }
    char deep[2001];
    memset(deep, '[', 2000);
    deep[2000] = 0;
    CHECK(zr_json_parse(deep, 2000, "t.json") == NULL &&
          strstr(zr_last_error_message(), "at most 512 levels"));
    CHECK(zr_json_parse_file("/nonexistent/x.json") == NULL &&
          strstr(zr_last_error_message(), "/nonexistent/x.json: cannot open"));
}

TEST(json_escape) {
    char buf[64];
    const char s[] = "a\"b\\c\n\x01\xE2\x96\x81";
    int64_t n = zr_json_escape(buf, sizeof buf, s, (int64_t)strlen(s));
    const char want[] = "\"a\\\"b\\\\c\\n\\u0001\xE2\x96\x81\"";
    CHECK(n == (int64_t)strlen(want) && !strcmp(buf, want));
    char small[5];
    CHECK(zr_json_escape(small, sizeof small, s, (int64_t)strlen(s)) == n &&
          !strcmp(small, "\"a\\\""));
    /* and what it writes parses back to the input */
    zr_json_doc *d = zr_json_parse(buf, n, "esc");
    CHECK(d && !strcmp(zr_json_root(d)->u.str, s));
    zr_json_doc_free(d);
}

/* ---- tiny hand-made tokenizers ---------------------------------------------------------- */

/* Llama-3 shape: model.type BPE with ignore_merges, Sequence[Split(regex, Isolated),
 * ByteLevel(use_regex=false)], TemplateProcessing prepending <|begin_of_text|>, merges as pairs.
 * "\u0120" is GPT-2's char for the space byte. */
static const char *llama3_json(int ignore_merges) {
    static char buf[4096];
    snprintf(
        buf, sizeof buf,
        "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\n"
        "\"added_tokens\":[\n"
        " {\"id\":28,\"content\":\"<|begin_of_text|>\",\"single_word\":false,\"lstrip\":false,"
        "\"rstrip\":false,\"normalized\":false,\"special\":true},\n"
        " {\"id\":29,\"content\":\"<|end_of_text|>\",\"single_word\":false,\"lstrip\":false,"
        "\"rstrip\":false,\"normalized\":false,\"special\":true}],\n"
        "\"normalizer\":null,\n"
        "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[\n"
        " {\"type\":\"Split\",\"pattern\":{\"Regex\":\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|"
        "[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| "
        "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|"
        "\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},"
        "\n"
        " {\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":"
        "false}]},\n"
        "\"post_processor\":{\"type\":\"Sequence\",\"processors\":[\n"
        " {\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":false,\"use_regex\":"
        "true},\n"
        " {\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<|begin_of_text|"
        ">\","
        "\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[],\"special_"
        "tokens\":"
        "{\"<|begin_of_text|>\":{\"id\":\"<|begin_of_text|>\",\"ids\":[28],\"tokens\":"
        "[\"<|begin_of_text|>\"]}}}]},\n"
        "\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,"
        "\"use_regex\":true},\n"
        "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,"
        "\"continuing_subword_prefix\":null,\"end_of_word_suffix\":null,\"fuse_unk\":false,"
        "\"byte_fallback\":false,\"ignore_merges\":%s,\n"
        " \"vocab\":{\"h\":0,\"e\":1,\"l\":2,\"o\":3,\"\\u0120\":4,\"w\":5,\"r\":6,\"d\":7,\"1\":8,"
        "\"2\":9,\"3\":10,\"4\":11,\"5\":12,\"he\":13,\"ll\":14,\"llo\":15,\"or\":16,"
        "\"\\u0120w\":17,\"\\u0120wor\":18,\"ld\":19,\"12\":20,\"123\":21,\"45\":22,\"hello\":23,"
        "\"'\":24,\"s\":25,\"'s\":26,\"\\u010a\":27},\n"
        " \"merges\":[[\"h\",\"e\"],[\"l\",\"l\"],[\"ll\",\"o\"],[\"o\",\"r\"],[\"\\u0120\",\"w\"],"
        "[\"\\u0120w\",\"or\"],[\"l\",\"d\"],[\"1\",\"2\"],[\"12\",\"3\"],[\"4\",\"5\"],[\"'\","
        "\"s\"]]}}\n",
        ignore_merges ? "true" : "false");
    return buf;
}

TEST(tiny_llama3) {
    zr_tokenizer *t = load_text(llama3_json(1));
    CHECK_MSG(t, "%s", zr_last_error());
    if (!t) return;
    /* Split: "hello" " world" " " "123" "45"; ByteLevel maps ' ' to U+0120.
     * "hello" is in the vocab, so ignore_merges emits it whole (23).
     * "Ġworld": Ġ w o r l d -> (o,r) rank 3 -> (Ġ,w) 4 -> (Ġw,or) 5 -> (l,d) 6 = Ġwor ld. */
    CHECK_ENCODE(t, "hello world 12345", 1, 28, 23, 18, 19, 4, 21, 22);
    CHECK_ENCODE(t, "hello world 12345", 0, 23, 18, 19, 4, 21, 22);
    /* special tokens are split out before the regex; pieces "hello" "'s" "\n" (U+010A) */
    CHECK_ENCODE(t, "<|end_of_text|>hello's\n", 1, 28, 29, 23, 26, 27);
    /* (?i:'s) also takes "'S"; S is not in the vocab and, without an unk token, vanishes */
    CHECK_ENCODE(t, "hello'S", 0, 23, 24);
    CHECK_ENCODE(t, "", 1, 28);
    CHECK(zr_tokenizer_vocab_size(t) == 30);
    CHECK(zr_tokenizer_bos_id(t) == 28 && zr_tokenizer_eos_id(t) == 29);
    CHECK(zr_tokenizer_token_to_id(t, "<|end_of_text|>") == 29);
    CHECK(zr_tokenizer_token_to_id(t, "\xC4\xA0wor") == 18);
    CHECK(zr_tokenizer_token_to_id(t, "nope") == -1);
    CHECK(zr_tokenizer_id_to_token(t, 18, NULL) &&
          !strcmp(zr_tokenizer_id_to_token(t, 18, NULL), "\xC4\xA0wor"));
    CHECK(zr_tokenizer_id_to_token(t, 50, NULL) == NULL);
    CHECK(zr_tokenizer_is_special(t, 28) && !zr_tokenizer_is_special(t, 23));
    CHECK_DECODE(t, 0, "<|begin_of_text|>hello world 12345", 28, 23, 18, 19, 4, 21, 22);
    CHECK_DECODE(t, 1, "hello world 12345", 28, 23, 18, 19, 4, 21, 22);
    CHECK_DECODE(t, 1, "hello's\n", 23, 26, 27, 9999);
    zr_tokenizer_free(t);
    /* without ignore_merges "hello" is merged: (h,e) 0 -> (l,l) 1 -> (ll,o) 2 = he llo */
    t = load_text(llama3_json(0));
    CHECK(t);
    if (t) CHECK_ENCODE(t, "hello world", 1, 28, 13, 15, 18, 19);
    /* a word of 100 symbols takes the heap path: he llo, 20 times */
    char longw[101] = "";
    int32_t want[40];
    for (int i = 0; i < 20; i++)
        strcat(longw, "hello"), want[2 * i] = 13, want[2 * i + 1] = 15;
    if (t) check_encode(t, longw, 0, want, 40, __LINE__);
    zr_tokenizer_free(t);
}

/* GPT-2 shape: old serialization without model.type, ByteLevel with the GPT-2 regex, legacy
 * "a b" merges, a normalized added token and an lstrip one. */
static const char tiny_gpt2_json[] =
    "{\"version\":\"1.0\",\"added_tokens\":["
    "{\"id\":9,\"special\":true,\"content\":\"<|endoftext|>\",\"single_word\":false,"
    "\"lstrip\":false,\"rstrip\":false,\"normalized\":true},"
    "{\"id\":10,\"special\":true,\"content\":\"<mask>\",\"single_word\":false,"
    "\"lstrip\":true,\"rstrip\":false,\"normalized\":false}],"
    "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
    "\"trim_offsets\":true},\"post_processor\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,"
    "\"trim_offsets\":false},\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,"
    "\"trim_offsets\":true},\"model\":{\"dropout\":null,\"unk_token\":null,"
    "\"continuing_subword_prefix\":\"\",\"end_of_word_suffix\":\"\",\"fuse_unk\":false,"
    "\"vocab\":{\"H\":0,\"i\":1,\"\\u0120\":2,\"!\":3,\"Hi\":4,\"\\u0120H\":5,\"\\u0120Hi\":6,"
    "\"\\u00c3\":7,\"\\u00a9\":8},"
    "\"merges\":[\"\\u0120 H\",\"H i\",\"\\u0120H i\"]}}";

TEST(tiny_gpt2) {
    zr_tokenizer *t = load_text(tiny_gpt2_json);
    CHECK_MSG(t, "%s", zr_last_error());
    if (!t) return;
    /* regex pieces "Hi" "!" " Hi" "!!". "Hi": (H,i) rank 1. "ĠHi": (Ġ,H) rank 0 beats (H,i),
     * then (ĠH,i) rank 2 = ĠHi. "!!" has no merge. */
    CHECK_ENCODE(t, "Hi! Hi!!", 1, 4, 3, 6, 3, 3);
    /* é is bytes C3 A9, which ByteLevel writes as U+00C3 U+00A9 */
    CHECK_ENCODE(t, "\xC3\xA9<|endoftext|>Hi", 0, 7, 8, 9, 4);
    /* lstrip: the space before <mask> belongs to the token */
    CHECK_ENCODE(t, "Hi <mask>!", 0, 4, 10, 3);
    CHECK_ENCODE(t, "Hi<mask> ", 0, 4, 10, 2);
    CHECK_DECODE(t, 0, "Hi\xC3\xA9<|endoftext|> Hi", 4, 7, 8, 9, 6);
    CHECK_DECODE(t, 1, "Hi\xC3\xA9 Hi", 4, 7, 8, 9, 6);
    /* a lone continuation byte decodes to U+FFFD, as Rust's from_utf8_lossy */
    CHECK_DECODE(t, 0, "\xEF\xBF\xBDHi", 8, 4);
    CHECK_DECODE(t, 0, "\xEF\xBF\xBD", 7);
    CHECK(zr_tokenizer_bos_id(t) == 9 && zr_tokenizer_eos_id(t) == 9 &&
          zr_tokenizer_pad_id(t) == -1);
    int32_t *ids;
    int64_t n;
    CHECK(zr_tokenizer_encode(t, "bad \xFF", 5, 0, &ids, &n) != 0 &&
          strstr(zr_last_error_message(), "not valid UTF-8 at byte 4"));
    zr_tokenizer_free(t);
}

/* SentencePiece shape: normalizer Prepend + Replace, no pre-tokenizer, byte_fallback,
 * fuse_unk, <s> template, decoder Replace/ByteFallback/Fuse/Strip. */
static const char tiny_sp_json[] =
    "{\"added_tokens\":["
    "{\"id\":0,\"content\":\"<unk>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true},"
    "{\"id\":1,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true},"
    "{\"id\":2,\"content\":\"</s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true}],"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":"
    "\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}]},"
    "\"pre_tokenizer\":null,"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
    "{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[],"
    "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]}}},"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":"
    "{\"String\":\"\\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},"
    "{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":\"<unk>\","
    "\"continuing_subword_prefix\":null,\"end_of_word_suffix\":null,\"fuse_unk\":true,"
    "\"byte_fallback\":true,\"ignore_merges\":false,"
    "\"vocab\":{\"<unk>\":0,\"<s>\":1,\"</s>\":2,\"<0xC3>\":3,\"<0xA9>\":4,\"\\u2581\":5,"
    "\"a\":6,\"b\":7,\"\\u2581a\":8,\"ab\":9,\"\\u2581ab\":10},"
    "\"merges\":[\"\\u2581 a\",\"a b\",\"\\u2581a b\"]}}";

TEST(tiny_sentencepiece) {
    zr_tokenizer *t = load_text(tiny_sp_json);
    CHECK_MSG(t, "%s", zr_last_error());
    if (!t) return;
    /* "▁ab▁ab": (▁,a) rank 0 at 0 then at 3, then (▁a,b) rank 2 twice */
    CHECK_ENCODE(t, "ab ab", 1, 1, 10, 10);
    CHECK_ENCODE(t, "ab ab", 0, 10, 10);
    /* é falls back to its bytes; 日本 has no byte tokens: two unks fused into one */
    CHECK_ENCODE(t,
                 "\xC3\xA9\xE6\x97\xA5\xE6\x9C\xAC"
                 "a",
                 1, 1, 5, 3, 4, 0, 6);
    /* HF quirk kept: a pending unk is emitted after byte-fallback bytes that follow it */
    CHECK_ENCODE(t, "\xE6\x97\xA5\xC3\xA9", 0, 5, 3, 4, 0);
    /* added tokens split first; each piece is normalized (gets its own ▁) */
    CHECK_ENCODE(t, "a</s>b", 1, 1, 8, 2, 5, 7);
    CHECK_ENCODE(t, "", 1, 1);
    int32_t *ids;
    int64_t n;
    CHECK(zr_tokenizer_encode(t, "", 0, 0, &ids, &n) == 0 && n == 0);
    free(ids);
    CHECK_DECODE(t, 1, "ab ab", 1, 10, 10);
    CHECK_DECODE(t, 0, "<s> ab ab", 1, 10, 10);
    CHECK_DECODE(t, 0,
                 "\xC3\xA9"
                 "a",
                 5, 3, 4, 6);
    CHECK_DECODE(t, 0,
                 "\xEF\xBF\xBD"
                 "a",
                 3, 6); /* a lone byte: one U+FFFD per byte */
    CHECK(zr_tokenizer_bos_id(t) == 1 && zr_tokenizer_eos_id(t) == 2);
    zr_tokenizer_free(t);
}

/* The newer Llama-2 serialization: no normalizer, Metaspace pre-tokenizer and decoder. */
TEST(tiny_metaspace) {
    char json[sizeof tiny_sp_json + 256];
    const char *a = strstr(tiny_sp_json, "\"normalizer\""),
               *b = strstr(tiny_sp_json, "\"post_processor\"");
    const char *c = strstr(tiny_sp_json, "\"model\"");
    snprintf(json, sizeof json,
             "%.*s\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Metaspace\","
             "\"replacement\":\"\\u2581\",\"prepend_scheme\":\"first\",\"split\":false},"
             "%.*s\"decoder\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\","
             "\"prepend_scheme\":\"first\",\"split\":false},%s",
             (int)(a - tiny_sp_json), tiny_sp_json, (int)(strstr(b, "\"decoder\"") - b), b, c);
    zr_tokenizer *t = load_text(json);
    CHECK_MSG(t, "%s", zr_last_error());
    if (!t) return;
    /* "first": only the piece at the start of the input gets a ▁ */
    CHECK_ENCODE(t, "ab ab", 1, 1, 10, 10);
    CHECK_ENCODE(t, "a</s>b ab", 0, 8, 2, 7, 10);
    /* a leading space becomes the ▁ itself: HF replaces spaces before it prepends, so none is added */
    CHECK_ENCODE(t, " ab", 0, 10);
    CHECK_DECODE(t, 1, "ab ab", 1, 10, 10);
    zr_tokenizer_free(t);
}

/* transformers 5's pipeline for LlamaTokenizer over a file with the Prepend normalizer. */
TEST(use_metaspace) {
    zr_tokenizer *t = load_text(tiny_sp_json);
    CHECK_MSG(t, "%s", zr_last_error());
    if (!t) return;
    CHECK_ENCODE(t, "a</s>b", 0, 8, 2, 5, 7); /* the file's: each piece gets its own ▁ */
    CHECK_ENCODE(t, " ab", 0, 5, 10);         /* and a leading space another */
    CHECK(zr_tokenizer_use_metaspace(t, ZR_PREPEND_FIRST) == 0);
    CHECK_ENCODE(t, "a</s>b", 0, 8, 2, 7);
    CHECK_ENCODE(t, " ab", 0, 10);
    CHECK_ENCODE(t, "ab ab", 1, 1, 10, 10);
    CHECK(zr_tokenizer_use_metaspace(t, ZR_PREPEND_ALWAYS) == 0);
    CHECK_ENCODE(t, "a</s>b", 0, 8, 2, 5, 7);
    CHECK(zr_tokenizer_use_metaspace(t, ZR_PREPEND_NEVER) == 0);
    CHECK_ENCODE(t, "ab ab", 0, 9, 10);
    CHECK(zr_tokenizer_use_metaspace(t, 7) != 0 && strstr(zr_last_error_message(), "prepend scheme 7"));
    zr_tokenizer_free(t);
}

TEST(tokenizer_load_errors) {
    CHECK(load_text("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}") == NULL &&
          strstr(zr_last_error_message(), "model.type \"WordPiece\" is not supported"));
    CHECK(load_text("{\"model\":{\"vocab\":{\"a\":0},\"merges\":[\"a\"]}}") == NULL &&
          strstr(zr_last_error_message(), "model.merges[0] \"a\" has no space"));
    CHECK(
        load_text("{\"model\":{\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}") == NULL &&
        strstr(zr_last_error_message(), "model.merges[0] uses \"b\", which is not in model.vocab"));
    CHECK(load_text("{\"model\":{\"vocab\":{\"a\":0},\"merges\":[7]}}") == NULL &&
          strstr(zr_last_error_message(), "model.merges[0] is not a string or pair"));
    CHECK(load_text("{\"normalizer\":{\"type\":\"Precompiled\"},\"model\":{\"vocab\":{},\"merges\":[]}}") ==
              NULL &&
          strstr(zr_last_error_message(), "normalizer type \"Precompiled\" is not supported (Sequence, Prepend"));
    zr_tokenizer *nfkc = load_text("{\"normalizer\":{\"type\":\"NFKC\"},\"model\":{\"vocab\":{},\"merges\":[]}}");
#ifdef ZR_HAVE_UTF8PROC
    CHECK(nfkc != NULL);
#else
    CHECK(nfkc == NULL && strstr(zr_last_error_message(), "needs utf8proc, which this zrun was built without"));
#endif
    zr_tokenizer_free(nfkc);
    CHECK(load_text("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},"
                    "\"behavior\":\"Isolated\"},\"model\":{\"vocab\":{},\"merges\":[]}}") == NULL &&
          strstr(zr_last_error_message(), "pre_tokenizer Split.pattern does not compile"));
    CHECK(load_text("{\"model\":{\"vocab\":{\"a\":0},\"merges\":[],}}") == NULL &&
          strstr(zr_last_error_message(), "tokenizer.json:1:"));
    CHECK(zr_tokenizer_load("/nonexistent/tokenizer.json") == NULL);
    CHECK(load_text("{\"model\":{\"vocab\":{\"a\":1.0},\"merges\":[]}}") == NULL &&
          strstr(zr_last_error_message(), "model.vocab[\"a\"] must be an integer id from 0 to 2^24-1, got 1"));
    CHECK(load_text("{\"model\":{\"vocab\":{\"a\":-4},\"merges\":[]}}") == NULL &&
          strstr(zr_last_error_message(), "model.vocab[\"a\"] must be an integer id from 0 to 2^24-1, got -4"));
}

/* Added-token ids that no int32 holds were silently renumbered (issue 16): now refused. */
TEST(tokenizer_added_token_ids) {
    static const struct {
        const char *id, *want;
    } cases[] = {
        {"-1", "added_tokens[1] (\"<x>\") has id -1; an id must be an integer from 0 to 2147483647"},
        {"2147483648", "has id 2147483648; an id must be an integer"},
        {"4294967296", "has id 4294967296;"},
        {"1e400", "has id inf;"},
        {"3.0", "has id 3;"},
        {"2e0", "has id 2;"},
        {"\"3\"", "has id string;"},
        {"null", "has id null;"},
    };
    char json[512];
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        snprintf(json, sizeof json,
                 "{\"added_tokens\":[{\"id\":2,\"content\":\"<s>\"},{\"id\":%s,\"content\":\"<x>\"}],"
                 "\"model\":{\"vocab\":{\"a\":0,\"b\":1},\"merges\":[]}}",
                 cases[i].id);
        zr_tokenizer *t = load_text(json);
        CHECK_MSG(!t && strstr(zr_last_error_message(), cases[i].want), "id %s: %s", cases[i].id,
                  t ? "loaded" : zr_last_error_message());
        zr_tokenizer_free(t);
    }
    CHECK(load_text("{\"added_tokens\":[{\"content\":\"<x>\"}],\"model\":{\"vocab\":{},\"merges\":[]}}") == NULL &&
          strstr(zr_last_error_message(), "added_tokens[0] (\"<x>\") has id absent;"));
    /* the largest id is fine (HF assigns the next free id, as before) */
    snprintf(json, sizeof json,
             "{\"added_tokens\":[{\"id\":2147483647,\"content\":\"<x>\"}],"
             "\"model\":{\"vocab\":{\"a\":0,\"b\":1},\"merges\":[]}}");
    zr_tokenizer *t = load_text(json);
    CHECK_MSG(t && zr_tokenizer_token_to_id(t, "<x>") == 2, "%s", t ? "wrong id" : zr_last_error_message());
    zr_tokenizer_free(t);
    /* BertProcessing / RobertaProcessing ids */
    CHECK(load_text("{\"post_processor\":{\"type\":\"BertProcessing\",\"cls\":[\"a\",-1],\"sep\":[\"b\",1]},"
                    "\"model\":{\"vocab\":{\"a\":0,\"b\":1},\"merges\":[]}}") == NULL &&
          strstr(zr_last_error_message(), "post_processor BertProcessing needs cls and sep as [token, id] with an id"));
}

/* A word that encodes to no id at all (no unk token, chars not in the vocab) used to memcpy from
 * a NULL buffer (UBSan); the second time it comes from the word cache. */
TEST(tokenizer_word_with_no_ids) {
    zr_tokenizer *t = load_text(llama3_json(0));
    CHECK_MSG(t, "%s", zr_last_error());
    if (!t) return;
    CHECK_ENCODE(t, "QQQ", 0);
    CHECK_ENCODE(t, "QQQ", 0);
    CHECK_ENCODE(t, "QQQ hello", 0, 4, 13, 15);
    zr_tokenizer_free(t);
}

/* ---- real tokenizers against Hugging Face ------------------------------------------------ */

typedef struct {
    const char *name, *tokenizer, *refs;
} real_case;

static const real_case gpt2_case = {"gpt2", "tokenizers/gpt2/tokenizer.json",
                                    "refs/wiki.valid.gpt2.ids.json"};
static const real_case llama_case = {"tinyllama",
                                     "tokenizers/tinyllama-1.1b-chat-v1.0/tokenizer.json",
                                     "refs/wiki.valid.tinyllama.ids.json"};

static zr_tokenizer *load_real(const real_case *rc) {
    char *p = data_path(rc->tokenizer);
    zr_tokenizer *t = zr_tokenizer_load(p);
    CHECK_MSG(t, "%s", zr_last_error());
    free(p);
    return t;
}

TEST(gpt2_known) {
    zr_tokenizer *t = load_real(&gpt2_case);
    if (!t) return;
    CHECK_ENCODE(t, "Hello world", 1, 15496, 995);
    CHECK_ENCODE(t, " = Valkyria Chronicles III = \n", 1, 796, 569, 18354, 7496, 17740, 6711, 796,
                 220, 198);
    CHECK(zr_tokenizer_vocab_size(t) == 50257 && zr_tokenizer_eos_id(t) == 50256);
    CHECK_DECODE(t, 0, " = Valkyria Chronicles III = \n", 796, 569, 18354, 7496, 17740, 6711, 796,
                 220, 198);
    zr_tokenizer_free(t);
}

TEST(tinyllama_known) {
    zr_tokenizer *t = load_real(&llama_case);
    if (!t) return;
    CHECK_ENCODE(t, "Hello world", 1, 1, 15043, 3186);
    CHECK_ENCODE(t, "This is a test sentence.", 1, 1, 910, 338, 263, 1243, 10541, 29889);
    CHECK(zr_tokenizer_vocab_size(t) == 32000 && zr_tokenizer_bos_id(t) == 1 &&
          zr_tokenizer_eos_id(t) == 2);
    CHECK_DECODE(t, 1, "This is a test sentence.", 1, 910, 338, 263, 1243, 10541, 29889);
    zr_tokenizer_free(t);
}

/* Lines of wiki.valid.raw without their newlines (3760 of them). */
typedef struct {
    char *text;
    int64_t len, n;
    int64_t *off, *lens;
} wiki;

static int wiki_load(wiki *w) {
    char *p = data_path("wikitext-2-raw/wiki.valid.raw");
    w->text = read_file(p, &w->len);
    free(p);
    if (!w->text) return -1;
    w->off = malloc(sizeof(int64_t) * (size_t)(w->len + 1));
    w->lens = malloc(sizeof(int64_t) * (size_t)(w->len + 1));
    w->n = 0;
    for (int64_t s = 0, i = 0; i <= w->len; i++)
        if (i == w->len || w->text[i] == '\n') {
            if (i == w->len && s == w->len) break; /* no empty line after the final newline */
            w->off[w->n] = s, w->lens[w->n++] = i - s;
            s = i + 1;
        }
    return 0;
}

static void wiki_free(wiki *w) {
    free(w->text), free(w->off), free(w->lens);
}

/* Compares ids with a JSON array of ints; returns the first mismatching index or -1. */
static int64_t first_diff(const int32_t *ids, int64_t n, const zr_json *ref) {
    int64_t m = zr_json_len(ref);
    for (int64_t i = 0; i < n && i < m; i++)
        if (zr_json_at(ref, i)->u.n.i != ids[i]) return i;
    return n == m ? -1 : (n < m ? n : m);
}

static void check_real_refs(const real_case *rc) {
    zr_tokenizer *t = load_real(rc);
    wiki w;
    char *rp = data_path(rc->refs);
    zr_json_doc *doc = zr_json_parse_file(rp);
    free(rp);
    CHECK_MSG(doc, "%s", zr_last_error());
    CHECK(wiki_load(&w) == 0);
    if (!t || !doc || !w.text) goto done;
    const zr_json *per_line = zr_json_get(zr_json_root(doc), "per_line");
    const zr_json *whole = zr_json_get(zr_json_root(doc), "whole");
    CHECK_MSG(zr_json_len(per_line) == w.n, "%lld lines, refs have %lld", (long long)w.n,
              (long long)zr_json_len(per_line));
    int64_t bad_lines = 0;
    for (int64_t i = 0; i < w.n && i < zr_json_len(per_line); i++) {
        int32_t *ids;
        int64_t n;
        if (zr_tokenizer_encode(t, w.text + w.off[i], (size_t)w.lens[i], 1, &ids, &n)) {
            CHECK_MSG(0, "%s line %lld: %s", rc->name, (long long)i + 1, zr_last_error());
            break;
        }
        int64_t d = first_diff(ids, n, zr_json_at(per_line, i));
        if (d >= 0 && bad_lines++ == 0)
            CHECK_MSG(0, "%s line %lld differs at token %lld (%lld ids, want %lld)", rc->name,
                      (long long)i + 1, (long long)d, (long long)n,
                      (long long)zr_json_len(zr_json_at(per_line, i)));
        free(ids);
    }
    if (bad_lines)
        printf("  %s: %lld of %lld lines differ\n", rc->name, (long long)bad_lines, (long long)w.n);
    int32_t *ids;
    int64_t n;
    CHECK(zr_tokenizer_encode(t, w.text, (size_t)w.len, 0, &ids, &n) == 0);
    int64_t d = first_diff(ids, n, whole);
    CHECK_MSG(d < 0, "%s whole file differs at token %lld (%lld ids, want %lld)", rc->name,
              (long long)d, (long long)n, (long long)zr_json_len(whole));
    /* both tokenizers give the text back exactly */
    char *back = NULL;
    CHECK(zr_tokenizer_decode(t, ids, n, 1, &back) == 0);
    CHECK_MSG(back && (int64_t)strlen(back) == w.len && !memcmp(back, w.text, (size_t)w.len),
              "%s: decode(encode(file)) is not the file", rc->name);
    free(back);
    free(ids);
done:
    if (w.text) wiki_free(&w);
    zr_json_doc_free(doc);
    zr_tokenizer_free(t);
}

TEST(gpt2_wikitext_refs) {
    check_real_refs(&gpt2_case);
}
TEST(tinyllama_wikitext_refs) {
    check_real_refs(&llama_case);
}

/* Several threads share one tokenizer (and its word cache); each must get the serial ids. */
typedef struct {
    zr_tokenizer *tok;
    const wiki *w;
    int64_t first;
    int64_t bad;
} thread_arg;

static void *thread_main(void *p) {
    thread_arg *a = p;
    for (int64_t i = a->first; i < a->w->n; i += 1) {
        int32_t *x, *y;
        int64_t nx, ny;
        const int64_t k = (i * 7 + a->first * 13) % a->w->n;
        if (zr_tokenizer_encode(a->tok, a->w->text + a->w->off[k], (size_t)a->w->lens[k], 1, &x,
                                &nx)) {
            a->bad++;
            continue;
        }
        if (zr_tokenizer_encode(a->tok, a->w->text + a->w->off[k], (size_t)a->w->lens[k], 1, &y,
                                &ny) ||
            nx != ny || memcmp(x, y, (size_t)nx * sizeof *x))
            a->bad++;
        free(x), free(y);
    }
    return NULL;
}

TEST(gpt2_threads) {
    zr_tokenizer *t = load_real(&gpt2_case);
    wiki w;
    if (!t || wiki_load(&w)) {
        zr_tokenizer_free(t);
        CHECK(0);
        return;
    }
    pthread_t th[4];
    thread_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thread_arg){t, &w, i, 0};
        pthread_create(&th[i], NULL, thread_main, &args[i]);
    }
    int64_t bad = 0;
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL), bad += args[i].bad;
    CHECK_MSG(bad == 0, "%lld encodes disagreed across threads", (long long)bad);
    wiki_free(&w);
    zr_tokenizer_free(t);
}

int main(void) {
    RUN(json_values);
    RUN(json_integers);
    RUN(json_big_object);
    RUN(json_errors);
    RUN(json_escape);
    RUN(tiny_llama3);
    RUN(tiny_gpt2);
    RUN(tiny_sentencepiece);
    RUN(tiny_metaspace);
    RUN(use_metaspace);
    RUN(tokenizer_load_errors);
    RUN(tokenizer_added_token_ids);
    RUN(tokenizer_word_with_no_ids);
    if (have_data("gpt2_known", gpt2_case.tokenizer)) RUN(gpt2_known);
    if (have_data("tinyllama_known", llama_case.tokenizer)) RUN(tinyllama_known);
    if (have_data("gpt2_wikitext_refs", gpt2_case.refs) &&
        have_data("gpt2_wikitext_refs", "wikitext-2-raw/wiki.valid.raw"))
        RUN(gpt2_wikitext_refs);
    if (have_data("tinyllama_wikitext_refs", llama_case.refs) &&
        have_data("tinyllama_wikitext_refs", "wikitext-2-raw/wiki.valid.raw"))
        RUN(tinyllama_wikitext_refs);
    if (have_data("gpt2_threads", gpt2_case.tokenizer) &&
        have_data("gpt2_threads", "wikitext-2-raw/wiki.valid.raw"))
        RUN(gpt2_threads);
    return test_summary();
}
