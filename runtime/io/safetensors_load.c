/* zr_safetensors_load_into (see safetensors_load.h): the items are cut into 4 MB chunks of file
 * bytes that a team of OpenMP threads takes in file order, so the reads stay sequential per file
 * and several shards are read at once. Each chunk is read with pread (no page faults on a mapping)
 * straight into its destination, or through a buffer when it must be converted or uploaded. */
#include "io/safetensors_load.h"
#include "io/staging.h"

#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#include "kernels/cuda/copy.h"
#endif

#define CHUNK_BYTES ((int64_t)4 << 20) /* a multiple of every element size */
#define MAX_THREADS 64

typedef struct {
    int64_t item, off, len; /* bytes [off, off + len) of the item's tensor data */
} chunk;

/* The work one call shares between its threads. */
typedef struct {
    const zr_safetensors_load_item *items;
    const int *fds; /* per item: the descriptor of its file */
    chunk *chunks;
    int64_t nchunks;
    int64_t next; /* next chunk to take (atomic) */
    int failed;   /* set once by the first thread that fails (atomic) */
    char msg[2048];
} job;

/* Keeps the first failure's message (zrun errors are per thread) and stops the other threads. */
static void job_fail(job *j) {
    if (__atomic_exchange_n(&j->failed, 1, __ATOMIC_ACQ_REL) == 0)
        snprintf(j->msg, sizeof j->msg, "%s", zr_last_error_message());
}
/* The next chunk to do, or NULL when all are taken or a thread failed. */
static const chunk *job_take(job *j) {
    if (__atomic_load_n(&j->failed, __ATOMIC_ACQUIRE)) return NULL;
    int64_t k = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
    return k < j->nchunks ? &j->chunks[k] : NULL;
}

/* Reads the chunk's bytes into buf. A file that shrank since it was opened is an error here (the
 * header check at open time catches files that were truncated before). */
static zr_status read_chunk(const job *j, const chunk *c, void *buf) {
    const zr_safetensors_load_item *it = &j->items[c->item];
    int64_t pos = zr_safetensors_data_offset(it->file) + it->entry->begin + c->off, len = c->len;
    char *p = buf;
    while (len > 0) {
        ssize_t r = pread(j->fds[c->item], p, len > (1 << 30) ? (1 << 30) : (size_t)len, (off_t)pos);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return zr_error("%s: tensor '%s': read failed: %s", zr_safetensors_path(it->file), it->entry->name,
                            strerror(errno));
        if (r == 0)
            return zr_error("%s: tensor '%s': the file ends at byte %lld, inside the tensor's data (it was "
                            "truncated while being read); write it again",
                            zr_safetensors_path(it->file), it->entry->name, (long long)pos);
        p += r;
        pos += r;
        len -= r;
    }
    return ZR_OK;
}

/* Where the chunk's first element goes in the destination. */
static char *chunk_dst(const job *j, const chunk *c) {
    const zr_safetensors_load_item *it = &j->items[c->item];
    int64_t first = c->off / (int64_t)zr_dtype_size(it->entry->dtype);
    return (char *)zr_tensor_data(it->dst) + first * (int64_t)zr_dtype_size(it->dst->dtype);
}

static void cpu_worker(job *j) {
    void *stage = NULL; /* for chunks that are converted */
    const chunk *c;
    while ((c = job_take(j))) {
        const zr_safetensors_load_item *it = &j->items[c->item];
        zr_dtype st = it->entry->dtype, dt = it->dst->dtype;
        if (st == dt) {
            if (read_chunk(j, c, chunk_dst(j, c))) break;
            continue;
        }
        if (!stage && !(stage = malloc((size_t)CHUNK_BYTES))) {
            zr_error("loading safetensors: out of host memory for a %lld-byte buffer", (long long)CHUNK_BYTES);
            break;
        }
        if (read_chunk(j, c, stage)) break;
        zr_cast_contiguous(chunk_dst(j, c), dt, stage, st, c->len / (int64_t)zr_dtype_size(st));
    }
    if (c) job_fail(j);
    free(stage);
}

#ifdef ZR_HAVE_CUDA
/* One thread's CUDA resources: its stream, and two slots (pinned chunk, device chunk for
 * conversions, the event that says the slot's copies are done) so a read overlaps the previous
 * chunk's upload. */
typedef struct {
    cudaStream_t s;
    cudaEvent_t ev[2];
    int used[2];
    char *pin[2];
    void *dstage[2];
} lane;

static zr_staging load_pool = ZR_STAGING_INIT; /* 2 chunks per thread, pinned */

