/* Bulk loading of safetensors tensors into tensors that already exist (a model's parameters):
 * each file byte is read once, in chunks, on several threads, straight into the destination.
 * Not here: parsing and validating files (safetensors.h), choosing which tensor goes where (Lua).
 *
 *   zr_safetensors_load_item it[2] = {{f, zr_safetensors_find(f, "w"), w}, {f, e2, b}};
 *   if (zr_safetensors_load_into(it, 2, 0)) puts(zr_last_error_message());
 *
 * CPU destinations: pread from the page cache into the tensor's storage (same dtype), or into a
 * per-thread buffer then converted into it (another dtype). CUDA destinations: pread into pinned
 * staging (two slots per thread), cudaMemcpyAsync on the thread's own stream while the next chunk
 * is read, and a dtype different from the file's converted on the device after the copy. */
#ifndef ZR_SAFETENSORS_LOAD_H
#define ZR_SAFETENSORS_LOAD_H

#include "io/safetensors.h"

typedef struct {
    const zr_safetensors *file;
    const zr_safetensors_entry *entry;
    zr_tensor *dst; /* contiguous, entry->numel elements, any dtype; CPU or one CUDA device */
} zr_safetensors_load_item;

/* Copies every item's tensor into its dst, converted as zr_tensor_copy_ converts (bf16/f16 round
 * to nearest even). threads <= 0: min(8, CPUs). Returns when every byte is in place (CUDA copies
 * synchronized). On error some destinations may be partly written; the message names the file and
 * the tensor. */
zr_status zr_safetensors_load_into(const zr_safetensors_load_item *items, int64_t n, int threads);

#endif
