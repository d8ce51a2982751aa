/* Fuzz target: encoding and decoding (runtime/tokenizer/encode.c, bpe.c, decode.c) with fixed
 * tokenizers. Input byte 0 picks the tokenizer (bits 0-1) and add_special_tokens /
 * skip_special_tokens (bits 2, 3); the rest is the text, then reread as ids for decode.
 *   0: a GPT-2-style byte-level BPE built here with all 256 byte tokens, so nothing is lost:
 *      decode(encode(text)) must give the text back exactly (for valid UTF-8)
 *   1: a SentencePiece-style BPE (Prepend/Replace normalizer, byte fallback, fused unk, Strip)
 *   2: the same with the Metaspace pre-tokenizer and decoder (prepend "never"), no unk token and
 *      no byte fallback: unknown chars vanish, so whole words encode to no id at all
 *   3: $ZRUN_FUZZ_TOKENIZER (a real tokenizer.json) when set, else 0 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/base/error.h"
#include "tokenizer/tokenizer.h"

#define FUZZ_ASSERT(c)                                                                              \
    do {                                                                                            \
        if (!(c)) __builtin_trap();                                                                 \
    } while (0)

static const char sp_head[] =
    "{\"added_tokens\":["
    "{\"id\":0,\"content\":\"<unk>\",\"normalized\":false,\"special\":true},"
    "{\"id\":1,\"content\":\"<s>\",\"normalized\":false,\"special\":true},"
    "{\"id\":2,\"content\":\"</s>\",\"normalized\":false,\"special\":true},"
    "{\"id\":12,\"content\":\"<mask>\",\"lstrip\":true,\"rstrip\":true,\"normalized\":false,"
    "\"special\":false}],";
static const char sp_normalizer[] =
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":"
    "\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}]},"
    "\"pre_tokenizer\":null,"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":"
    "{\"String\":\"\\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},"
    "{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},";
static const char sp_metaspace[] =
    "\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\","
    "\"prepend_scheme\":\"never\",\"split\":false},"
    "\"decoder\":{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"first\","
    "\"split\":false},";
static const char sp_model_unk[] = "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,"
                                   "\"byte_fallback\":true,";
static const char sp_model_none[] = "\"model\":{\"type\":\"BPE\",\"unk_token\":null,\"byte_fallback\":false,";
static const char sp_tail[] =
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
    "{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[],"
    "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]}}},"
    "%s\"vocab\":{\"<unk>\":0,\"<s>\":1,\"</s>\":2,\"<0xC3>\":3,\"<0xA9>\":4,\"\\u2581\":5,"
    "\"a\":6,\"b\":7,\"\\u2581a\":8,\"ab\":9,\"\\u2581ab\":10,\"<0x20>\":11},"
    "\"merges\":[\"\\u2581 a\",\"a b\",\"\\u2581a b\"]}}";

/* GPT-2's byte -> char map (bytes_to_unicode), written as a JSON string escape. */
static int byte_char(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    int n = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255))) n++;
    return 256 + n;
}

static char *bytelevel_json(void) {
    size_t cap = 65536, o = 0;
    char *s = malloc(cap);
    if (!s) abort();
    o += (size_t)snprintf(
        s + o, cap - o,
        "{\"added_tokens\":[{\"id\":260,\"content\":\"<|endoftext|>\",\"normalized\":false,"
        "\"special\":true}],\"normalizer\":null,"
        "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
        "\"post_processor\":{\"type\":\"ByteLevel\"},\"decoder\":{\"type\":\"ByteLevel\"},"
        "\"model\":{\"type\":\"BPE\",\"vocab\":{");
    for (int b = 0; b < 256; b++)
        o += (size_t)snprintf(s + o, cap - o, "\"\\u%04x\":%d,", byte_char(b), b);
    /* merges: (Ġ,t) (h,e) (Ġt,he) (i,n) */
    o += (size_t)snprintf(s + o, cap - o,
                          "\"\\u0120t\":256,\"he\":257,\"\\u0120the\":258,\"in\":259},"
                          "\"merges\":[\"\\u0120 t\",\"h e\",\"\\u0120t he\",\"i n\"]}}");
    return s;
}

