/* The block pool (block_pool.h): segments from the device, split into blocks handed out best fit,
 * merged when freed. Each block knows its neighbours in its segment (by address); a segment is one
 * block with no neighbour when wholly free. The free blocks sit in one array sorted by (small,
 * stream, size, address), so the best fit is a binary search; the blocks handed out in another,
 * sorted by address, for the lookup at free. The free array's capacity is kept at the number of
 * blocks, so freeing (which may only merge) never needs host memory. */
#include "block_pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((size_t)1 << 20)
#define SMALL_LIMIT MIB /* requests up to this are "small", from SMALL_SEGMENT segments */
#define SMALL_SEGMENT (2 * MIB)
#define MEDIUM_LIMIT (10 * MIB) /* larger requests up to this share LARGE_SEGMENT segments */
#define LARGE_SEGMENT (20 * MIB)
#define LARGE_STEP (2 * MIB) /* the exact size a large segment falls back to */
#define LARGE_SPLIT_MIN MIB  /* a large block is split only when more than this would be left */

struct zr_pool_block {
    char *ptr;
    size_t size;
    uintptr_t stream;
    zr_pool_block *prev, *next; /* neighbours in the segment, by address */
    int small, allocated;
};

static size_t round_up(size_t n, size_t step) {
    return (n + step - 1) / step * step;
}
static size_t request_size(size_t nbytes) {
    return round_up(nbytes ? nbytes : 1, ZR_POOL_ALIGN);
}

size_t zr_pool_segment_size(size_t nbytes) {
    const size_t n = request_size(nbytes);
    if (n <= SMALL_LIMIT) return SMALL_SEGMENT;
    if (n <= MEDIUM_LIMIT) return LARGE_SEGMENT;
    size_t pow2 = 1;
    while (pow2 <= n / 2)
        pow2 *= 2; /* the largest power of two not above n */
    return round_up(n, pow2 / 4 > LARGE_STEP ? pow2 / 4 : LARGE_STEP);
}

/* (small, stream, size, address) order of the free set */
static int free_less(const zr_pool_block *a, int small, uintptr_t stream, size_t size,
                     const char *ptr) {
    if (a->small != small) return a->small < small;
    if (a->stream != stream) return a->stream < stream;
    if (a->size != size) return a->size < size;
    return a->ptr < ptr;
}
static int free_lower_bound(const zr_block_pool *p, int small, uintptr_t stream, size_t size,
                            const char *ptr) {
    int lo = 0, hi = p->n_free;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (free_less(p->free_set[mid], small, stream, size, ptr))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}
