/* Fuzz target: loading a tokenizer.json (runtime/tokenizer/tokenizer.c, pipeline.c). Any input
 * must load or fail with a message; a loaded tokenizer then encodes a few fixed texts and a slice
 * of the input, decodes what it got and every id around its vocabulary, and answers the id
 * lookups. The file lives in a memfd (so no tokenizer_config.json is found next to it). */
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

static void encode_decode(const zr_tokenizer *t, const char *text, size_t len) {
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        int64_t n = 0;
        if (zr_tokenizer_encode(t, text, len, special, &ids, &n)) {
            zr_clear_error(); /* invalid UTF-8 */
            continue;
        }
        for (int64_t i = 0; i < n; i++)
            FUZZ_ASSERT(ids[i] >= 0);
        char *s = NULL;
        int64_t slen = 0;
        FUZZ_ASSERT(zr_tokenizer_decode_len(t, ids, n, special, &s, &slen) == 0 && s && s[slen] == 0);
        free(s);
        free(ids);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("tokenizer.json", 0);
        if (fd < 0) abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || lseek(fd, 0, SEEK_SET) != 0) abort();
    if (size && write(fd, data, size) != (ssize_t)size) abort();
    zr_tokenizer *t = zr_tokenizer_load(path);
    if (!t) {
        FUZZ_ASSERT(zr_last_error_message()[0]);
        zr_clear_error();
        return 0;
    }
    static const char *texts[] = {"", "Hello world! 12345", " \t\n  x  ", "ab ab</s>b",
                                  "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80",
                                  "<s><|endoftext|><unk>"};
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
        encode_decode(t, texts[i], strlen(texts[i]));
    encode_decode(t, (const char *)data, size < 64 ? size : 64);
    int64_t vs = zr_tokenizer_vocab_size(t);
    FUZZ_ASSERT(vs >= 0);
    int64_t top = vs < 4096 ? vs + 2 : 4096;
    int32_t *all = malloc((size_t)(top + 1) * sizeof *all);
    if (!all) abort();
    for (int64_t i = 0; i <= top; i++)
        all[i] = (int32_t)i - 1; /* -1 .. vocab_size: the edges too */
    for (int skip = 0; skip < 2; skip++) {
        char *s = NULL;
        FUZZ_ASSERT(zr_tokenizer_decode(t, all, top + 1, skip, &s) == 0 && s);
        free(s);
    }
    free(all);
    for (int32_t id = -1; id <= (int32_t)top; id++) {
        int64_t len = 0;
        const char *tokstr = zr_tokenizer_id_to_token(t, id, &len);
        if (tokstr) FUZZ_ASSERT(tokstr[len] == 0);
        (void)zr_tokenizer_is_special(t, id);
    }
    (void)zr_tokenizer_token_to_id(t, "<s>");
    (void)zr_tokenizer_bos_id(t), (void)zr_tokenizer_eos_id(t), (void)zr_tokenizer_pad_id(t);
    zr_tokenizer_free(t);
    return 0;
}
