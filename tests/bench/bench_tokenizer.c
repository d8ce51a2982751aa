/* Tokenizer throughput: encodes wikitext-2 wiki.valid.raw (1.1 MB) with the GPT-2 and TinyLlama
 * tokenizer.json files, single-threaded: the whole file with a cold word cache and warm, and
 * line by line. Data from $ZRUN_TEST_DATA or ../shared/data; skips when absent. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/base/error.h"
#include "tokenizer/tokenizer.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *read_all(const char *path, int64_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) free(b), b = NULL;
    fclose(f);
    if (b) b[n] = 0, *len = n;
    return b;
}

static void row(const char *name, const char *mode, int64_t tokens, int64_t bytes, double s) {
    printf("| %-9s | %-18s | %8lld | %7.1f | %10.0f | %6.2f |\n", name, mode, (long long)tokens,
           s * 1e3, (double)tokens / s, (double)bytes / s / 1e6);
}

static int64_t encode_whole(zr_tokenizer *t, const char *text, int64_t len, double *secs) {
    int32_t *ids;
    int64_t n;
    double t0 = now();
    if (zr_tokenizer_encode(t, text, (size_t)len, 0, &ids, &n)) return -1;
    *secs = now() - t0;
    free(ids);
    return n;
}

static int64_t encode_lines(zr_tokenizer *t, const char *text, int64_t len, double *secs) {
    int64_t total = 0;
    double t0 = now();
    for (int64_t s = 0; s < len;) {
        const char *nl = memchr(text + s, '\n', (size_t)(len - s));
        int64_t e = nl ? nl - text : len;
        int32_t *ids;
        int64_t n;
        if (zr_tokenizer_encode(t, text + s, (size_t)(e - s), 1, &ids, &n)) return -1;
        total += n;
        free(ids);
        s = e + 1;
    }
    *secs = now() - t0;
    return total;
}

int main(void) {
    const char *dir = getenv("ZRUN_TEST_DATA");
    if (!dir || !*dir) dir = "../shared/data";
    static const char *const names[] = {"gpt2", "tinyllama"};
    static const char *const files[] = {"tokenizers/gpt2/tokenizer.json",
                                        "tokenizers/tinyllama-1.1b-chat-v1.0/tokenizer.json"};
    char path[1024];
    snprintf(path, sizeof path, "%s/wikitext-2-raw/wiki.valid.raw", dir);
    int64_t len;
    char *text = read_all(path, &len);
    if (!text) {
        printf("SKIP bench_tokenizer: data not found at %s\n", path);
        return 0;
    }
    printf("wiki.valid.raw: %.2f MB, one thread\n\n", (double)len / 1e6);
    printf("| tokenizer | what               |   tokens |      ms |   tokens/s |   MB/s |\n");
    printf("|-----------|--------------------|----------|---------|------------|--------|\n");
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[k]);
        double t0 = now();
        zr_tokenizer *t = zr_tokenizer_load(path);
        double load = now() - t0;
        if (!t) {
            printf("load failed: %s\n", zr_last_error());
            return 1;
        }
        printf("| %-9s | %-18s | %8s | %7.1f | %10s | %6s |\n", names[k], "load tokenizer.json", "",
               load * 1e3, "", "");
        double s = 0, best = 1e9;
        int64_t n = encode_whole(t, text, len, &s);
        row(names[k], "whole, cold cache", n, len, s);
        for (int r = 0; r < 3; r++) {
            n = encode_whole(t, text, len, &s);
            if (s < best) best = s;
        }
        row(names[k], "whole, warm (best3)", n, len, best);
        best = 1e9;
        for (int r = 0; r < 3; r++) {
            n = encode_lines(t, text, len, &s);
            if (s < best) best = s;
        }
        row(names[k], "per line (best 3)", n, len, best);
        zr_tokenizer_free(t);
    }
    free(text);
    return 0;
}
