/* safetensors reader (mmap + validation + per-tensor conversion) and atomic writer. The format
 * and the checks follow the reference Rust implementation; see safetensors.h for the API.
 * Assumes a little-endian host, like the format itself. */
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/atomic_file.h"
#include "io/json.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

#define MAX_HEADER_BYTES 100000000LL /* the Rust library's limit */

static const struct {
    const char *name;
    size_t size;
    zr_dtype native;
} st_info[ZR_ST_NDTYPES] = {
    [ZR_ST_BOOL] = {"BOOL", 1, ZR_U8}, [ZR_ST_U8] = {"U8", 1, ZR_U8},
    [ZR_ST_I8] = {"I8", 1, ZR_I32},    [ZR_ST_I16] = {"I16", 2, ZR_I32},
    [ZR_ST_F16] = {"F16", 2, ZR_F16},  [ZR_ST_BF16] = {"BF16", 2, ZR_BF16},
    [ZR_ST_I32] = {"I32", 4, ZR_I32},  [ZR_ST_F32] = {"F32", 4, ZR_F32},
    [ZR_ST_F64] = {"F64", 8, ZR_F64},  [ZR_ST_I64] = {"I64", 8, ZR_I64},
};

const char *zr_st_dtype_name(zr_st_dtype t) { return (unsigned)t < ZR_ST_NDTYPES ? st_info[t].name : "?"; }
size_t zr_st_dtype_size(zr_st_dtype t) { return (unsigned)t < ZR_ST_NDTYPES ? st_info[t].size : 0; }
zr_dtype zr_st_dtype_native(zr_st_dtype t) { return (unsigned)t < ZR_ST_NDTYPES ? st_info[t].native : ZR_F32; }
int zr_st_dtype_from_zr(zr_dtype t) {
    switch (t) {
    case ZR_F32: return ZR_ST_F32;
    case ZR_BF16: return ZR_ST_BF16;
    case ZR_F16: return ZR_ST_F16;
    case ZR_F64: return ZR_ST_F64;
    case ZR_I32: return ZR_ST_I32;
    case ZR_I64: return ZR_ST_I64;
    case ZR_U8: return ZR_ST_U8;
    default: return -1;
    }
}
static int st_dtype_parse(const char *s) {
    for (int i = 0; i < ZR_ST_NDTYPES; i++)
        if (strcmp(s, st_info[i].name) == 0) return i;
    return -1;
}

/* ================================ reader ================================ */

struct zr_safetensors {
    char *path;
    const uint8_t *map; /* whole file, read-only */
    int64_t file_size, header_len, data_start;
    zr_json_doc *doc; /* owns the name and metadata strings */
    zr_safetensors_entry *entries;
    int64_t n;
    zr_safetensors_kv *meta;
    int64_t n_meta;
    char *names; /* a view's entry names (zr_safetensors_open_view), one block */
};

