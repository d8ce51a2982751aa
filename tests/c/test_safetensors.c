/* safetensors reader/writer: a hand-assembled file read back (format compatibility independent of
 * the writer), byte-exact writer output, round trips of every dtype, 0-dim/empty tensors, layout
 * order, each corruption's specific error, and atomic-write hygiene. */
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "io/safetensors.h"

static char tmpdir[64];

static const char *tpath(const char *name) {
    static char buf[4][256];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, 256, "%s/%s", tmpdir, name);
    return b;
}

/* Writes 8-byte LE length + header (padded with pad spaces) + data. */
static void write_raw(const char *path, const char *header, int pad, const void *data, size_t nd) {
    FILE *f = fopen(path, "wb");
    uint64_t n = strlen(header) + (size_t)pad;
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(n >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    if (nd) fwrite(data, 1, nd, f);
    fclose(f);
}

static int count_dir_entries(void) {
    DIR *d = opendir(tmpdir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}
static int dir_has_tmp(void) {
    DIR *d = opendir(tmpdir);
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) found = 1;
    closedir(d);
    return found;
}

/* Open must fail with a message containing want. */
static int open_fails_with(const char *path, const char *want) {
    zr_safetensors *f = zr_safetensors_open(path);
    if (f) {
        zr_safetensors_close(f);
        printf("  (opened %s, expected an error containing \"%s\")\n", path, want);
        return 0;
    }
    if (!strstr(zr_last_error_message(), want)) {
        printf("  (error \"%s\" lacks \"%s\")\n", zr_last_error_message(), want);
        return 0;
    }
    return 1;
}

TEST(hand_written_file) {
    /* F32 data at offset 10 (not 4-aligned in memory: exercises the staging path), little-endian
     * bytes written by hand. Values: bf16 {1, -2, 0.5, 3}: 0x3F80 0xC000 0x3F00 0x4040;
     * I8 {-5, 7}; f32 {1.5, -0.25}: 0x3FC00000 0xBE800000; I16 {-300, 2}: 0xFED4; BOOL {0, 1, 1};
     * U8 {255}; F16 {1, -2}: 0x3C00 0xC000 ; F64 {0.1}; I64 {-(2^40)}. */
    const char *hdr =
        "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"caf\xc3\xa9\"},"
        "\"w.bf16\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
        "\"w.i8\":{\"dtype\":\"I8\",\"shape\":[2],\"data_offsets\":[8,10]},"
        "\"w.f32\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[10,18]},"
        "\"w.i16\":{\"dtype\":\"I16\",\"shape\":[2],\"data_offsets\":[18,22]},"
        "\"w.bool\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":[22,25]},"
        "\"w.u8\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[25,26]},"
        "\"w.f16\":{\"dtype\":\"F16\",\"shape\":[2,1],\"data_offsets\":[26,30]},"
        "\"w.f64\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[30,38]},"
        "\"w.i64\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[38,46]},"
        "\"w.empty\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[46,46]}}";
    unsigned char data[46] = {
        0x80, 0x3F, 0x00, 0xC0, 0x00, 0x3F, 0x40, 0x40,       /* bf16 */
        0xFB, 0x07,                                           /* i8 */
        0x00, 0x00, 0xC0, 0x3F, 0x00, 0x00, 0x80, 0xBE,       /* f32 */
        0xD4, 0xFE, 0x02, 0x00,                               /* i16 */
        0x00, 0x01, 0x01,                                     /* bool */
        0xFF,                                                 /* u8 */
        0x00, 0x3C, 0x00, 0xC0,                               /* f16 */
        0x9A, 0x99, 0x99, 0x99, 0x99, 0x99, 0xB9, 0x3F,       /* f64 0.1 */
        0x00, 0x00, 0x00, 0x00, 0x00, 0xFF, 0xFF, 0xFF,       /* i64 -2^40 */
    };
    write_raw(tpath("hand.safetensors"), hdr, 3, data, sizeof data);
    zr_safetensors *f = zr_safetensors_open(tpath("hand.safetensors"));
    CHECK_MSG(f, "open: %s", zr_last_error());
    if (!f) return;
    CHECK(zr_safetensors_count(f) == 10);
    CHECK(strcmp(zr_safetensors_entry_at(f, 0)->name, "w.bf16") == 0); /* sorted by name */
    CHECK(strcmp(zr_safetensors_metadata_get(f, "format"), "pt") == 0);
    CHECK(strcmp(zr_safetensors_metadata_get(f, "note"), "caf\xc3\xa9") == 0);
    CHECK(zr_safetensors_metadata_get(f, "missing") == NULL);
    double v;
    zr_tensor *t = zr_safetensors_get(f, "w.bf16", -1, zr_cpu());
    CHECK(t && t->dtype == ZR_BF16 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 2);
    const double bf[4] = {1, -2, 0.5, 3};
    for (int i = 0; t && i < 4; i++) CHECK(zr_tensor_get(t, i, &v) == 0 && v == bf[i]);
    zr_tensor_release(t);
    t = zr_safetensors_get(f, "w.bf16", ZR_F64, zr_cpu());
    CHECK(t && t->dtype == ZR_F64);
    for (int i = 0; t && i < 4; i++) CHECK(((double *)zr_tensor_data(t))[i] == bf[i]);
    zr_tensor_release(t);
    t = zr_safetensors_get(f, "w.f32", -1, zr_cpu());
    CHECK(t && ((float *)zr_tensor_data(t))[0] == 1.5f && ((float *)zr_tensor_data(t))[1] == -0.25f);
    zr_tensor_release(t);
    t = zr_safetensors_get(f, "w.f32", ZR_BF16, zr_cpu()); /* unaligned source, converted */
    CHECK(t && zr_tensor_get(t, 1, &v) == 0 && v == -0.25);
    zr_tensor_release(t);
    t = zr_safetensors_get(f, "w.i8", -1, zr_cpu());
    CHECK(t && t->dtype == ZR_I32 && ((int32_t *)zr_tensor_data(t))[0] == -5 && ((int32_t *)zr_tensor_data(t))[1] == 7);
    zr_tensor_release(t);
    t = zr_safetensors_get(f, "w.i16", ZR_F32, zr_cpu());
    CHECK(t && ((float *)zr_tensor_data(t))[0] == -300.f && ((float *)zr_tensor_data(t))[1] == 2.f);
    zr_tensor_release(t);
    t = zr_safetensors_get(f, "w.bool", -1, zr_cpu());
    CHECK(t && t->dtype == ZR_U8 && memcmp(zr_tensor_data(t), "\0\1\1", 3) == 0);
    zr_tensor_release(t);
    t = zr_safetensors_get(f, "w.u8", ZR_I64, zr_cpu());
    CHECK(t && t->ndim == 0 && ((int64_t *)zr_tensor_data(t))[0] == 255);
    zr_tensor_release(t);
    t = zr_safetensors_get(f, "w.f16", ZR_F32, zr_cpu());
    CHECK(t && t->shape[0] == 2 && t->shape[1] == 1 && ((float *)zr_tensor_data(t))[1] == -2.f);
    zr_tensor_release(t);
    t = zr_safetensors_get(f, "w.f64", -1, zr_cpu());
    CHECK(t && ((double *)zr_tensor_data(t))[0] == 0.1);
    zr_tensor_release(t);
    t = zr_safetensors_get(f, "w.i64", -1, zr_cpu());
    CHECK(t && ((int64_t *)zr_tensor_data(t))[0] == -(1LL << 40));
    zr_tensor_release(t);
    t = zr_safetensors_get(f, "w.empty", ZR_BF16, zr_cpu());
    CHECK(t && t->ndim == 2 && t->shape[0] == 0 && t->shape[1] == 3 && zr_tensor_numel(t) == 0);
    zr_tensor_release(t);
    CHECK(zr_safetensors_get(f, "nope", -1, zr_cpu()) == NULL);
    CHECK(strstr(zr_last_error_message(), "no tensor named 'nope'"));
    zr_safetensors_close(f);
}

