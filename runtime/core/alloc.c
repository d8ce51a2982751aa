/* Storage and memory accounting (see alloc.h). Accounting is updated under a mutex so OpenMP
 * threads or a comm thread may allocate; the hot path is one lock per allocation. */
#include "core/alloc.h"

#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *cat_names[ZR_MEM_NCATEGORIES] = {"params", "grads", "optimizer", "activations",
                                                    "comm",   "workspace", "other"};
static zr_mem_stats stats[ZR_MAX_DEVICES];
static pthread_mutex_t stats_lock = PTHREAD_MUTEX_INITIALIZER;
static const zr_alloc_backend *backends[2];
static _Thread_local int default_cat = ZR_MEM_OTHER;

const char *zr_mem_category_name(zr_mem_category c) {
    return (unsigned)c < ZR_MEM_NCATEGORIES ? cat_names[c] : "?";
}
int zr_mem_category_parse(const char *s) {
    for (int i = 0; i < ZR_MEM_NCATEGORIES; i++)
        if (strcmp(s, cat_names[i]) == 0) return i;
    if (strcmp(s, "activation") == 0) return ZR_MEM_ACTIVATIONS;
    if (strcmp(s, "param") == 0 || strcmp(s, "parameters") == 0) return ZR_MEM_PARAMS;
    return -1;
}

zr_mem_category zr_mem_set_default_category(zr_mem_category c) {
    int old = default_cat;
    default_cat = c;
    return (zr_mem_category)old;
}
zr_mem_category zr_mem_default_category(void) { return (zr_mem_category)default_cat; }

void zr_alloc_set_backend(zr_device_type t, const zr_alloc_backend *b) { backends[t] = b; }

static void account(zr_device dev, zr_mem_category cat, int64_t delta) {
    zr_mem_stats *s = &stats[zr_device_slot(dev)];
    pthread_mutex_lock(&stats_lock);
    s->current[cat] += delta;
    s->total_current += delta;
    if (s->current[cat] > s->peak[cat]) s->peak[cat] = s->current[cat];
    if (s->current[cat] > s->window_peak[cat]) s->window_peak[cat] = s->current[cat];
    if (s->total_current > s->total_peak) {
        s->total_peak = s->total_current;
        memcpy(s->at_peak, s->current, sizeof s->at_peak);
    }
    if (delta > 0) s->n_allocs++;
    else s->n_frees++;
    pthread_mutex_unlock(&stats_lock);
}

static void human(double b, char *buf, size_t len) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) b /= 1024, i++;
    snprintf(buf, len, i ? "%.2f %s" : "%.0f %s", b, u[i]);
}

void zr_mem_describe(zr_device dev, char *buf, size_t len) {
    zr_mem_stats s;
    zr_mem_get_stats(dev, &s);
    size_t off = 0;
    for (int c = 0; c < ZR_MEM_NCATEGORIES && off < len; c++) {
        char h[32];
        human((double)s.current[c], h, sizeof h);
        off += (size_t)snprintf(buf + off, len - off, "%s%s %s", c ? ", " : "", cat_names[c], h);
    }
    if (off < len) {
        char h[32];
        human((double)s.total_current, h, sizeof h);
        snprintf(buf + off, len - off, " (total %s)", h);
    }
}

/* Training frees and reallocates large tensors every step (gradients set to None, backward
 * temporaries). By default glibc returns that memory to the OS and faults it in again on the next
 * step (about 7 us a page on a VM: 40 ms a step for a 5M-parameter MLP); keep it in the heap. */