static int cmp_entry_name(const void *a, const void *b) {
    return strcmp(((const zr_safetensors_entry *)a)->name, ((const zr_safetensors_entry *)b)->name);
}
static int cmp_kv_key(const void *a, const void *b) {
    return strcmp(((const zr_safetensors_kv *)a)->key, ((const zr_safetensors_kv *)b)->key);
}
static int cmp_entry_begin(const void *a, const void *b) {
    const zr_safetensors_entry *x = *(const zr_safetensors_entry *const *)a,
                               *y = *(const zr_safetensors_entry *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* Reads a non-negative integer array (shape or data_offsets); returns its length or -1. */
static int int_array(const zr_json *v, int64_t *out, int max, const char *path, const char *name,
                     const char *field) {
    if (!zr_json_is(v, ZR_JSON_ARRAY)) {
        zr_error("%s: tensor '%s': \"%s\" must be an array of integers, got %s", path, name, field,
                 zr_json_type_name(v));
        return -1;
    }
    int64_t n = zr_json_len(v);
    if (n > max) {
        zr_error("%s: tensor '%s': \"%s\" has %lld entries, at most %d allowed", path, name, field,
                 (long long)n, max);
        return -1;
    }
    for (int64_t i = 0; i < n; i++) {
        const zr_json *x = zr_json_at(v, i);
        /* Written as digits, as the Rust library's usize fields require: 2e0 and 3.0 are refused. */
        if (!zr_json_is(x, ZR_JSON_NUMBER) || !x->is_int_literal || x->u.n.i < 0) {
            const char *got = !zr_json_is(x, ZR_JSON_NUMBER) ? zr_json_type_name(x)
                              : x->u.n.num < 0                 ? "a negative number"
                              : x->is_int ? "a number with a fraction or exponent (write digits only)"
                                          : "a fractional or too large number";
            zr_error("%s: tensor '%s': \"%s\" entry %lld must be a non-negative integer, got %s", path,
                     name, field, (long long)i + 1, got);
            return -1;
        }
        out[i] = x->u.n.i;
    }
    return (int)n;
}

static zr_status parse_entry(zr_safetensors *f, const char *name, const zr_json *v,
                             zr_safetensors_entry *e) {
    const char *path = f->path;
    if (!zr_json_is(v, ZR_JSON_OBJECT))
        return zr_error("%s: tensor '%s': expected an object with dtype, shape and data_offsets, got %s",
                        path, name, zr_json_type_name(v));
    const zr_json *dt = zr_json_get(v, "dtype"), *sh = zr_json_get(v, "shape"),
                  *off = zr_json_get(v, "data_offsets");
    if (!dt || !sh || !off)
        return zr_error("%s: tensor '%s': missing \"%s\"", path, name,
                        !dt ? "dtype" : !sh ? "shape" : "data_offsets");
    if (!zr_json_is(dt, ZR_JSON_STRING))
        return zr_error("%s: tensor '%s': \"dtype\" must be a string, got %s", path, name,
                        zr_json_type_name(dt));
    int st = st_dtype_parse(dt->u.str);
    if (st < 0)
        return zr_error("%s: tensor '%s': dtype '%s' is not supported (zrun reads F64, F32, F16, BF16, "
                        "I64, I32, I16, I8, U8 and BOOL)",
                        path, name, dt->u.str);
    memset(e, 0, sizeof *e);
    e->name = name;
    e->st_dtype = (zr_st_dtype)st;
    e->dtype = st_info[st].native;
    if (zr_json_is(sh, ZR_JSON_ARRAY) && zr_json_len(sh) > ZR_MAX_DIMS)
        return zr_error("%s: tensor '%s': shape has %lld dims; zrun tensors have at most %d", path, name,
                        (long long)zr_json_len(sh), ZR_MAX_DIMS);
    int nd = int_array(sh, e->shape, ZR_MAX_DIMS, path, name, "shape");
    if (nd < 0) return ZR_ERR;
    e->ndim = nd;
    int64_t o[2];
    int no = int_array(off, o, 2, path, name, "data_offsets");
    if (no < 0) return ZR_ERR;
    if (no != 2)
        return zr_error("%s: tensor '%s': \"data_offsets\" must be [begin, end], got %d entries", path,
                        name, no);
    e->begin = o[0];
    e->end = o[1];
    char sb[128];
    zr_shape_str(e->ndim, e->shape, sb);
    int64_t numel = 1, nbytes;
    for (int i = 0; i < nd; i++)
        if (__builtin_mul_overflow(numel, e->shape[i], &numel))
            return zr_error("%s: tensor '%s': shape %s has too many elements", path, name, sb);
    if (__builtin_mul_overflow(numel, (int64_t)st_info[st].size, &nbytes))
        return zr_error("%s: tensor '%s': shape %s has too many elements", path, name, sb);
    e->numel = numel;
    if (e->end < e->begin)
        return zr_error("%s: tensor '%s': data_offsets [%lld, %lld] end before they begin", path, name,
                        (long long)e->begin, (long long)e->end);
    int64_t data_len = f->file_size - f->data_start;
    if (e->end > data_len)
        return zr_error("%s: tensor '%s': data_offsets end %lld (byte %lld of the file) is past the end "
                        "of the file (%lld bytes); the file looks truncated (an interrupted download or copy: fetch it again)",
                        path, name, (long long)e->end, (long long)(f->data_start + e->end),
                        (long long)f->file_size);
    if (e->end - e->begin != nbytes)
        return zr_error("%s: tensor '%s': data_offsets [%lld, %lld] hold %lld bytes, but %s %s needs %lld "
                        "(%lld elements x %d bytes)",
                        path, name, (long long)e->begin, (long long)e->end, (long long)(e->end - e->begin),
                        st_info[st].name, sb, (long long)nbytes, (long long)numel, (int)st_info[st].size);
    return ZR_OK;
}

static zr_status parse_metadata(zr_safetensors *f, const zr_json *m) {
    if (zr_json_is_null(m)) return ZR_OK;
    if (!zr_json_is(m, ZR_JSON_OBJECT))
        return zr_error("%s: \"__metadata__\" must be an object of strings, got %s", f->path,
                        zr_json_type_name(m));
    if (f->meta) return zr_error("%s: the header has the key \"__metadata__\" twice", f->path);
    int64_t n = zr_json_len(m);
    f->meta = calloc((size_t)n + 1, sizeof *f->meta);
    if (!f->meta) return zr_error("%s: out of host memory", f->path);
    for (int64_t i = 0; i < n; i++) {
        const zr_json_member *mem = zr_json_member_at(m, i);
        if (!zr_json_is(&mem->value, ZR_JSON_STRING))
            return zr_error("%s: \"__metadata__\" value of '%s' must be a string, got %s", f->path,
                            mem->key, zr_json_type_name(&mem->value));
        if ((int64_t)strlen(mem->key) != mem->key_len || (int64_t)strlen(mem->value.u.str) != mem->value.len)
            return zr_error("%s: \"__metadata__\" key '%s' or its value holds a NUL character (\\u0000); "
                            "they must not", f->path, mem->key);
        f->meta[i].key = mem->key;
        f->meta[i].value = mem->value.u.str;
    }
    f->n_meta = n;
    qsort(f->meta, (size_t)n, sizeof *f->meta, cmp_kv_key);
    for (int64_t i = 1; i < n; i++)
        if (strcmp(f->meta[i].key, f->meta[i - 1].key) == 0)
            return zr_error("%s: \"__metadata__\" has the key '%s' twice", f->path, f->meta[i].key);
    return ZR_OK;
}

static zr_status parse_header(zr_safetensors *f) {
    const char *path = f->path;
    if (f->file_size < 8)
        return zr_error("%s: the file is only %lld bytes; a safetensors file starts with an 8-byte header "
                        "length (the file is truncated or not a safetensors file)",
                        path, (long long)f->file_size);
    uint64_t n;
    memcpy(&n, f->map, 8);
    if (n < 2)
        return zr_error("%s: header length %llu is too small to hold a JSON object; this is not a "
                        "safetensors file",
                        path, (unsigned long long)n);
    if (n > (uint64_t)MAX_HEADER_BYTES)
        return zr_error("%s: header length %llu is over the %lld-byte limit; this is not a safetensors file "
                        "(or its first 8 bytes are damaged)",
                        path, (unsigned long long)n, MAX_HEADER_BYTES);
    if ((int64_t)n > f->file_size - 8)
        return zr_error("%s: header length %llu is past the end of the file (%lld bytes); the file looks "
                        "truncated",
                        path, (unsigned long long)n, (long long)f->file_size);
    f->header_len = (int64_t)n;
    f->data_start = 8 + (int64_t)n;
    const char *text = (const char *)f->map + 8;
    if (text[0] != '{')
        return zr_error("%s: the header does not start with '{' (got byte 0x%02x); this is not a "
                        "safetensors file",
                        path, (unsigned char)text[0]);
    char jname[512];
    snprintf(jname, sizeof jname, "%s header", path);
    f->doc = zr_json_parse(text, (int64_t)n, jname);
    if (!f->doc) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", zr_last_error_message());
        return zr_error("%s: the header is not valid JSON: %s", path, msg);
    }
    const zr_json *root = zr_json_root(f->doc);
    if (!zr_json_is(root, ZR_JSON_OBJECT))
        return zr_error("%s: the header must be a JSON object, got %s", path, zr_json_type_name(root));
    int64_t nm = zr_json_len(root);
    f->entries = calloc((size_t)nm + 1, sizeof *f->entries);
    if (!f->entries) return zr_error("%s: out of host memory", path);
    for (int64_t i = 0; i < nm; i++) {
        const zr_json_member *m = zr_json_member_at(root, i);
        /* A \u0000 in a key would cut the name short here (the Rust library refuses it too). */
        if ((int64_t)strlen(m->key) != m->key_len)
            return zr_error("%s: tensor name '%s\\u0000...' holds a NUL character (\\u0000); names must not",
                            path, m->key);
        if (strcmp(m->key, "__metadata__") == 0) {
            ZR_CHECK(parse_metadata(f, &m->value));
            continue;
        }
        ZR_CHECK(parse_entry(f, m->key, &m->value, &f->entries[f->n]));
        f->n++;
    }
    qsort(f->entries, (size_t)f->n, sizeof *f->entries, cmp_entry_name);
    for (int64_t i = 1; i < f->n; i++)
        if (strcmp(f->entries[i].name, f->entries[i - 1].name) == 0)
            return zr_error("%s: tensor '%s' appears twice in the header", path, f->entries[i].name);
    /* The tensors tile the data section exactly, as the Rust library requires: sorted by offsets,
     * each begins where the previous one ends (the first at 0), and the last ends at the end of the
     * file. No overlap, no gap, no trailing bytes. */
    const zr_safetensors_entry **by = malloc(((size_t)f->n + 1) * sizeof *by);
    if (!by) return zr_error("%s: out of host memory", path);
    for (int64_t i = 0; i < f->n; i++)
        by[i] = &f->entries[i];
    qsort(by, (size_t)f->n, sizeof *by, cmp_entry_begin);
    int64_t pos = 0;
    const zr_safetensors_entry *prev = NULL;
    zr_status st = ZR_OK;
    for (int64_t i = 0; i < f->n && !st; i++) {
        const zr_safetensors_entry *e = by[i];
        if (e->begin < pos)
            st = zr_error("%s: tensors '%s' [%lld, %lld] and '%s' [%lld, %lld] overlap in the data section; "
                          "the header is corrupt",
                          path, prev->name, (long long)prev->begin, (long long)prev->end, e->name,
                          (long long)e->begin, (long long)e->end);
        else if (e->begin > pos && prev)
            st = zr_error("%s: tensor '%s' begins at byte %lld of the data section but '%s' ends at %lld: "
                          "a gap of %lld bytes that belong to no tensor; the header is corrupt",
                          path, e->name, (long long)e->begin, prev->name, (long long)pos,
                          (long long)(e->begin - pos));
        else if (e->begin > pos)
            st = zr_error("%s: the first tensor, '%s', begins at byte %lld of the data section, not 0: a "
                          "gap of %lld bytes that belong to no tensor; the header is corrupt",
                          path, e->name, (long long)e->begin, (long long)e->begin);
        pos = e->end;
        prev = e;
    }
    free(by);
    int64_t data_len = f->file_size - f->data_start;
    if (!st && pos != data_len)
        st = zr_error("%s: the tensors end at byte %lld of the data section, but it holds %lld bytes: %lld "
                      "trailing bytes belong to no tensor (the file was appended to or the header is "
                      "corrupt)",
                      path, (long long)pos, (long long)data_len, (long long)(data_len - pos));
    return st;
}

/* Opens path, maps it whole into f->map (f->path and f->file_size set). */
static zr_status map_file(zr_safetensors *f, const char *path, const char *what) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return zr_error("%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        if (S_ISDIR(sb.st_mode)) return zr_error("%s: is a directory, not a %s", path, what);
        return zr_error("%s: not a regular file", path);
    }
    f->file_size = (int64_t)sb.st_size;
    if (f->file_size > 0) {
        void *m = mmap(NULL, (size_t)f->file_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            close(fd);
            return zr_error("%s: cannot map the file: %s", path, strerror(errno));
        }
        f->map = m;
    }
    close(fd); /* the mapping keeps the file */
    return ZR_OK;
}