static int used_lower_bound(const zr_block_pool *p, const char *ptr) {
    int lo = 0, hi = p->n_used;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (p->used[mid]->ptr < ptr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void insert_at(zr_pool_block **v, int *n, int i, zr_pool_block *b) {
    memmove(v + i + 1, v + i, (size_t)(*n - i) * sizeof *v);
    v[i] = b;
    (*n)++;
}
static void remove_at(zr_pool_block **v, int *n, int i) {
    memmove(v + i, v + i + 1, (size_t)(*n - i - 1) * sizeof *v);
    (*n)--;
}
static void free_insert(zr_block_pool *p, zr_pool_block *b) {
    insert_at(p->free_set, &p->n_free, free_lower_bound(p, b->small, b->stream, b->size, b->ptr),
              b);
}
static void free_remove(zr_block_pool *p, zr_pool_block *b) {
    remove_at(p->free_set, &p->n_free, free_lower_bound(p, b->small, b->stream, b->size, b->ptr));
}

/* Grows an array of block pointers to hold at least need; 0, or -1 out of host memory. */
static int reserve(zr_pool_block ***v, int *cap, int need) {
    if (need <= *cap) return 0;
    int nc = *cap ? *cap : 64;
    while (nc < need)
        nc *= 2;
    zr_pool_block **nv = realloc(*v, (size_t)nc * sizeof *nv);
    if (!nv) return -1;
    *v = nv;
    *cap = nc;
    return 0;
}

void zr_pool_init(zr_block_pool *p, zr_pool_source src) {
    memset(p, 0, sizeof *p);
    p->src = src;
}

/* Block structs come from a short list of spares (refilled from malloc), so the hot path rarely
 * calls malloc; merged-away blocks go back to it. */
#define MAX_SPARES 64
static int top_up_spares(zr_block_pool *p, int need) {
    while (p->n_spares < need) {
        zr_pool_block *b = malloc(sizeof *b);
        if (!b) return -1;
        b->next = p->spares;
        p->spares = b;
        p->n_spares++;
    }
    return 0;
}
static zr_pool_block *take_spare(zr_block_pool *p) {
    zr_pool_block *b = p->spares;
    p->spares = b->next;
    p->n_spares--;
    return b;
}
static void put_spare(zr_block_pool *p, zr_pool_block *b) {
    if (p->n_spares >= MAX_SPARES) {
        free(b);
        return;
    }
    b->next = p->spares;
    p->spares = b;
    p->n_spares++;
}

static void track_peaks(zr_block_pool *p) {
    if (p->st.allocated > p->st.peak_allocated) p->st.peak_allocated = p->st.allocated;
    if (p->st.reserved > p->st.peak_reserved) p->st.peak_reserved = p->st.reserved;
}

int zr_pool_alloc(zr_block_pool *p, size_t nbytes, uintptr_t stream, void **out, size_t *size_out) {
    const size_t n = request_size(nbytes);
    const int small = n <= SMALL_LIMIT;
    *out = NULL;
    p->st.n_alloc++;
    /* Host memory first, so nothing below can fail half-way: room in both arrays for two more
     * blocks (the free set holds up to every block), and the structs of a new segment and a split.
     */
    if (top_up_spares(p, 2) || reserve(&p->free_set, &p->cap_free, p->n_free + p->n_used + 2) ||
        reserve(&p->used, &p->cap_used, p->n_used + 1))
        return ZR_POOL_NO_HOST_MEMORY;
    zr_pool_block *b = NULL;
    const int i = free_lower_bound(p, small, stream, n, NULL);
    if (i < p->n_free && p->free_set[i]->small == small && p->free_set[i]->stream == stream) {
        b = p->free_set[i]; /* the smallest free block that fits */
        remove_at(p->free_set, &p->n_free, i);
        p->st.n_cache_hits++;
    } else {
        size_t seg = zr_pool_segment_size(n);
        char *ptr = p->src.take(p->src.ctx, seg);
        const size_t exact = small ? SMALL_SEGMENT : round_up(n, LARGE_STEP);
        if (!ptr && exact < seg) ptr = p->src.take(p->src.ctx, seg = exact);
        if (!ptr) return ZR_POOL_NO_DEVICE_MEMORY;
        b = take_spare(p);
        *b = (zr_pool_block){ptr, seg, stream, NULL, NULL, small, 0};
        p->st.n_take++;
        p->st.n_segments++;
        p->st.reserved += (int64_t)seg;
    }
    const size_t rest = b->size - n;
    if (small ? rest >= ZR_POOL_ALIGN : rest > LARGE_SPLIT_MIN) {
        zr_pool_block *r = take_spare(p);
        *r = (zr_pool_block){b->ptr + n, rest, stream, b, b->next, small, 0};
        if (b->next) b->next->prev = r;
        b->next = r;
        b->size = n;
        free_insert(p, r);
    }
    b->allocated = 1;
    insert_at(p->used, &p->n_used, used_lower_bound(p, b->ptr), b);
    p->st.allocated += (int64_t)b->size;
    track_peaks(p);
    *out = b->ptr;
    if (size_out) *size_out = b->size;
    return ZR_POOL_OK;
}

size_t zr_pool_free(zr_block_pool *p, void *ptr) {
    const int i = used_lower_bound(p, ptr);
    if (i >= p->n_used || p->used[i]->ptr != (char *)ptr) return 0;
    zr_pool_block *b = p->used[i];
    const size_t size = b->size;
    remove_at(p->used, &p->n_used, i);
    p->st.allocated -= (int64_t)size;
    b->allocated = 0;
    zr_pool_block *prev = b->prev, *next = b->next;
    if (prev && !prev->allocated) { /* b joins its free left neighbour */
        free_remove(p, prev);
        prev->size += b->size;
        prev->next = next;
        if (next) next->prev = prev;
        put_spare(p, b);
        b = prev;
    }
    if (next && !next->allocated) { /* and takes in its free right one */
        free_remove(p, next);
        b->size += next->size;
        b->next = next->next;
        if (next->next) next->next->prev = b;
        put_spare(p, next);
    }
    free_insert(p, b);
    return size;
}

size_t zr_pool_release(zr_block_pool *p) {
    size_t given = 0;
    int k = 0;
    for (int i = 0; i < p->n_free; i++) {
        zr_pool_block *b = p->free_set[i];
        if (b->prev || b->next) {
            p->free_set[k++] = b;
            continue;
        }
        p->src.give_back(p->src.ctx, b->ptr);
        given += b->size;
        p->st.reserved -= (int64_t)b->size;
        p->st.n_segments--;
        p->st.n_give_back++;
        put_spare(p, b);
    }
    p->n_free = k;
    return given;
}

void zr_pool_destroy(zr_block_pool *p) {
    zr_pool_block **sets[2] = {p->free_set, p->used};
    const int counts[2] = {p->n_free, p->n_used};
    for (int s = 0; s < 2; s++) /* each segment once, from its first block */
        for (int i = 0; i < counts[s]; i++)
            if (!sets[s][i]->prev) {
                p->src.give_back(p->src.ctx, sets[s][i]->ptr);
                p->st.n_give_back++;
            }
    for (int s = 0; s < 2; s++) /* every block is in one of the two sets */
        for (int i = 0; i < counts[s]; i++)
            free(sets[s][i]);
    while (p->spares)
        free(take_spare(p));
    free(p->free_set);
    free(p->used);
    const zr_pool_stats st = p->st;
    zr_pool_init(p, p->src);
    p->st.n_take = st.n_take;
    p->st.n_give_back = st.n_give_back;
    p->st.n_alloc = st.n_alloc;
    p->st.n_cache_hits = st.n_cache_hits;
}

#define BAD(...) return snprintf(why, len, __VA_ARGS__), -1

int zr_pool_check(const zr_block_pool *p, char *why, size_t len) {
    for (int i = 0; i < p->n_free; i++) {
        const zr_pool_block *b = p->free_set[i];
        if (b->allocated) BAD("free set entry %d is handed out", i);
        if (i && !free_less(p->free_set[i - 1], b->small, b->stream, b->size, b->ptr))
            BAD("free set out of order at %d", i);
    }
    for (int i = 0; i < p->n_used; i++) {
        if (!p->used[i]->allocated) BAD("used entry %d is free", i);
        if (i && p->used[i - 1]->ptr >= p->used[i]->ptr) BAD("used set out of order at %d", i);
    }
    if (p->cap_free < p->n_free + p->n_used && p->n_free + p->n_used > 0)
        BAD("free set capacity %d below the %d blocks", p->cap_free, p->n_free + p->n_used);
    int64_t reserved = 0, allocated = 0, segments = 0, blocks = 0, nfree = 0;
    const zr_pool_block *const *sets[2] = {(const zr_pool_block *const *)p->free_set,
                                           (const zr_pool_block *const *)p->used};
    const int counts[2] = {p->n_free, p->n_used};
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < counts[s]; i++) {
            const zr_pool_block *b = sets[s][i];
            if (b->prev) continue;
            segments++;
            for (; b; b = b->next) {
                blocks++;
                reserved += (int64_t)b->size;
                if (b->allocated)
                    allocated += (int64_t)b->size;
                else
                    nfree++;
                if (b->size == 0 || b->size % ZR_POOL_ALIGN) BAD("block of %zu bytes", b->size);
                if (b->next) {
                    if (b->next->prev != b) BAD("broken neighbour links");
                    if (b->ptr + b->size != b->next->ptr) BAD("blocks do not tile their segment");
                    if (b->next->stream != b->stream || b->next->small != b->small)
                        BAD("mixed segment");
                    if (!b->allocated && !b->next->allocated) BAD("two free neighbours not merged");
                }
            }
        }
    if (blocks != p->n_free + p->n_used || nfree != p->n_free)
        BAD("%lld blocks in segments (%lld free), sets hold %d + %d", (long long)blocks,
            (long long)nfree, p->n_free, p->n_used);
    if (reserved != p->st.reserved)
        BAD("segments hold %lld, reserved says %lld", (long long)reserved,
            (long long)p->st.reserved);
    if (allocated != p->st.allocated)
        BAD("blocks out hold %lld, allocated says %lld", (long long)allocated,
            (long long)p->st.allocated);
    if (segments != p->st.n_segments)
        BAD("%lld segments, n_segments says %lld", (long long)segments,
            (long long)p->st.n_segments);
    return 0;
}
