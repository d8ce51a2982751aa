/* Fuzz target: the safetensors reader (runtime/io/safetensors.c): header validation, then every
 * tensor loaded in its own dtype and converted to f32 and bf16. Each input is tried twice: as a
 * whole file, and as "header JSON, a 0 byte, data" with the 8-byte length written here, so that
 * mutations of the JSON are not lost to a wrong length prefix. Files live in a memfd. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "io/safetensors.h"

#define FUZZ_ASSERT(c)                                                                              \
    do {                                                                                            \
        if (!(c)) __builtin_trap();                                                                 \
    } while (0)

static int fd = -1;
static char path[64];

static void try_file(const uint8_t *a, size_t na, const uint8_t *b, size_t nb) {
    if (ftruncate(fd, 0) != 0 || lseek(fd, 0, SEEK_SET) != 0) abort();
    if ((na && write(fd, a, na) != (ssize_t)na) || (nb && write(fd, b, nb) != (ssize_t)nb)) abort();
    zr_safetensors *f = zr_safetensors_open(path);
    if (!f) {
        FUZZ_ASSERT(zr_last_error_message()[0]);
        zr_clear_error();
        return;
    }
    int64_t n = zr_safetensors_count(f), total = 0;
    for (int64_t i = 0; i < n; i++) {
        const zr_safetensors_entry *e = zr_safetensors_entry_at(f, i);
        FUZZ_ASSERT(e && zr_safetensors_find(f, e->name) == e);
        FUZZ_ASSERT(e->begin >= 0 && e->end <= zr_safetensors_data_bytes(f));
        total += e->end - e->begin;
        static const int want[] = {-1, ZR_F32, ZR_BF16};
        for (int k = 0; k < 3; k++) {
            zr_tensor *t = zr_safetensors_get_entry(f, e, want[k], zr_cpu());
            FUZZ_ASSERT(t && zr_tensor_numel(t) == e->numel);
            zr_tensor_release(t);
        }
    }
    FUZZ_ASSERT(total == zr_safetensors_data_bytes(f)); /* the tensors tile the data section */
    for (int64_t i = 0; i < zr_safetensors_metadata_count(f); i++) {
        const char *k = zr_safetensors_metadata_key(f, i);
        FUZZ_ASSERT(zr_safetensors_metadata_get(f, k) == zr_safetensors_metadata_value(f, i));
    }
    FUZZ_ASSERT(zr_safetensors_get(f, "\x01no such tensor", -1, zr_cpu()) == NULL);
    zr_clear_error();
    zr_safetensors_close(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (fd < 0) {
        fd = memfd_create("fuzz.safetensors", 0);
        if (fd < 0) abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    try_file(data, size, NULL, 0);
    const uint8_t *nul = memchr(data, 0, size);
    size_t hl = nul ? (size_t)(nul - data) : size;
    uint8_t pre[8];
    for (int i = 0; i < 8; i++)
        pre[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    uint8_t *buf = malloc(8 + size);
    if (!buf) abort();
    memcpy(buf, pre, 8);
    memcpy(buf + 8, data, hl);
    if (nul) memcpy(buf + 8 + hl, nul + 1, size - hl - 1);
    try_file(buf, 8 + hl + (nul ? size - hl - 1 : 0), NULL, 0);
    free(buf);
    return 0;
}