zr_safetensors *zr_safetensors_open_view(const char *path, const zr_safetensors_view_entry *v, int64_t n) {
    zr_safetensors *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return zr_error_null("%s: out of host memory", path);
    }
    size_t nbytes = 1;
    for (int64_t i = 0; i < n; i++) nbytes += strlen(v[i].name) + 1;
    if (map_file(f, path, "file of tensors")) {
        zr_safetensors_close(f);
        return NULL;
    }
    if (!(f->entries = calloc((size_t)(n ? n : 1), sizeof *f->entries)) || !(f->names = malloc(nbytes))) {
        zr_safetensors_close(f);
        return zr_error_null("%s: out of host memory", path);
    }
    char *w = f->names;
    for (int64_t i = 0; i < n; i++) {
        zr_safetensors_entry *e = &f->entries[i];
        size_t len = strlen(v[i].name) + 1;
        memcpy(w, v[i].name, len);
        e->name = w;
        w += len;
        if ((unsigned)v[i].st_dtype >= ZR_ST_NDTYPES || v[i].ndim < 0 || v[i].ndim > ZR_MAX_DIMS) {
            zr_error("%s: tensor '%s': bad dtype or rank", path, e->name);
            zr_safetensors_close(f);
            return NULL;
        }
        e->st_dtype = v[i].st_dtype;
        e->dtype = zr_st_dtype_native(e->st_dtype);
        e->ndim = v[i].ndim;
        e->numel = 1;
        int over = 0;
        for (int d = 0; d < e->ndim; d++) {
            e->shape[d] = v[i].shape[d];
            if (e->shape[d] < 0 || (e->shape[d] && e->numel > INT64_MAX / 8 / e->shape[d])) over = 1;
            else e->numel *= e->shape[d];
        }
        e->begin = v[i].offset;
        int64_t nbytes = over ? 0 : e->numel * (int64_t)zr_st_dtype_size(e->st_dtype);
        over = over || e->begin < 0 || e->begin > f->file_size || nbytes > f->file_size - e->begin;
        e->end = over ? e->begin : e->begin + nbytes;
        if (over) {
            zr_error("%s: tensor '%s' lies past the end of the file (%lld elements of %d bytes at offset %lld of "
                     "%lld bytes): the file is truncated or its index is damaged",
                     path, e->name, (long long)e->numel, (int)zr_st_dtype_size(e->st_dtype), (long long)e->begin,
                     (long long)f->file_size);
            zr_safetensors_close(f);
            return NULL;
        }
    }
    f->n = n;
    qsort(f->entries, (size_t)n, sizeof *f->entries, cmp_entry_name);
    for (int64_t i = 1; i < n; i++)
        if (strcmp(f->entries[i - 1].name, f->entries[i].name) == 0) {
            zr_error("%s: tensor '%s' named twice", path, f->entries[i].name);
            zr_safetensors_close(f);
            return NULL;
        }
    return f;
}