static void cuda_worker(job *j, lane *L, int dev) {
    if (zr_cuda_use(dev)) {
        job_fail(j);
        return;
    }
    int slot = 0;
    const chunk *c;
    while ((c = job_take(j))) {
        const zr_safetensors_load_item *it = &j->items[c->item];
        zr_dtype st = it->entry->dtype, dt = it->dst->dtype;
        if (L->used[slot] && ZR_CUDA_CHECK(cudaEventSynchronize(L->ev[slot]), "loading safetensors")) break;
        if (read_chunk(j, c, L->pin[slot])) break;
        void *to = st == dt ? (void *)chunk_dst(j, c) : L->dstage[slot];
        if (ZR_CUDA_CHECK(cudaMemcpyAsync(to, L->pin[slot], (size_t)c->len, cudaMemcpyHostToDevice, L->s),
                          "loading safetensors"))
            break;
        if (st != dt) { /* convert on the device: the same rounding as the CPU (kernels/cuda/copy.h) */
            int64_t ne = c->len / (int64_t)zr_dtype_size(st), one = 1;
            if (copy_strided_cuda(chunk_dst(j, c), dt, &one, L->dstage[slot], st, &one, 1, &ne, L->s)) break;
        }
        if (ZR_CUDA_CHECK(cudaEventRecord(L->ev[slot], L->s), "loading safetensors")) break;
        L->used[slot] = 1;
        slot ^= 1;
    }
    if (!ZR_CUDA_CHECK(cudaStreamSynchronize(L->s), "loading safetensors") && !c) return;
    job_fail(j);
}

static zr_status run_cuda(job *j, int nt, int dev, int convert) {
    lane lanes[MAX_THREADS];
    memset(lanes, 0, sizeof lanes);
    zr_device d = {ZR_CUDA, dev};
    cudaStream_t compute = zr_cuda_stream(d);
    /* The destinations come from the caching allocator in compute-stream order: let that settle. */
    ZR_CHECK(ZR_CUDA_CHECK(cudaStreamSynchronize(compute), "loading safetensors"));
    zr_staging_buf sb;
    ZR_CHECK(zr_staging_take(&load_pool, (size_t)nt * 2 * (size_t)CHUNK_BYTES, &sb));
    char *pin = sb.p;
    zr_status st = ZR_OK;
    char *dstage = NULL;
    if (!st && convert) {
        dstage = zr_cuda_malloc(d, (size_t)nt * 2 * (size_t)CHUNK_BYTES, compute);
        if (!dstage) st = ZR_ERR;
    }
    int made = 0;
    for (; !st && made < nt; made++) {
        lane *L = &lanes[made];
        st = ZR_CUDA_CHECK(cudaStreamCreateWithFlags(&L->s, cudaStreamNonBlocking), "loading safetensors");
        for (int k = 0; !st && k < 2; k++) {
            st = ZR_CUDA_CHECK(cudaEventCreateWithFlags(&L->ev[k], cudaEventDisableTiming), "loading safetensors");
            L->pin[k] = pin + ((size_t)made * 2 + k) * (size_t)CHUNK_BYTES;
            if (dstage) L->dstage[k] = dstage + ((size_t)made * 2 + k) * (size_t)CHUNK_BYTES;
        }
    }
    if (!st) {
#pragma omp parallel num_threads(nt)
        cuda_worker(j, &lanes[omp_get_thread_num()], dev);
    }
    for (int k = 0; k < made; k++) {
        for (int e = 0; e < 2; e++)
            if (lanes[k].ev[e]) cudaEventDestroy(lanes[k].ev[e]);
        if (lanes[k].s) cudaStreamDestroy(lanes[k].s);
    }
    if (dstage) zr_cuda_free(d, dstage); /* every lane was synchronized */
    zr_staging_give(&load_pool, &sb);
    return st;
}
#endif

/* Loads the items whose destinations are all on the CPU (dev < 0) or all on CUDA device dev. */
static zr_status run(const zr_safetensors_load_item *items, const int *fds, int64_t n, int threads, int dev) {
    int64_t nchunks = 0;
    int convert = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t bytes = items[i].entry->end - items[i].entry->begin;
        nchunks += (bytes + CHUNK_BYTES - 1) / CHUNK_BYTES;
        convert |= items[i].entry->dtype != items[i].dst->dtype;
    }
    if (nchunks == 0) return ZR_OK;
    job j = {.items = items, .fds = fds};
    j.chunks = malloc((size_t)nchunks * sizeof *j.chunks);
    if (!j.chunks) return zr_error("loading safetensors: out of host memory");
    for (int64_t i = 0; i < n; i++) {
        int64_t bytes = items[i].entry->end - items[i].entry->begin;
        for (int64_t off = 0; off < bytes; off += CHUNK_BYTES)
            j.chunks[j.nchunks++] = (chunk){i, off, bytes - off < CHUNK_BYTES ? bytes - off : CHUNK_BYTES};
    }
    int nt = threads > 0 ? threads : omp_get_num_procs() < 8 ? omp_get_num_procs() : 8;
    if (nt > MAX_THREADS) nt = MAX_THREADS;
    if (nt > nchunks) nt = (int)nchunks;
    zr_status st = ZR_OK;
    if (dev < 0) {
#pragma omp parallel num_threads(nt)
        cpu_worker(&j);
    } else {
#ifdef ZR_HAVE_CUDA
        st = run_cuda(&j, nt, dev, convert);
#else
        st = zr_error("loading safetensors: cuda:%d needs a CUDA build of zrun", dev);
#endif
    }
    free(j.chunks);
    if (!st && j.failed) st = zr_error("%s", j.msg);
    return st;
}