static pthread_once_t malloc_once = PTHREAD_ONCE_INIT;
static void malloc_tune(void) {
    mallopt(M_MMAP_THRESHOLD, 32 << 20); /* glibc's maximum; larger blocks are still mmapped */
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

/* Host blocks of 32 MiB or more are past glibc's mmap threshold: a fresh mapping at every malloc,
 * unmapped at free, so a training step's logits, LM-head gradient and the like are faulted in a
 * 4 KiB page at a time at every step, the kernel zeroing each (40K faults a step for a 44M Llama
 * on the CPU, 8% of its step on a VM). Freed ones are kept (zr_mem_host_kept), their size rounded
 * to 2 MiB, for the next request of that rounded size: at most BIG_SLOTS blocks and BIG_KEEP bytes. */
#define BIG_FROM ((size_t)32 << 20)
#define BIG_ROUND ((size_t)2 << 20)
#define BIG_SLOTS 8
#define BIG_KEEP ((size_t)1 << 30)
static struct {
    void *p;
    size_t n;
} big[BIG_SLOTS];
static size_t big_kept;
static pthread_mutex_t big_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t big_size(size_t n) { return (n + BIG_ROUND - 1) & ~(BIG_ROUND - 1); }

static void *big_take(size_t n) {
    void *p = NULL;
    pthread_mutex_lock(&big_lock);
    for (int i = 0; i < BIG_SLOTS && !p; i++)
        if (big[i].p && big[i].n == n) {
            p = big[i].p;
            big[i].p = NULL;
            big_kept -= n;
        }
    pthread_mutex_unlock(&big_lock);
    return p;
}

static void big_give(void *p, size_t n) {
    pthread_mutex_lock(&big_lock);
    for (int i = 0; i < BIG_SLOTS && p; i++)
        if (!big[i].p && big_kept + n <= BIG_KEEP) {
            big[i].p = p, big[i].n = n;
            big_kept += n;
            p = NULL;
        }
    pthread_mutex_unlock(&big_lock);
    free(p);
}

size_t zr_mem_host_kept(void) {
    pthread_mutex_lock(&big_lock);
    size_t n = big_kept;
    pthread_mutex_unlock(&big_lock);
    return n;
}

void zr_mem_host_trim(void) {
    pthread_mutex_lock(&big_lock);
    for (int i = 0; i < BIG_SLOTS; i++) {
        free(big[i].p);
        big[i].p = NULL;
    }
    big_kept = 0;
    pthread_mutex_unlock(&big_lock);
}

static int (*collector)(void *, zr_device, int);
static void *collector_ctx;
static pthread_t collector_thread;
static _Thread_local int in_collector;
static int64_t collections[2];                    /* host, device */
static int64_t collect_floor = ZR_MEM_COLLECT_FLOOR;
static int64_t host_limit = ZR_MEM_COLLECT_FLOOR; /* the soft limit on the CPU's tensor bytes */

static int64_t cpu_tensor_bytes(void) {
    zr_mem_stats s;
    zr_mem_get_stats(zr_cpu(), &s);
    return s.total_current;
}

void zr_mem_set_collector(int (*fn)(void *ctx, zr_device dev, int failed), void *ctx) {
    collector = fn;
    collector_ctx = ctx;
    collector_thread = pthread_self();
}

void zr_mem_set_collect_floor(int64_t bytes) {
    collect_floor = bytes > 0 ? bytes : ZR_MEM_COLLECT_FLOOR;
    host_limit = cpu_tensor_bytes() + collect_floor;
}

int64_t zr_mem_collect_floor(void) { return collect_floor; }

int zr_mem_collect(zr_device dev, int failed) {
    if (!collector || in_collector || !pthread_equal(pthread_self(), collector_thread)) return -1;
    in_collector = 1;
    const int ran = collector(collector_ctx, dev, failed);
    in_collector = 0;
    if (ran) __atomic_add_fetch(&collections[dev.type != ZR_CPU], 1, __ATOMIC_RELAXED);
    return ran;
}

void zr_mem_collections(int64_t *host, int64_t *device) {
    *host = __atomic_load_n(&collections[0], __ATOMIC_RELAXED);
    *device = __atomic_load_n(&collections[1], __ATOMIC_RELAXED);
}

/* Before n more host bytes: the collector asked when they would pass the soft limit, which then
 * moves to the bytes left (n included) plus a quarter, at least the floor, whether it collected or
 * declined. One unlocked read on the way (the limit is only a trigger). */
static void host_pressure(size_t n) {
    if (!collector || in_collector) return;
    const int64_t *cur = &stats[zr_device_slot(zr_cpu())].total_current;
    if (__atomic_load_n(cur, __ATOMIC_RELAXED) + (int64_t)n <= host_limit) return;
    zr_mem_host_trim();
    if (zr_mem_collect(zr_cpu(), 0) < 0) return;
    const int64_t left = cpu_tensor_bytes() + (int64_t)n;
    host_limit = left + (left / 4 > collect_floor ? left / 4 : collect_floor);
}

zr_storage *zr_storage_new(zr_device dev, size_t nbytes, zr_mem_category cat, int zero) {
    zr_storage *s = calloc(1, sizeof *s);
    if (!s) return zr_error_null("out of host memory allocating a storage header");
    size_t n = nbytes ? nbytes : 1;
    void *p = NULL;
    if (dev.type == ZR_CPU) {
        pthread_once(&malloc_once, malloc_tune);
        host_pressure(n);
        if (n >= BIG_FROM) {
            n = big_size(n);
            p = big_take(n);
        }
        if (!p && !(p = aligned_alloc(64, (n + 63) & ~(size_t)63))) {
            zr_mem_host_trim(); /* (what was kept, tried once more) */
            p = aligned_alloc(64, (n + 63) & ~(size_t)63);
        }
        if (!p) {
            char d[512], h[32];
            zr_mem_describe(dev, d, sizeof d);
            snprintf(h, sizeof h, "%.2f MiB", (double)n / (1 << 20));
            free(s);
            return zr_error_null("out of host memory allocating %s for %s; in use: %s", h,
                                 cat_names[cat], d);
        }
        if (zero) memset(p, 0, n);
    } else {
        const zr_alloc_backend *b = backends[dev.type];
        if (!b) {
            free(s);
            return zr_error_null("this zrun was built without CUDA support; rebuild with nvcc "
                                 "available (see `zrun report`) or use device 'cpu'");
        }
        p = b->alloc(dev, n);
        if (!p) {
            free(s);
            return NULL; /* backend set the message */
        }
        if (zero) b->zero(dev, p, n);
    }
    s->refcount = 1;
    s->data = p;
    s->nbytes = nbytes;
    s->device = dev;
    s->category = cat;
    account(dev, cat, (int64_t)nbytes);
    return s;
}

zr_storage *zr_storage_wrap(zr_device dev, void *data, size_t nbytes) {
    zr_storage *s = calloc(1, sizeof *s);
    if (!s) return zr_error_null("out of host memory");
    s->refcount = 1;
    s->data = data;
    s->nbytes = nbytes;
    s->device = dev;
    s->category = ZR_MEM_OTHER;
    s->external = 1;
    return s;
}

void zr_storage_retain(zr_storage *s) {
    if (s) __atomic_add_fetch(&s->refcount, 1, __ATOMIC_RELAXED);
}

void zr_storage_release(zr_storage *s) {
    if (!s || __atomic_sub_fetch(&s->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
    if (!s->external) {
        account(s->device, s->category, -(int64_t)s->nbytes);
        size_t n = s->nbytes ? s->nbytes : 1;
        if (s->device.type != ZR_CPU) backends[s->device.type]->free(s->device, s->data, n);
        else if (n >= BIG_FROM) big_give(s->data, big_size(n));
        else free(s->data);
    }
    free(s);
}

void zr_storage_set_category(zr_storage *s, zr_mem_category cat) {
    if (s->external || s->category == cat) return;
    zr_mem_stats *st = &stats[zr_device_slot(s->device)];
    pthread_mutex_lock(&stats_lock);
    st->current[s->category] -= (int64_t)s->nbytes;
    st->current[cat] += (int64_t)s->nbytes;
    if (st->current[cat] > st->peak[cat]) st->peak[cat] = st->current[cat];
    if (st->current[cat] > st->window_peak[cat]) st->window_peak[cat] = st->current[cat];
    pthread_mutex_unlock(&stats_lock);
    s->category = cat;
}

void zr_mem_get_stats(zr_device dev, zr_mem_stats *out) {
    pthread_mutex_lock(&stats_lock);
    *out = stats[zr_device_slot(dev)];
    pthread_mutex_unlock(&stats_lock);
}

void zr_mem_reset_peak(zr_device dev) {
    zr_mem_stats *s = &stats[zr_device_slot(dev)];
    pthread_mutex_lock(&stats_lock);
    for (int c = 0; c < ZR_MEM_NCATEGORIES; c++) s->peak[c] = s->at_peak[c] = s->current[c];
    s->total_peak = s->total_current;
    pthread_mutex_unlock(&stats_lock);
}

void zr_mem_window_reset(zr_device dev) {
    zr_mem_stats *s = &stats[zr_device_slot(dev)];
    pthread_mutex_lock(&stats_lock);
    for (int c = 0; c < ZR_MEM_NCATEGORIES; c++) s->window_peak[c] = s->current[c];
    pthread_mutex_unlock(&stats_lock);
}
