/* Writing files atomically (a temporary file in the same directory, fsync, rename, fsync of the
 * directory: readers see the old file or the whole new one), and a staged writer that turns many
 * tensors into few big sequential writes. Not here: file formats (safetensors.c builds on this).
 *
 *   zr_atomic_file a;
 *   if (zr_atomic_open(&a, "out/model.safetensors")) return ZR_ERR;
 *   zr_staged_writer *w = zr_staged_writer_start(&a);      // NULL + error: call zr_atomic_abort
 *   zr_staged_writer_put(w, header, zr_cpu(), n);          // host or device bytes, any size
 *   if (zr_staged_writer_finish(w)) zr_atomic_abort(&a); else st = zr_atomic_commit(&a); */
#ifndef ZR_ATOMIC_FILE_H
#define ZR_ATOMIC_FILE_H

#include "core/tensor.h"

typedef struct {
    char *tmp;
    const char *path;
    int fd;
} zr_atomic_file;

zr_status zr_atomic_open(zr_atomic_file *a, const char *path);
zr_status zr_atomic_write(zr_atomic_file *a, const void *data, int64_t len);
void zr_atomic_abort(zr_atomic_file *a);                /* closes and removes the temporary file */
zr_status zr_atomic_commit(zr_atomic_file *a);          /* fsync, rename into place; aborts on error */

/* Writes len bytes to path atomically. */
zr_status zr_file_write_atomic(const char *path, const void *data, int64_t len);

/* Bytes put are packed into two 64 MB host buffers (page-locked on a GPU machine, so device bytes
 * come over at full speed); a thread writes a full buffer while the caller fills the other. Not
 * for use from several threads at once. */
typedef struct zr_staged_writer zr_staged_writer;
zr_staged_writer *zr_staged_writer_start(zr_atomic_file *a);
/* n bytes at p, which lives on dev (host memory, or contiguous memory of a CUDA device). Errors of
 * earlier background writes come back here. */
zr_status zr_staged_writer_put(zr_staged_writer *w, const void *p, zr_device dev, int64_t n);
/* A contiguous tensor's bytes: put as above, except a host tensor of 8 MB or more, which the
 * thread writes from the tensor's own memory (w holds a reference until it is written). */
zr_status zr_staged_writer_put_tensor(zr_staged_writer *w, zr_tensor *t);
/* Writes what is left, waits for the thread and frees w (always); the file is not committed. */
zr_status zr_staged_writer_finish(zr_staged_writer *w);

#endif
