/* C tests for runtime/core/alloc.c's host blocks of 32 MiB or more: a freed one is handed to the next
 * request of its size (rounded to 2 MiB), zeroed where asked, never to a request of another size or
 * while still in use, and the accounting counts only live storages; at most 1 GiB is kept. */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "core/alloc.h"

#define MiB ((size_t)1 << 20)

static int64_t live_bytes(void) {
    zr_mem_stats s;
    zr_mem_get_stats(zr_cpu(), &s);
    return s.total_current;
}

TEST(big_block_reused_for_its_size) {
    int64_t base = live_bytes();
    zr_storage *a = zr_storage_new(zr_cpu(), 40 * MiB, ZR_MEM_ACTIVATIONS, 0);
    CHECK(a != NULL);
    if (!a) return;
    void *pa = a->data;
    memset(pa, 7, 40 * MiB);
    zr_storage_release(a);
    CHECK(live_bytes() == base); /* a kept block is not a tensor's bytes */
    /* a request of the same rounded size (40 MiB - 100 B rounds to 40 MiB): a's block, zeroed as asked */
    zr_storage *b = zr_storage_new(zr_cpu(), 40 * MiB - 100, ZR_MEM_ACTIVATIONS, 1);
    CHECK(b != NULL);
    if (!b) return;
    CHECK(b->data == pa);
    CHECK(b->nbytes == 40 * MiB - 100);
    const unsigned char *bb = b->data;
    size_t nonzero = 0;
    for (size_t i = 0; i < 40 * MiB - 100; i++) nonzero += bb[i] != 0;
    CHECK_MSG(nonzero == 0, "%zu nonzero bytes in a zeroed storage", nonzero);
    /* another size, and the same size while b is in use: not b's block */
    zr_storage *c = zr_storage_new(zr_cpu(), 44 * MiB, ZR_MEM_ACTIVATIONS, 0);
    zr_storage *d = zr_storage_new(zr_cpu(), 40 * MiB, ZR_MEM_ACTIVATIONS, 0);
    CHECK(c && c->data != pa);
    CHECK(d && d->data != pa);
    CHECK(live_bytes() == base + (int64_t)(84 * MiB - 100 + 40 * MiB));
    zr_storage_release(b);
    zr_storage_release(c);
    zr_storage_release(d);
    CHECK(live_bytes() == base);
}

TEST(at_most_a_gib_kept) {
    /* three 400 MiB blocks (never touched: no memory committed) freed: two fit the 1 GiB kept, the third
     * is given back; asked for again, the two kept ones are handed out */
    zr_mem_host_trim();
    CHECK(zr_mem_host_kept() == 0);
    zr_storage *s[3];
    for (int i = 0; i < 3; i++) {
        s[i] = zr_storage_new(zr_cpu(), 400 * MiB, ZR_MEM_WORKSPACE, 0);
        CHECK(s[i] != NULL);
        if (!s[i]) return;
    }
    for (int i = 0; i < 3; i++) zr_storage_release(s[i]);
    CHECK_MSG(zr_mem_host_kept() == 800 * MiB, "%zu MiB kept", zr_mem_host_kept() / MiB);
    s[0] = zr_storage_new(zr_cpu(), 400 * MiB - 1, ZR_MEM_WORKSPACE, 0);
    CHECK(zr_mem_host_kept() == 400 * MiB);
    s[1] = zr_storage_new(zr_cpu(), 300 * MiB, ZR_MEM_WORKSPACE, 0); /* another size: a fresh block */
    CHECK(zr_mem_host_kept() == 400 * MiB);
    zr_mem_host_trim();
    CHECK(zr_mem_host_kept() == 0);
    zr_storage_release(s[0]);
    zr_storage_release(s[1]);
    CHECK(zr_mem_host_kept() == 700 * MiB);
    zr_mem_host_trim();
}

TEST(small_blocks_untouched) { /* below 32 MiB: glibc's heap, the storage's exact size */
    zr_storage *a = zr_storage_new(zr_cpu(), 1000, ZR_MEM_OTHER, 1);
    CHECK(a && a->nbytes == 1000 && ((const unsigned char *)a->data)[999] == 0);
    zr_storage_release(a);
}

int main(void) {
    RUN(big_block_reused_for_its_size);
    RUN(at_most_a_gib_kept);
    RUN(small_blocks_untouched);
    return test_summary();
}