TEST(writer_bytes_match_format) {
    /* What the Python library writes for {"a": float32 [1, 2]} with metadata {"format": "pt"}:
     * compact JSON, __metadata__ first, padded with spaces to a multiple of 8. */
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8;
    unsigned char expect[256] = {0};
    expect[0] = (unsigned char)padded;
    memcpy(expect + 8, hdr, hl);
    memset(expect + 8 + hl, ' ', padded - hl);
    float vals[2] = {1, 2};
    memcpy(expect + 8 + padded, vals, 8);
    size_t total = 8 + padded + 8;

    int64_t shape[1] = {2};
    zr_tensor *a = zr_tensor_from_data(ZR_F32, 1, shape, vals);
    const char *names[] = {"a"};
    zr_safetensors_kv meta[] = {{"format", "pt"}};
    CHECK(zr_safetensors_write(tpath("w.safetensors"), names, &a, 1, meta, 1) == ZR_OK);
    FILE *fp = fopen(tpath("w.safetensors"), "rb");
    unsigned char got[256];
    size_t n = fp ? fread(got, 1, sizeof got, fp) : 0;
    if (fp) fclose(fp);
    CHECK_MSG(n == total, "file is %zu bytes, expected %zu", n, total);
    CHECK(memcmp(got, expect, total) == 0);
    zr_tensor_release(a);
}