static zr_tokenizer *load_string(const char *json) {
    int fd = memfd_create("tokenizer.json", 0);
    if (fd < 0) abort();
    size_t n = strlen(json);
    if (write(fd, json, n) != (ssize_t)n) abort();
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    zr_tokenizer *t = zr_tokenizer_load(path);
    close(fd);
    if (!t) {
        fprintf(stderr, "fuzz_tokenizer_encode: %s\n", zr_last_error_message());
        abort();
    }
    return t;
}

static zr_tokenizer *toks[4];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char *bl = bytelevel_json(), buf[8192];
    toks[0] = load_string(bl);
    free(bl);
    snprintf(buf, sizeof buf, "%s%s", sp_head, sp_normalizer);
    snprintf(buf + strlen(buf), sizeof buf - strlen(buf), sp_tail, sp_model_unk);
    toks[1] = load_string(buf);
    snprintf(buf, sizeof buf, "%s%s", sp_head, sp_metaspace);
    snprintf(buf + strlen(buf), sizeof buf - strlen(buf), sp_tail, sp_model_none);
    toks[2] = load_string(buf);
    const char *real = getenv("ZRUN_FUZZ_TOKENIZER");
    if (real && *real) {
        toks[3] = zr_tokenizer_load(real);
        if (!toks[3]) {
            fprintf(stderr, "fuzz_tokenizer_encode: %s\n", zr_last_error_message());
            abort();
        }
    }
    return 0;
}

static int valid_utf8(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        size_t len = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3
                               : (c >= 0xF0 && c <= 0xF4)     ? 4 : 0;
        if (!len || i + len > n) return 0;
        for (size_t k = 1; k < len; k++)
            if ((p[i + k] & 0xC0) != 0x80) return 0;
        if (len == 3 && ((c == 0xE0 && p[i + 1] < 0xA0) || (c == 0xED && p[i + 1] > 0x9F))) return 0;
        if (len == 4 && ((c == 0xF0 && p[i + 1] < 0x90) || (c == 0xF4 && p[i + 1] > 0x8F))) return 0;
        i += len;
    }
    return 1;
}

static void decode_ok(const zr_tokenizer *t, const int32_t *ids, int64_t n, int skip) {
    char *s = NULL;
    int64_t len = -1;
    FUZZ_ASSERT(zr_tokenizer_decode_len(t, ids, n, skip, &s, &len) == 0 && s && len >= 0 && !s[len]);
    free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int which = data[0] & 3, add = (data[0] >> 2) & 1, skip = (data[0] >> 3) & 1;
    const zr_tokenizer *t = toks[which] ? toks[which] : toks[0];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int32_t *ids = NULL;
    int64_t n = 0;
    int rc = zr_tokenizer_encode(t, text, len, add, &ids, &n);
    FUZZ_ASSERT((rc == 0) == valid_utf8(data + 1, len)); /* only invalid UTF-8 is refused */
    if (rc) {
        zr_clear_error();
    } else {
        decode_ok(t, ids, n, skip);
        if (t == toks[0] && !add) { /* byte-level with every byte: an exact round trip */
            char *s = NULL;
            int64_t slen = 0;
            FUZZ_ASSERT(zr_tokenizer_decode_len(t, ids, n, 0, &s, &slen) == 0);
            FUZZ_ASSERT(slen == (int64_t)len && !memcmp(s, text, len));
            free(s);
        }
        free(ids);
    }
    /* the same bytes as ids: raw int32s (any value), then small ones around the vocabulary */
    int64_t m = (int64_t)(len / 4), vs = zr_tokenizer_vocab_size(t);
    int32_t *raw = malloc((size_t)(len + 1) * sizeof *raw);
    if (!raw) abort();
    for (int64_t i = 0; i < m; i++)
        memcpy(&raw[i], text + 4 * i, 4);
    decode_ok(t, raw, m, skip);
    for (size_t i = 0; i < len; i++)
        raw[i] = (int32_t)((unsigned char)text[i] % (vs + 3)) - 1;
    decode_ok(t, raw, (int64_t)len, skip);
    free(raw);
    return 0;
}
