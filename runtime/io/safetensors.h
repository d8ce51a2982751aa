/* safetensors files (https://huggingface.co/docs/safetensors): a validating reader that maps the
 * file and converts one tensor at a time on request, and an atomic writer whose output matches
 * the Python library's layout. Not a general file-system layer (only the atomic-write helper).
 *
 *   zr_safetensors *f = zr_safetensors_open("model.safetensors");  // NULL + zr_last_error()
 *   for (int64_t i = 0; i < zr_safetensors_count(f); i++)             // entries sorted by name
 *       puts(zr_safetensors_entry_at(f, i)->name);
 *   zr_tensor *w = zr_safetensors_get(f, "lm_head.weight", ZR_F32, zr_cpu()); // new reference
 *   zr_safetensors_close(f);                                          // tensors stay valid
 *
 * File layout: u64 little-endian header length N, N bytes of JSON {"name": {"dtype": "F32",
 * "shape": [2,3], "data_offsets": [begin, end]}, ..., "__metadata__": {"k": "v"}}, then the data
 * section; offsets are relative to the start of the data section (8 + N). */
#ifndef ZR_SAFETENSORS_H
#define ZR_SAFETENSORS_H

#include "core/tensor.h"
#include "io/atomic_file.h"

/* Element types a file may store. BOOL, I8 and I16 have no zrun dtype: they load as u8, i32, i32
 * unless another dtype is asked for. The enum order is the Python library's, which orders the
 * data section (widest first). */
typedef enum {
    ZR_ST_BOOL = 0,
    ZR_ST_U8,
    ZR_ST_I8,
    ZR_ST_I16,
    ZR_ST_F16,
    ZR_ST_BF16,
    ZR_ST_I32,
    ZR_ST_F32,
    ZR_ST_F64,
    ZR_ST_I64,
    ZR_ST_NDTYPES
} zr_st_dtype;

const char *zr_st_dtype_name(zr_st_dtype t); /* "F32", "BF16", ... */
size_t zr_st_dtype_size(zr_st_dtype t);
zr_dtype zr_st_dtype_native(zr_st_dtype t);  /* the zrun dtype a tensor loads as by default */
int zr_st_dtype_from_zr(zr_dtype t);          /* F32 for ZR_F32, ...; -1 if none */

typedef struct {
    const char *name;
    zr_st_dtype st_dtype; /* as stored */
    zr_dtype dtype;       /* zr_st_dtype_native(st_dtype) */
    int ndim;
    int64_t shape[ZR_MAX_DIMS];
    int64_t numel;
    int64_t begin, end; /* byte range inside the data section */
} zr_safetensors_entry;

typedef struct zr_safetensors zr_safetensors;

/* Opens and validates a file as strictly as the Rust library: header length, JSON, every entry
 * (dtype, shape and offsets written as non-negative integers, byte count = numel * element size,
 * no duplicate names, no NUL in names), the tensors tiling the data section exactly (no overlap, no
 * gap, no trailing bytes) and __metadata__ (a string -> string map). The file is mapped, not read.
 * Errors name the file, the tensor and the problem. */
zr_safetensors *zr_safetensors_open(const char *path);
void zr_safetensors_close(zr_safetensors *f); /* NULL-safe */

/* A view of any file whose tensors are stored raw (little-endian, contiguous) at known byte
 * offsets: the records of a PyTorch zip checkpoint (lua/zrun/torch_file.lua finds them). The file
 * is mapped; each entry is checked to lie inside it (entries may overlap: tensors sharing a
 * storage); names must be unique. Then it reads, converts and bulk-loads (safetensors_load.h) as
 * an opened safetensors file does; it has no metadata, and begin/end are file offsets. */
typedef struct {
    const char *name;
    zr_st_dtype st_dtype;
    int ndim;
    int64_t shape[ZR_MAX_DIMS];
    int64_t offset; /* file byte of the first element */
} zr_safetensors_view_entry;
zr_safetensors *zr_safetensors_open_view(const char *path, const zr_safetensors_view_entry *v, int64_t n);

const char *zr_safetensors_path(const zr_safetensors *f);
int64_t zr_safetensors_count(const zr_safetensors *f);
const zr_safetensors_entry *zr_safetensors_entry_at(const zr_safetensors *f, int64_t i);
const zr_safetensors_entry *zr_safetensors_find(const zr_safetensors *f, const char *name); /* or NULL */
int64_t zr_safetensors_data_bytes(const zr_safetensors *f); /* size of the data section */
int64_t zr_safetensors_data_offset(const zr_safetensors *f); /* file byte where it starts */

int64_t zr_safetensors_metadata_count(const zr_safetensors *f);
const char *zr_safetensors_metadata_key(const zr_safetensors *f, int64_t i);   /* sorted by key */
const char *zr_safetensors_metadata_value(const zr_safetensors *f, int64_t i);
const char *zr_safetensors_metadata_get(const zr_safetensors *f, const char *key); /* or NULL */

/* A new contiguous tensor holding tensor `name`, converted to dtype_wanted (-1: the stored type's
 * native zrun dtype) and placed on dev. Any stored dtype converts to any zrun dtype. */
zr_tensor *zr_safetensors_get(const zr_safetensors *f, const char *name, int dtype_wanted,
                              zr_device dev);
zr_tensor *zr_safetensors_get_entry(const zr_safetensors *f, const zr_safetensors_entry *e,
                                    int dtype_wanted, zr_device dev);

/* --- writing --- */

typedef struct {
    const char *key, *value;
} zr_safetensors_kv;

/* Writes n tensors (any device, layout or dtype; each is written as its own dtype) and optional
 * metadata to path, atomically: a temporary file in the same directory, fsync, rename, fsync of
 * the directory. Names must be unique and not "__metadata__". The data section is ordered like
 * the Python library's (widest dtype first, then by name), so every tensor is naturally aligned;
 * the header is padded with spaces to a multiple of 8 bytes. */
zr_status zr_safetensors_write(const char *path, const char *const *names,
                               zr_tensor *const *tensors, int64_t n,
                               const zr_safetensors_kv *meta, int64_t n_meta);

/* Streaming variant with bounded memory: the header is built from dtypes and shapes given up
 * front, then get(ctx, i) is called once for each spec index i, in data-section order, and returns a
 * new reference to a tensor of exactly specs[i]'s dtype and shape (or NULL with an error set). */
typedef struct {
    const char *name;
    zr_dtype dtype;
    int ndim;
    int64_t shape[ZR_MAX_DIMS];
} zr_safetensors_spec;
typedef zr_tensor *(*zr_safetensors_get_fn)(void *ctx, int64_t i);
zr_status zr_safetensors_write_stream(const char *path, const zr_safetensors_spec *specs, int64_t n,
                                      zr_safetensors_get_fn get, void *ctx,
                                      const zr_safetensors_kv *meta, int64_t n_meta);

/* zr_file_write_atomic (writing any file atomically) is in atomic_file.h. */

#endif