TEST(round_trip_every_dtype) {
    /* Awkward shapes; bf16/f16 as raw bit patterns (NaN payload, -0, subnormal, inf) must survive
     * bit-exactly. */
    int64_t s37[2] = {3, 7}, s5[1] = {5}, s1[3] = {1, 1, 1};
    uint16_t bf_bits[5] = {0x7FC1, 0x8000, 0x0001, 0xFF80, 0x3F81};
    uint16_t f16_bits[5] = {0x7E01, 0x8000, 0x0001, 0x7C00, 0x3C01};
    zr_tensor *ts[9];
    ts[0] = zr_tensor_from_data(ZR_BF16, 1, s5, bf_bits);
    ts[1] = zr_tensor_from_data(ZR_F16, 1, s5, f16_bits);
    ts[2] = zr_tensor_new(ZR_F32, zr_cpu(), 2, s37);
    ts[3] = zr_tensor_new(ZR_F64, zr_cpu(), 2, s37);
    ts[4] = zr_tensor_new(ZR_I32, zr_cpu(), 1, s5);
    ts[5] = zr_tensor_new(ZR_I64, zr_cpu(), 1, s5);
    ts[6] = zr_tensor_new(ZR_U8, zr_cpu(), 3, s1);
    ts[7] = zr_tensor_scalar(3.25, ZR_F64, zr_cpu()); /* 0-dim */
    int64_t s0[3] = {3, 0, 2};
    ts[8] = zr_tensor_new(ZR_F32, zr_cpu(), 3, s0); /* empty */
    for (int i = 0; i < 21; i++) {
        ((float *)zr_tensor_data(ts[2]))[i] = (float)i * 0.37f - 3.1f;
        ((double *)zr_tensor_data(ts[3]))[i] = 1.0 / (i + 1.0);
    }
    for (int i = 0; i < 5; i++) {
        ((int32_t *)zr_tensor_data(ts[4]))[i] = i == 0 ? INT32_MIN : i * 1000003;
        ((int64_t *)zr_tensor_data(ts[5]))[i] = i == 0 ? INT64_MAX : -(int64_t)i * 9007199254740993LL;
    }
    ((uint8_t *)zr_tensor_data(ts[6]))[0] = 201;
    const char *names[9] = {"bf", "h", "f", "d", "i", "l", "u", "scalar", "empty"};
    CHECK_MSG(zr_safetensors_write(tpath("rt.safetensors"), names, ts, 9, NULL, 0) == ZR_OK, "%s", zr_last_error());
    zr_safetensors *f = zr_safetensors_open(tpath("rt.safetensors"));
    CHECK_MSG(f, "%s", zr_last_error());
    if (!f) return;
    CHECK(zr_safetensors_metadata_count(f) == 0);
    for (int i = 0; i < 9; i++) {
        zr_tensor *t = zr_safetensors_get(f, names[i], -1, zr_cpu());
        CHECK_MSG(t, "%s: %s", names[i], zr_last_error());
        if (!t) continue;
        CHECK_MSG(t->dtype == ts[i]->dtype && t->ndim == ts[i]->ndim, "%s: dtype/ndim", names[i]);
        for (int d = 0; d < t->ndim; d++) CHECK(t->shape[d] == ts[i]->shape[d]);
        size_t nb = (size_t)zr_tensor_numel(t) * zr_dtype_size(t->dtype);
        CHECK_MSG(nb == 0 || memcmp(zr_tensor_data(t), zr_tensor_data(ts[i]), nb) == 0, "%s: bytes differ", names[i]);
        zr_tensor_release(t);
    }
    /* Layout: widest dtype first, then by name; every tensor naturally aligned in the file. */
    const zr_safetensors_entry *el = zr_safetensors_find(f, "l"), *ed = zr_safetensors_find(f, "d"),
                               *ebf = zr_safetensors_find(f, "bf"), *eu = zr_safetensors_find(f, "u"),
                               *ef = zr_safetensors_find(f, "f");
    CHECK(el->begin < ed->begin); /* I64 comes after F64 in the enum, so before it when descending */
    CHECK(ef->begin > ed->begin && ebf->begin > ef->begin && eu->begin > ebf->begin);
    for (int64_t i = 0; i < zr_safetensors_count(f); i++) {
        const zr_safetensors_entry *e = zr_safetensors_entry_at(f, i);
        CHECK_MSG(e->begin % (int64_t)zr_st_dtype_size(e->st_dtype) == 0, "%s misaligned", e->name);
    }
    zr_safetensors_close(f);
    for (int i = 0; i < 9; i++) zr_tensor_release(ts[i]);
}

