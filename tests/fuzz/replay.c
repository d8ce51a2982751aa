/* main() for the fuzz targets where libFuzzer is not available (a gcc build): runs
 * LLVMFuzzerTestOneInput once on each file named and on each file inside each directory named
 * (the seed corpus and the regression inputs), under the sanitizers the target was built with.
 *   build/fuzz/fuzz_json tests/fuzz/corpus/fuzz_json tests/fuzz/regress/fuzz_json
 * Prints "replayed N inputs"; a crash is the sanitizer's report and a non-zero exit. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static long n_inputs;

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 1;
    }
    size_t cap = 4096, n = 0, got;
    uint8_t *buf = malloc(cap);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "replay: out of memory reading %s\n", path);
        return 1;
    }
    /* an exact-size copy, so that reading one byte past the input is caught */
    uint8_t *exact = malloc(n ? n : 1);
    memcpy(exact, buf, n);
    free(buf);
    fprintf(stderr, "replay: %s (%zu bytes)\n", path, n);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    n_inputs++;
    return 0;
}

static int run_path(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "replay: no such file or directory: %s\n", path);
        return 1;
    }
    if (!S_ISDIR(st.st_mode)) return run_file(path);
    struct dirent **names;
    int k = scandir(path, &names, NULL, alphasort), rc = 0;
    if (k < 0) {
        fprintf(stderr, "replay: cannot read the directory %s\n", path);
        return 1;
    }
    for (int i = 0; i < k; i++) {
        if (names[i]->d_name[0] != '.') {
            char *p = NULL;
            if (asprintf(&p, "%s/%s", path, names[i]->d_name) < 0) return 1;
            rc |= run_path(p);
            free(p);
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int rc = 0;
    for (int i = 1; i < argc; i++)
        rc |= run_path(argv[i]);
    printf("replayed %ld inputs\n", n_inputs);
    return rc;
}