/* The file-order rank of an item, so chunks are read front to back. */
static int cmp_item(const void *a, const void *b) {
    const zr_safetensors_load_item *x = a, *y = b;
    if (x->file != y->file) return strcmp(zr_safetensors_path(x->file), zr_safetensors_path(y->file));
    return (x->entry->begin > y->entry->begin) - (x->entry->begin < y->entry->begin);
}

zr_status zr_safetensors_load_into(const zr_safetensors_load_item *items, int64_t n, int threads) {
    if (n <= 0) return ZR_OK;
    zr_safetensors_load_item *fast = malloc((size_t)n * sizeof *fast);
    int *fds = malloc((size_t)n * sizeof *fds);
    if (!fast || !fds) {
        free(fast);
        free(fds);
        return zr_error("loading safetensors: out of host memory");
    }
    int64_t nf = 0;
    int dev = -2; /* the CUDA device of the fast items (-1: CPU); -2 until the first is seen */
    zr_status st = ZR_OK;
    for (int64_t i = 0; i < n && !st; i++) {
        const zr_safetensors_load_item *it = &items[i];
        const char *path = zr_safetensors_path(it->file), *name = it->entry->name;
        char b1[128], b2[128];
        if (!it->dst || zr_tensor_numel(it->dst) != it->entry->numel || !zr_tensor_is_contiguous(it->dst)) {
            st = it->dst ? zr_error("%s: tensor '%s' %s cannot be loaded into a %s%s tensor", path, name,
                                    zr_shape_str(it->entry->ndim, it->entry->shape, b1),
                                    zr_tensor_is_contiguous(it->dst) ? "" : "non-contiguous ",
                                    zr_tensor_shape_str(it->dst, b2))
                         : zr_error("%s: tensor '%s': no destination tensor", path, name);
            break;
        }
        if (it->entry->numel == 0) continue;
        if (zr_st_dtype_from_zr(it->entry->dtype) != (int)it->entry->st_dtype) {
            /* BOOL/I8/I16 (no zrun dtype): widened one tensor at a time */
            zr_tensor *t = zr_safetensors_get_entry(it->file, it->entry, it->dst->dtype, zr_cpu());
            st = !t ? ZR_ERR : zr_tensor_copy_(it->dst, t);
            zr_tensor_release(t);
            continue;
        }
        zr_device d = it->dst->storage->device;
        int this_dev = d.type == ZR_CPU ? -1 : d.index;
        if (dev == -2) dev = this_dev;
        if (this_dev != dev) {
            char n1[16], n2[16];
            zr_device prev = dev < 0 ? zr_cpu() : (zr_device){ZR_CUDA, dev};
            st = zr_error("%s: tensor '%s' goes to %s but others go to %s; load each device's tensors in "
                          "their own call",
                          path, name, zr_device_name(d, n1), zr_device_name(prev, n2));
            break;
        }
        fast[nf++] = *it;
    }
    qsort(fast, (size_t)nf, sizeof *fast, cmp_item);
    /* One descriptor per file, opened again by path: pread needs one, the mapping closed its own. */
    for (int64_t i = 0; i < nf && !st; i++) {
        if (i > 0 && fast[i].file == fast[i - 1].file) {
            fds[i] = fds[i - 1];
            continue;
        }
        const char *path = zr_safetensors_path(fast[i].file);
        fds[i] = open(path, O_RDONLY | O_CLOEXEC);
        if (fds[i] < 0) {
            st = zr_error("%s: cannot open: %s", path, strerror(errno));
            nf = i; /* close only what was opened */
            break;
        }
        posix_fadvise(fds[i], 0, 0, POSIX_FADV_SEQUENTIAL);
    }
    if (!st) st = run(fast, fds, nf, threads, dev);
    for (int64_t i = 0; i < nf; i++)
        if (i == 0 || fast[i].file != fast[i - 1].file) close(fds[i]);
    free(fast);
    free(fds);
    return st;
}