TEST(noncontiguous_tensor_written_in_logical_order) {
    int64_t s[2] = {2, 3};
    float v[6] = {0, 1, 2, 3, 4, 5};
    zr_tensor *a = zr_tensor_from_data(ZR_F32, 2, s, v);
    zr_tensor *at = zr_tensor_transpose_raw(a, 0, 1); /* (3,2): 0 3 1 4 2 5 */
    const char *names[] = {"t"};
    CHECK(zr_safetensors_write(tpath("nc.safetensors"), names, &at, 1, NULL, 0) == ZR_OK);
    zr_safetensors *f = zr_safetensors_open(tpath("nc.safetensors"));
    zr_tensor *t = f ? zr_safetensors_get(f, "t", -1, zr_cpu()) : NULL;
    const float want[6] = {0, 3, 1, 4, 2, 5};
    CHECK(t && t->shape[0] == 3 && memcmp(zr_tensor_data(t), want, sizeof want) == 0);
    zr_tensor_release(t);
    zr_safetensors_close(f);
    zr_tensor_release(at);
    zr_tensor_release(a);
}

static const char *GOOD_ENTRY = "\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}";

TEST(corrupt_files_give_specific_errors) {
    unsigned char data[64] = {0};
    char hdr[512];
    /* file shorter than the length prefix */
    FILE *fp = fopen(tpath("short.safetensors"), "wb");
    fwrite("abc", 1, 3, fp);
    fclose(fp);
    CHECK(open_fails_with(tpath("short.safetensors"), "the file is only 3 bytes"));
    /* header length past EOF */
    fp = fopen(tpath("hlen.safetensors"), "wb");
    uint64_t big = 1000;
    fwrite(&big, 8, 1, fp);
    fwrite("{\"a\":1}", 1, 7, fp);
    fclose(fp);
    CHECK(open_fails_with(tpath("hlen.safetensors"), "header length 1000 is past the end of the file (15 bytes)"));
    /* absurd header length (not a safetensors file at all) */
    fp = fopen(tpath("huge.safetensors"), "wb");
    fwrite("PK\3\4garbage-zip-file", 1, 20, fp);
    fclose(fp);
    CHECK(open_fails_with(tpath("huge.safetensors"), "limit; this is not a safetensors file"));
    /* bad JSON */
    snprintf(hdr, sizeof hdr, "{%s,\"b\":{\"dtype\":\"F32\" \"shape\":[1]}}", GOOD_ENTRY);
    write_raw(tpath("json.safetensors"), hdr, 0, data, 12);
    CHECK(open_fails_with(tpath("json.safetensors"), "the header is not valid JSON"));
    /* truncated data: last tensor ends past the end of the file */
    snprintf(hdr, sizeof hdr, "{%s,\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[12,28]}}", GOOD_ENTRY);
    write_raw(tpath("trunc.safetensors"), hdr, 0, data, 20);
    CHECK(open_fails_with(tpath("trunc.safetensors"), "tensor 'lm_head.weight': data_offsets end 28"));
    CHECK(open_fails_with(tpath("trunc.safetensors"), "the file looks truncated"));
    CHECK(strstr(zr_last_error_message(), "trunc.safetensors: ") == zr_last_error_message() + strlen(tmpdir) + 1);
    /* overlapping offsets */
    snprintf(hdr, sizeof hdr, "{%s,\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", GOOD_ENTRY);
    write_raw(tpath("overlap.safetensors"), hdr, 0, data, 16);
    CHECK(open_fails_with(tpath("overlap.safetensors"), "tensors 'a' [0, 12] and 'b' [8, 16] overlap"));
    /* wrong byte count */
    snprintf(hdr, sizeof hdr, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}");
    write_raw(tpath("count.safetensors"), hdr, 0, data, 8);
    CHECK(open_fails_with(tpath("count.safetensors"), "tensor 'a': data_offsets [0, 8] hold 8 bytes, but F32 (3) needs 12"));
    /* unknown dtype */
    snprintf(hdr, sizeof hdr, "{\"q\":{\"dtype\":\"F8_E4M3\",\"shape\":[3],\"data_offsets\":[0,3]}}");
    write_raw(tpath("dtype.safetensors"), hdr, 0, data, 3);
    CHECK(open_fails_with(tpath("dtype.safetensors"), "tensor 'q': dtype 'F8_E4M3' is not supported"));
    /* duplicate names */
    snprintf(hdr, sizeof hdr, "{%s,%s}", GOOD_ENTRY, GOOD_ENTRY);
    write_raw(tpath("dup.safetensors"), hdr, 0, data, 12);
    CHECK(open_fails_with(tpath("dup.safetensors"), "tensor 'a' appears twice"));
    /* missing field, negative shape, non-string metadata, not an object */
    snprintf(hdr, sizeof hdr, "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,12]}}");
    write_raw(tpath("miss.safetensors"), hdr, 0, data, 12);
    CHECK(open_fails_with(tpath("miss.safetensors"), "tensor 'a': missing \"shape\""));
    snprintf(hdr, sizeof hdr, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-3],\"data_offsets\":[0,12]}}");
    write_raw(tpath("neg.safetensors"), hdr, 0, data, 12);
    CHECK(open_fails_with(tpath("neg.safetensors"), "\"shape\" entry 1 must be a non-negative integer"));
    snprintf(hdr, sizeof hdr, "{\"__metadata__\":{\"step\":3},%s}", GOOD_ENTRY);
    write_raw(tpath("meta.safetensors"), hdr, 0, data, 12);
    CHECK(open_fails_with(tpath("meta.safetensors"), "\"__metadata__\" value of 'step' must be a string"));
    write_raw(tpath("arr.safetensors"), "[1,2]", 0, data, 0);
    CHECK(open_fails_with(tpath("arr.safetensors"), "does not start with '{'"));
    CHECK(open_fails_with(tpath("no_such_file.safetensors"), "cannot open"));
    CHECK(open_fails_with(tmpdir, "is a directory"));
}