zr_safetensors *zr_safetensors_open(const char *path) {
    zr_safetensors *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return zr_error_null("%s: out of host memory", path);
    }
    if (map_file(f, path, "safetensors file") || parse_header(f)) {
        zr_safetensors_close(f);
        return NULL;
    }
    return f;
}

void zr_safetensors_close(zr_safetensors *f) {
    if (!f) return;
    if (f->map) munmap((void *)f->map, (size_t)f->file_size);
    zr_json_doc_free(f->doc);
    free(f->entries);
    free(f->meta);
    free(f->names);
    free(f->path);
    free(f);
}

const char *zr_safetensors_path(const zr_safetensors *f) { return f->path; }
int64_t zr_safetensors_count(const zr_safetensors *f) { return f->n; }
const zr_safetensors_entry *zr_safetensors_entry_at(const zr_safetensors *f, int64_t i) {
    return i >= 0 && i < f->n ? &f->entries[i] : NULL;
}
const zr_safetensors_entry *zr_safetensors_find(const zr_safetensors *f, const char *name) {
    zr_safetensors_entry key = {.name = name};
    return bsearch(&key, f->entries, (size_t)f->n, sizeof key, cmp_entry_name);
}
int64_t zr_safetensors_data_bytes(const zr_safetensors *f) { return f->file_size - f->data_start; }
int64_t zr_safetensors_data_offset(const zr_safetensors *f) { return f->data_start; }
int64_t zr_safetensors_metadata_count(const zr_safetensors *f) { return f->n_meta; }
const char *zr_safetensors_metadata_key(const zr_safetensors *f, int64_t i) {
    return i >= 0 && i < f->n_meta ? f->meta[i].key : NULL;
}
const char *zr_safetensors_metadata_value(const zr_safetensors *f, int64_t i) {
    return i >= 0 && i < f->n_meta ? f->meta[i].value : NULL;
}
const char *zr_safetensors_metadata_get(const zr_safetensors *f, const char *key) {
    zr_safetensors_kv k = {.key = key};
    const zr_safetensors_kv *r = bsearch(&k, f->meta, (size_t)f->n_meta, sizeof k, cmp_kv_key);
    return r ? r->value : NULL;
}

