/* The atomic-write protocol and the staged writer (see atomic_file.h). The staged writer's
 * thread only calls write(); the caller's thread fills buffers (memcpy, or a device-to-host copy
 * into page-locked memory) meanwhile. */
#include "io/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/staging.h"

#ifdef ZR_HAVE_CUDA
#include "cuda/device.h"
#endif

zr_status zr_atomic_open(zr_atomic_file *a, const char *path) {
    static int counter;
    a->path = path;
    a->fd = -1;
    size_t n = strlen(path) + 64;
    a->tmp = malloc(n);
    if (!a->tmp) return zr_error("%s: out of host memory", path);
    snprintf(a->tmp, n, "%s.tmp.%d.%d", path, (int)getpid(), __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    a->fd = open(a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (a->fd < 0) {
        zr_error("%s: cannot create the temporary file %s: %s (is the directory there and writable?)", path,
                 a->tmp, strerror(errno));
        free(a->tmp);
        a->tmp = NULL;
        return ZR_ERR;
    }
    return ZR_OK;
}

zr_status zr_atomic_write(zr_atomic_file *a, const void *data, int64_t len) {
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(a->fd, p, len > (1 << 30) ? (1 << 30) : (size_t)len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return zr_error("%s: write failed: %s", a->path, strerror(errno));
        }
        p += w;
        len -= w;
    }
    return ZR_OK;
}

void zr_atomic_abort(zr_atomic_file *a) {
    if (a->fd >= 0) close(a->fd);
    if (a->tmp) unlink(a->tmp);
    free(a->tmp);
    a->tmp = NULL;
    a->fd = -1;
}

zr_status zr_atomic_commit(zr_atomic_file *a) {
    if (fsync(a->fd) != 0) {
        zr_error("%s: fsync failed: %s", a->path, strerror(errno));
        zr_atomic_abort(a);
        return ZR_ERR;
    }
    int rc = close(a->fd);
    a->fd = -1;
    if (rc != 0) {
        zr_error("%s: close failed: %s", a->path, strerror(errno));
        zr_atomic_abort(a);
        return ZR_ERR;
    }
    if (rename(a->tmp, a->path) != 0) {
        zr_error("%s: cannot rename %s into place: %s", a->path, a->tmp, strerror(errno));
        zr_atomic_abort(a);
        return ZR_ERR;
    }
    free(a->tmp);
    a->tmp = NULL;
    /* Make the rename itself durable. Some file systems refuse fsync on a directory: ignore. */
    char *dir = strdup(a->path);
    if (dir) {
        char *slash = strrchr(dir, '/');
        const char *d = slash ? (slash == dir ? "/" : (*slash = 0, dir)) : ".";
        int dfd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
        free(dir);
    }
    return ZR_OK;
}

zr_status zr_file_write_atomic(const char *path, const void *data, int64_t len) {
    zr_atomic_file a;
    ZR_CHECK(zr_atomic_open(&a, path));
    if (zr_atomic_write(&a, data, len)) {
        zr_atomic_abort(&a);
        return ZR_ERR;
    }
    return zr_atomic_commit(&a);
}

/* ================================ staged writer ================================ */

#define STAGE_BYTES ((int64_t)64 << 20)
#define DIRECT_BYTES ((int64_t)8 << 20)

struct zr_staged_writer {
    zr_atomic_file *a;
    char *buf[2];
    int cur;
    int64_t fill; /* bytes in buf[cur] */
    pthread_t th;
    pthread_mutex_t m;
    pthread_cond_t cv;
    const char *job; /* the bytes the thread is writing (NULL: idle) */
    int64_t job_len;
    zr_tensor *job_tensor; /* the host tensor the job writes from, held until it is done */
    int quit, failed;
    char msg[1024];
    zr_staging_buf sb;
};

static zr_staging save_pool = ZR_STAGING_INIT;

static void *writer_main(void *arg) {
    zr_staged_writer *w = arg;
    pthread_mutex_lock(&w->m);
    for (;;) {
        while (!w->job && !w->quit) pthread_cond_wait(&w->cv, &w->m);
        if (!w->job) break;
        const char *p = w->job;
        int64_t n = w->job_len;
        int skip = w->failed;
        pthread_mutex_unlock(&w->m);
        zr_status st = skip ? ZR_ERR : zr_atomic_write(w->a, p, n);
        pthread_mutex_lock(&w->m);
        if (st && !w->failed) {
            w->failed = 1;
            snprintf(w->msg, sizeof w->msg, "%s", zr_last_error_message());
        }
        w->job = NULL;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->m);
    return NULL;
}

/* Waits until the thread is idle; the error of a write it did, if any. */
static zr_status writer_wait(zr_staged_writer *w) {
    pthread_mutex_lock(&w->m);
    while (w->job) pthread_cond_wait(&w->cv, &w->m);
    int failed = w->failed;
    pthread_mutex_unlock(&w->m);
    zr_tensor_release(w->job_tensor); /* on this thread: refcounts are not atomic */
    w->job_tensor = NULL;
    return failed ? zr_error("%s", w->msg) : ZR_OK;
}

/* Hands n bytes at p to the thread once its current job is done (t, if any, is held until then). */
static zr_status writer_submit(zr_staged_writer *w, const char *p, int64_t n, zr_tensor *t) {
    ZR_CHECK(writer_wait(w));
    pthread_mutex_lock(&w->m);
    w->job = p;
    w->job_len = n;
    w->job_tensor = t;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->m);
    return ZR_OK;
}