TEST(refuses_what_the_rust_library_refuses) {
    /* Each of these opened before (issue 16): numbers that are integral but not written as
     * integers, data sections with gaps or trailing bytes, NUL in names. 1e400 is the UBSan case
     * (a double converted to int64 before its range check). */
    unsigned char data[64] = {0};
    char hdr[512];
    static const struct {
        const char *shape, *offsets, *want;
    } nums[] = {
        {"[2e0]", "[0,8]", "\"shape\" entry 1 must be a non-negative integer, got a number with a fraction or exponent"},
        {"[3.0]", "[0,12]", "\"shape\" entry 1 must be a non-negative integer, got a number with a fraction"},
        {"[3]", "[0,1.2e1]", "\"data_offsets\" entry 2 must be a non-negative integer, got a number with a fraction"},
        {"[1e400]", "[0,12]", "\"shape\" entry 1 must be a non-negative integer, got a fractional or too large number"},
        {"[-1e400]", "[0,12]", "\"shape\" entry 1 must be a non-negative integer, got a negative number"},
        {"[3]", "[0,99999999999999999999]", "\"data_offsets\" entry 2 must be a non-negative integer, got a fractional or too large"},
        {"[1.5]", "[0,12]", "got a fractional or too large number"},
    };
    for (size_t i = 0; i < sizeof nums / sizeof *nums; i++) {
        snprintf(hdr, sizeof hdr, "{\"a\":{\"dtype\":\"F32\",\"shape\":%s,\"data_offsets\":%s}}", nums[i].shape,
                 nums[i].offsets);
        write_raw(tpath("num.safetensors"), hdr, 0, data, 12);
        CHECK_MSG(open_fails_with(tpath("num.safetensors"), nums[i].want), "shape %s offsets %s", nums[i].shape,
                  nums[i].offsets);
    }
    /* a gap between two tensors, a gap before the first, trailing bytes, and the exact file */
    snprintf(hdr, sizeof hdr, "{%s,\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[16,20]}}", GOOD_ENTRY);
    write_raw(tpath("gap.safetensors"), hdr, 0, data, 20);
    CHECK(open_fails_with(tpath("gap.safetensors"), "tensor 'b' begins at byte 16 of the data section but 'a' ends at 12: a gap of 4 bytes"));
    snprintf(hdr, sizeof hdr, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[4,16]}}");
    write_raw(tpath("gap0.safetensors"), hdr, 0, data, 16);
    CHECK(open_fails_with(tpath("gap0.safetensors"), "the first tensor, 'a', begins at byte 4 of the data section, not 0"));
    snprintf(hdr, sizeof hdr, "{%s}", GOOD_ENTRY);
    write_raw(tpath("trail.safetensors"), hdr, 0, data, 13);
    CHECK(open_fails_with(tpath("trail.safetensors"), "the tensors end at byte 12 of the data section, but it holds 13 bytes: 1 trailing"));
    write_raw(tpath("none.safetensors"), "{}", 6, data, 4);
    CHECK(open_fails_with(tpath("none.safetensors"), "the tensors end at byte 0 of the data section, but it holds 4 bytes"));
    write_raw(tpath("exact.safetensors"), hdr, 5, data, 12);
    zr_safetensors *f = zr_safetensors_open(tpath("exact.safetensors"));
    CHECK_MSG(f, "%s", zr_last_error());
    zr_safetensors_close(f);
    /* empty tensors anywhere in the sequence are fine; one past the end is not */
    snprintf(hdr, sizeof hdr, "{\"e0\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},%s,"
                              "\"e1\":{\"dtype\":\"BF16\",\"shape\":[2,0],\"data_offsets\":[12,12]}}", GOOD_ENTRY);
    write_raw(tpath("empties.safetensors"), hdr, 0, data, 12);
    f = zr_safetensors_open(tpath("empties.safetensors"));
    CHECK_MSG(f && zr_safetensors_count(f) == 3, "%s", zr_last_error());
    zr_safetensors_close(f);
    snprintf(hdr, sizeof hdr, "{%s,\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[13,13]}}", GOOD_ENTRY);
    write_raw(tpath("empty_gap.safetensors"), hdr, 0, data, 13);
    CHECK(open_fails_with(tpath("empty_gap.safetensors"), "tensor 'e' begins at byte 13"));
    /* NUL inside a tensor name (would alias 'a') and inside metadata */
    snprintf(hdr, sizeof hdr, "{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}");
    write_raw(tpath("nul.safetensors"), hdr, 0, data, 12);
    CHECK(open_fails_with(tpath("nul.safetensors"), "tensor name 'a\\u0000...' holds a NUL character"));
    snprintf(hdr, sizeof hdr, "{\"__metadata__\":{\"k\":\"v\\u0000w\"},%s}", GOOD_ENTRY);
    write_raw(tpath("nulmeta.safetensors"), hdr, 0, data, 12);
    CHECK(open_fails_with(tpath("nulmeta.safetensors"), "\"__metadata__\" key 'k' or its value holds a NUL"));
}