/* Widens BOOL/I8/I16 (no zrun dtype) into u8 or i32. src may be unaligned. */
static void widen(void *dst, const uint8_t *src, zr_st_dtype st, int64_t n) {
    if (st == ZR_ST_BOOL) {
        uint8_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = src[i] != 0;
    } else if (st == ZR_ST_I8) {
        int32_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = (int8_t)src[i];
    } else { /* I16 */
        int32_t *d = dst;
        for (int64_t i = 0; i < n; i++) {
            int16_t v;
            memcpy(&v, src + 2 * i, 2);
            d[i] = v;
        }
    }
}

zr_tensor *zr_safetensors_get_entry(const zr_safetensors *f, const zr_safetensors_entry *e,
                                    int dtype_wanted, zr_device dev) {
    if (dtype_wanted >= ZR_NDTYPES)
        return zr_error_null("%s: tensor '%s': unknown dtype %d requested", f->path, e->name, dtype_wanted);
    zr_dtype nat = e->dtype, want = dtype_wanted < 0 ? nat : (zr_dtype)dtype_wanted;
    zr_tensor *out = zr_tensor_new(want, dev, e->ndim, e->shape);
    if (!out) {
        zr_error_prefix("%s: tensor '%s': ", f->path, e->name);
        return NULL;
    }
    if (e->numel == 0) return out;
    const uint8_t *src = f->map + f->data_start + e->begin;
    size_t nbytes = (size_t)(e->end - e->begin);
    int direct = zr_st_dtype_from_zr(nat) == (int)e->st_dtype; /* bytes are a zrun dtype as is */
    int host_same = dev.type == ZR_CPU && want == nat;
    zr_status st = ZR_OK;
    if (host_same && direct) memcpy(zr_tensor_data(out), src, nbytes);
    else if (host_same) widen(zr_tensor_data(out), src, e->st_dtype, e->numel);
    else if (direct && (uintptr_t)src % zr_dtype_size(nat) == 0) {
        /* Convert straight out of the mapping through a borrowed, never-released header. */
        zr_storage *s = zr_storage_wrap(zr_cpu(), (void *)src, nbytes);
        if (!s) st = ZR_ERR;
        else {
            zr_tensor view = {.refcount = 1, .ndim = e->ndim, .dtype = nat, .storage = s};
            int64_t stride = 1;
            for (int i = e->ndim - 1; i >= 0; i--) {
                view.shape[i] = e->shape[i];
                view.stride[i] = stride;
                stride *= e->shape[i];
            }
            st = zr_tensor_copy_(out, &view);
            zr_storage_release(s);
        }
    } else { /* unaligned or widened: stage in a host tensor of the native dtype */
        zr_tensor *h = zr_tensor_new_cat(nat, zr_cpu(), e->ndim, e->shape, ZR_MEM_WORKSPACE, 0);
        if (!h) st = ZR_ERR;
        else {
            if (direct) memcpy(zr_tensor_data(h), src, nbytes);
            else widen(zr_tensor_data(h), src, e->st_dtype, e->numel);
            st = zr_tensor_copy_(out, h);
            zr_tensor_release(h);
        }
    }
    /* The bytes were copied: let the kernel drop those pages from this process (bounded RSS when
     * streaming a large checkpoint). */
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)src + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1),
              b = ((uintptr_t)src + nbytes) & ~(uintptr_t)(pg - 1);
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
    if (st) {
        zr_error_prefix("%s: tensor '%s': ", f->path, e->name);
        zr_tensor_release(out);
        return NULL;
    }
    return out;
}