/* Hands buf[cur] to the thread (after its previous job, at most the other buffer, is written)
 * and switches to the other buffer. */
static zr_status writer_flush(zr_staged_writer *w) {
    if (w->fill == 0) return ZR_OK;
    ZR_CHECK(writer_submit(w, w->buf[w->cur], w->fill, NULL));
    w->cur ^= 1;
    w->fill = 0;
    return ZR_OK;
}

zr_staged_writer *zr_staged_writer_start(zr_atomic_file *a) {
    zr_staged_writer *w = calloc(1, sizeof *w);
    if (!w) return zr_error_null("%s: out of host memory", a->path);
    if (zr_staging_take(&save_pool, 2 * (size_t)STAGE_BYTES, &w->sb)) {
        free(w);
        return NULL;
    }
    w->a = a;
    w->buf[0] = w->sb.p;
    w->buf[1] = w->sb.p + STAGE_BYTES;
    pthread_mutex_init(&w->m, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->th, NULL, writer_main, w) != 0) {
        zr_staging_give(&save_pool, &w->sb);
        free(w);
        return zr_error_null("%s: cannot start the writer thread", a->path);
    }
    return w;
}

zr_status zr_staged_writer_put(zr_staged_writer *w, const void *p, zr_device dev, int64_t n) {
    const char *src = p;
    while (n > 0) {
        int64_t take = STAGE_BYTES - w->fill < n ? STAGE_BYTES - w->fill : n;
        char *dst = w->buf[w->cur] + w->fill;
        if (dev.type == ZR_CPU) memcpy(dst, src, (size_t)take);
        else {
#ifdef ZR_HAVE_CUDA
            cudaStream_t s = zr_cuda_stream(dev);
            ZR_CHECK(ZR_CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)take, cudaMemcpyDeviceToHost, s),
                                   "writing a file"));
            ZR_CHECK(ZR_CUDA_CHECK(cudaStreamSynchronize(s), "writing a file"));
#else
            return zr_error("%s: device memory needs a CUDA build", w->a->path);
#endif
        }
        w->fill += take;
        src += take;
        n -= take;
        if (w->fill == STAGE_BYTES) ZR_CHECK(writer_flush(w));
    }
    return ZR_OK;
}

zr_status zr_staged_writer_put_tensor(zr_staged_writer *w, zr_tensor *t) {
    int64_t n = zr_tensor_numel(t) * (int64_t)zr_dtype_size(t->dtype);
    if (t->storage->device.type == ZR_CPU && n >= DIRECT_BYTES) {
        /* big host tensors are written from where they are: no copy through the staging */
        ZR_CHECK(writer_flush(w));
        return writer_submit(w, zr_tensor_data(t), n, zr_tensor_retain(t));
    }
    return zr_staged_writer_put(w, zr_tensor_data(t), t->storage->device, n);
}

zr_status zr_staged_writer_finish(zr_staged_writer *w) {
    zr_status st = writer_flush(w);
    zr_status wst = writer_wait(w);
    pthread_mutex_lock(&w->m);
    w->quit = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->m);
    pthread_join(w->th, NULL);
    pthread_mutex_destroy(&w->m);
    pthread_cond_destroy(&w->cv);
    zr_staging_give(&save_pool, &w->sb);
    free(w);
    return st ? st : wst;
}