static int stream_calls[8], n_stream_calls;
static zr_tensor *stream_get(void *ctx, int64_t i) {
    stream_calls[n_stream_calls++] = (int)i;
    if (ctx && i == 1) return zr_error_null("simulated failure");
    int64_t s[1] = {3};
    return zr_tensor_full(i == 0 ? ZR_BF16 : ZR_F32, zr_cpu(), 1, s, (double)i + 0.5);
}

TEST(atomic_write_leaves_no_temp_file) {
    int before = count_dir_entries();
    int64_t s[1] = {4};
    zr_tensor *a = zr_tensor_full(ZR_F32, zr_cpu(), 1, s, 7);
    const char *names[] = {"a"};
    CHECK(zr_safetensors_write(tpath("atomic.safetensors"), names, &a, 1, NULL, 0) == ZR_OK);
    CHECK(count_dir_entries() == before + 1 && !dir_has_tmp());
    /* overwrite in place */
    CHECK(zr_safetensors_write(tpath("atomic.safetensors"), names, &a, 1, NULL, 0) == ZR_OK);
    CHECK(count_dir_entries() == before + 1 && !dir_has_tmp());
    /* a failure mid-write leaves the old file intact and no temp file */
    zr_safetensors_spec sp[2] = {{"x", ZR_BF16, 1, {3}}, {"y", ZR_F32, 1, {3}}};
    n_stream_calls = 0;
    CHECK(zr_safetensors_write_stream(tpath("atomic.safetensors"), sp, 2, stream_get, (void *)1, NULL, 0) != ZR_OK);
    CHECK(strstr(zr_last_error_message(), "simulated failure"));
    CHECK(!dir_has_tmp());
    zr_safetensors *f = zr_safetensors_open(tpath("atomic.safetensors"));
    CHECK(f && zr_safetensors_find(f, "a") && !zr_safetensors_find(f, "x"));
    zr_safetensors_close(f);
    /* streaming success: F32 'y' is written before BF16 'x' (wider first) */
    n_stream_calls = 0;
    CHECK(zr_safetensors_write_stream(tpath("stream.safetensors"), sp, 2, stream_get, NULL, NULL, 0) == ZR_OK);
    CHECK(n_stream_calls == 2 && stream_calls[0] == 1 && stream_calls[1] == 0);
    f = zr_safetensors_open(tpath("stream.safetensors"));
    zr_tensor *x = f ? zr_safetensors_get(f, "x", ZR_F32, zr_cpu()) : NULL;
    CHECK(x && ((float *)zr_tensor_data(x))[2] == 0.5f);
    zr_tensor_release(x);
    zr_safetensors_close(f);
    /* a directory that does not exist: clear error, nothing created */
    CHECK(zr_safetensors_write(tpath("nodir/a.safetensors"), names, &a, 1, NULL, 0) != ZR_OK);
    CHECK(strstr(zr_last_error_message(), "cannot create the temporary file"));
    /* bad names */
    const char *dup[2] = {"a", "a"};
    zr_tensor *two[2] = {a, a};
    CHECK(zr_safetensors_write(tpath("dup2.safetensors"), dup, two, 2, NULL, 0) != ZR_OK);
    CHECK(strstr(zr_last_error_message(), "tensor name 'a' given twice"));
    const char *reserved[1] = {"__metadata__"};
    CHECK(zr_safetensors_write(tpath("dup2.safetensors"), reserved, &a, 1, NULL, 0) != ZR_OK);
    CHECK(!dir_has_tmp());
    CHECK(zr_file_write_atomic(tpath("plain.txt"), "hello", 5) == ZR_OK && !dir_has_tmp());
    zr_tensor_release(a);
}