zr_tensor *zr_safetensors_get(const zr_safetensors *f, const char *name, int dtype_wanted,
                              zr_device dev) {
    const zr_safetensors_entry *e = zr_safetensors_find(f, name);
    if (!e)
        return zr_error_null("%s: no tensor named '%s' (the file has %lld tensors%s%s%s)", f->path, name,
                             (long long)f->n, f->n ? ", e.g. '" : "", f->n ? f->entries[0].name : "",
                             f->n ? "'" : "");
    return zr_safetensors_get_entry(f, e, dtype_wanted, dev);
}

/* ================================ writer ================================ */

/* A growable string for the header. */
typedef struct {
    char *p;
    int64_t len, cap;
    int oom;
} sbuf;
static void sb_put(sbuf *b, const char *s, int64_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        int64_t cap = b->cap ? b->cap : 1024;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, (size_t)cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, (size_t)n);
    b->len += n;
    b->p[b->len] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, (int64_t)strlen(s)); }
static void sb_json(sbuf *b, const char *s) {
    int64_t n = (int64_t)strlen(s), need = zr_json_escape(NULL, 0, s, n);
    char small[256], *tmp = need < (int64_t)sizeof small ? small : malloc((size_t)need + 1);
    if (!tmp) {
        b->oom = 1;
        return;
    }
    zr_json_escape(tmp, need + 1, s, n);
    sb_put(b, tmp, need);
    if (tmp != small) free(tmp);
}
static void sb_int(sbuf *b, int64_t v) {
    char t[32];
    sb_put(b, t, snprintf(t, sizeof t, "%lld", (long long)v));
}

/* Data-section order of the Python library: widest dtype first (its enum order, descending), then
 * by name. */
typedef struct {
    int rank;
    const char *name;
    int64_t idx;
} order_key;
static int cmp_layout(const void *a, const void *b) {
    const order_key *x = a, *y = b;
    if (x->rank != y->rank) return y->rank - x->rank;
    return strcmp(x->name, y->name);
}
static int cmp_key_name(const void *a, const void *b) {
    return strcmp(((const order_key *)a)->name, ((const order_key *)b)->name);
}

static zr_status build_header(const char *path, const zr_safetensors_spec *specs, int64_t n,
                              const int64_t *order, const zr_safetensors_kv *meta, int64_t n_meta,
                              sbuf *b) {
    sb_str(b, "{");
    int first = 1;
    if (n_meta > 0) {
        zr_safetensors_kv *m = malloc((size_t)n_meta * sizeof *m);
        if (!m) return zr_error("%s: out of host memory", path);
        memcpy(m, meta, (size_t)n_meta * sizeof *m);
        qsort(m, (size_t)n_meta, sizeof *m, cmp_kv_key);
        sb_str(b, "\"__metadata__\":{");
        for (int64_t i = 0; i < n_meta; i++) {
            if (!m[i].key || !m[i].value) {
                free(m);
                return zr_error("%s: metadata entry %lld has a NULL key or value", path, (long long)i + 1);
            }
            if (i > 0 && strcmp(m[i].key, m[i - 1].key) == 0) {
                zr_error("%s: metadata key '%s' given twice", path, m[i].key);
                free(m);
                return ZR_ERR;
            }
            if (i) sb_str(b, ",");
            sb_json(b, m[i].key);
            sb_str(b, ":");
            sb_json(b, m[i].value);
        }
        sb_str(b, "}");
        free(m);
        first = 0;
    }
    int64_t off = 0;
    for (int64_t k = 0; k < n; k++) {
        const zr_safetensors_spec *s = &specs[order[k]];
        int64_t numel = 1;
        for (int d = 0; d < s->ndim; d++) numel *= s->shape[d];
        int64_t end = off + numel * (int64_t)zr_dtype_size(s->dtype);
        if (!first) sb_str(b, ",");
        first = 0;
        sb_json(b, s->name);
        sb_str(b, ":{\"dtype\":\"");
        sb_str(b, st_info[zr_st_dtype_from_zr(s->dtype)].name);
        sb_str(b, "\",\"shape\":[");
        for (int d = 0; d < s->ndim; d++) {
            if (d) sb_str(b, ",");
            sb_int(b, s->shape[d]);
        }
        sb_str(b, "],\"data_offsets\":[");
        sb_int(b, off);
        sb_str(b, ",");
        sb_int(b, end);
        sb_str(b, "]}");
        off = end;
    }
    sb_str(b, "}");
    while (b->len % 8) sb_str(b, " ");
    if (b->oom) return zr_error("%s: out of host memory building the header", path);
    return ZR_OK;
}

/* Puts one tensor's bytes (compacted on its own device first when it is not contiguous). */
static zr_status write_tensor(zr_staged_writer *w, const char *path, const zr_safetensors_spec *s, zr_tensor *t) {
    char b1[128], b2[128];
    int same = t->dtype == s->dtype && t->ndim == s->ndim;
    for (int d = 0; same && d < s->ndim; d++) same = t->shape[d] == s->shape[d];
    if (!same)
        return zr_error("%s: tensor '%s' is %s %s but was announced as %s %s", path, s->name,
                        zr_dtype_name(t->dtype), zr_tensor_shape_str(t, b1), zr_dtype_name(s->dtype),
                        zr_shape_str(s->ndim, s->shape, b2));
    int64_t nbytes = zr_tensor_numel(t) * (int64_t)zr_dtype_size(t->dtype);
    if (nbytes == 0) return ZR_OK;
    zr_tensor *c = zr_tensor_contiguous_raw(t); /* t itself when already contiguous */
    if (!c) {
        zr_error_prefix("%s: tensor '%s': ", path, s->name);
        return ZR_ERR;
    }
    zr_status st = zr_staged_writer_put_tensor(w, c);
    zr_tensor_release(c);
    return st;
}