/* A view of raw tensors at file offsets (zr_safetensors_open_view, as torch_file.lua opens a
 * pytorch_model.bin): overlapping entries share bytes, values read back, anything past the end
 * of the file, a shape whose byte count overflows and a name given twice are refused. */
TEST(view_of_raw_tensors) {
    const char *p = tpath("raw.bin");
    float vals[6] = {1, 2, 3, 4, 5, 6};
    FILE *f = fopen(p, "wb");
    fwrite("PAD!", 1, 4, f);
    fwrite(vals, sizeof vals[0], 6, f);
    fclose(f);
    zr_safetensors_view_entry v[2] = {{"all", ZR_ST_F32, 2, {2, 3}, 4}, {"tail", ZR_ST_F32, 1, {2}, 4 + 16}};
    zr_safetensors *st = zr_safetensors_open_view(p, v, 2);
    CHECK(st != NULL);
    if (!st) return;
    CHECK(zr_safetensors_count(st) == 2);
    zr_tensor *a = zr_safetensors_get(st, "all", -1, zr_cpu()), *t = zr_safetensors_get(st, "tail", -1, zr_cpu());
    CHECK(a && t && a->shape[0] == 2 && a->shape[1] == 3);
    if (a && t) {
        const float *x = zr_tensor_data(a), *y = zr_tensor_data(t);
        CHECK(x[0] == 1 && x[5] == 6 && y[0] == 5 && y[1] == 6);
    }
    zr_tensor_release(a);
    zr_tensor_release(t);
    zr_safetensors_close(st);
    zr_safetensors_view_entry past = {"past", ZR_ST_F32, 1, {6}, 8};
    CHECK(zr_safetensors_open_view(p, &past, 1) == NULL && strstr(zr_last_error_message(), "lies past the end"));
    zr_safetensors_view_entry huge = {"huge", ZR_ST_F64, 2, {INT64_MAX / 4, 3}, 0};
    CHECK(zr_safetensors_open_view(p, &huge, 1) == NULL && strstr(zr_last_error_message(), "lies past the end"));
    zr_safetensors_view_entry neg = {"neg", ZR_ST_F32, 1, {1}, -4};
    CHECK(zr_safetensors_open_view(p, &neg, 1) == NULL);
    zr_safetensors_view_entry twice[2] = {{"x", ZR_ST_F32, 1, {1}, 4}, {"x", ZR_ST_F32, 1, {1}, 8}};
    CHECK(zr_safetensors_open_view(p, twice, 2) == NULL && strstr(zr_last_error_message(), "named twice"));
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/zr_st_test_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        printf("FAIL setup: mkdtemp\n");
        return 1;
    }
    RUN(hand_written_file);
    RUN(writer_bytes_match_format);
    RUN(round_trip_every_dtype);
    RUN(noncontiguous_tensor_written_in_logical_order);
    RUN(corrupt_files_give_specific_errors);
    RUN(refuses_what_the_rust_library_refuses);
    RUN(atomic_write_leaves_no_temp_file);
    RUN(view_of_raw_tensors);
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') unlink(tpath(e->d_name));
    if (d) closedir(d);
    rmdir(tmpdir);
    return test_summary();
}