zr_status zr_safetensors_write_stream(const char *path, const zr_safetensors_spec *specs, int64_t n,
                                      zr_safetensors_get_fn get, void *ctx,
                                      const zr_safetensors_kv *meta, int64_t n_meta) {
    for (int64_t i = 0; i < n; i++) {
        const zr_safetensors_spec *s = &specs[i];
        if (!s->name || !s->name[0])
            return zr_error("%s: tensor %lld has an empty name", path, (long long)i + 1);
        if (strcmp(s->name, "__metadata__") == 0)
            return zr_error("%s: '__metadata__' is reserved and cannot name a tensor", path);
        if (zr_st_dtype_from_zr(s->dtype) < 0)
            return zr_error("%s: tensor '%s': dtype %s cannot be stored in safetensors", path, s->name,
                            zr_dtype_name(s->dtype));
        if (s->ndim < 0 || s->ndim > ZR_MAX_DIMS)
            return zr_error("%s: tensor '%s': %d dims (at most %d)", path, s->name, s->ndim, ZR_MAX_DIMS);
    }
    order_key *keys = malloc(((size_t)n + 1) * sizeof *keys);
    int64_t *order = malloc(((size_t)n + 1) * sizeof *order);
    if (!keys || !order) {
        free(keys);
        free(order);
        return zr_error("%s: out of host memory", path);
    }
    for (int64_t i = 0; i < n; i++)
        keys[i] = (order_key){zr_st_dtype_from_zr(specs[i].dtype), specs[i].name, i};
    qsort(keys, (size_t)n, sizeof *keys, cmp_key_name);
    for (int64_t i = 1; i < n; i++)
        if (strcmp(keys[i].name, keys[i - 1].name) == 0) {
            zr_error("%s: tensor name '%s' given twice", path, keys[i].name);
            free(keys);
            free(order);
            return ZR_ERR;
        }
    qsort(keys, (size_t)n, sizeof *keys, cmp_layout);
    for (int64_t i = 0; i < n; i++) order[i] = keys[i].idx;
    free(keys);
    sbuf b = {0};
    if (build_header(path, specs, n, order, meta, n_meta, &b)) {
        free(b.p);
        free(order);
        return ZR_ERR;
    }
    /* The header and every tensor go through two big staging buffers: few large sequential
     * writes, made by a thread while the next buffer is filled (atomic_file.h). */
    zr_atomic_file a;
    zr_status st = zr_atomic_open(&a, path);
    zr_staged_writer *w = st ? NULL : zr_staged_writer_start(&a);
    if (!st && !w) {
        zr_atomic_abort(&a);
        st = ZR_ERR;
    }
    if (!st) {
        uint64_t hl = (uint64_t)b.len;
        st = zr_staged_writer_put(w, &hl, zr_cpu(), 8);
        if (!st) st = zr_staged_writer_put(w, b.p, zr_cpu(), b.len);
        for (int64_t k = 0; !st && k < n; k++) {
            zr_tensor *t = get(ctx, order[k]);
            if (!t) {
                zr_error_prefix("%s: getting tensor '%s': ", path, specs[order[k]].name);
                st = ZR_ERR;
                break;
            }
            st = write_tensor(w, path, &specs[order[k]], t);
            zr_tensor_release(t);
        }
        if (st) {
            char msg[1024]; /* the writer's own error, if any, must not replace the first one */
            snprintf(msg, sizeof msg, "%s", zr_last_error_message());
            zr_staged_writer_finish(w);
            zr_atomic_abort(&a);
            st = zr_error("%s", msg);
        } else if (zr_staged_writer_finish(w)) {
            zr_atomic_abort(&a);
            st = ZR_ERR;
        } else st = zr_atomic_commit(&a);
    }
    free(b.p);
    free(order);
    return st;
}

static zr_tensor *get_from_array(void *ctx, int64_t i) {
    return zr_tensor_retain(((zr_tensor *const *)ctx)[i]);
}

zr_status zr_safetensors_write(const char *path, const char *const *names,
                               zr_tensor *const *tensors, int64_t n,
                               const zr_safetensors_kv *meta, int64_t n_meta) {
    zr_safetensors_spec *specs = calloc((size_t)n + 1, sizeof *specs);
    if (!specs) return zr_error("%s: out of host memory", path);
    for (int64_t i = 0; i < n; i++) {
        if (!tensors[i]) {
            free(specs);
            return zr_error("%s: tensor '%s' is NULL", path, names[i] ? names[i] : "?");
        }
        specs[i].name = names[i];
        specs[i].dtype = tensors[i]->dtype;
        specs[i].ndim = tensors[i]->ndim;
        memcpy(specs[i].shape, tensors[i]->shape, sizeof specs[i].shape);
    }
    zr_status st = zr_safetensors_write_stream(path, specs, n, get_from_array, (void *)tensors, meta, n_meta);
    free(specs);
    return st;
}
