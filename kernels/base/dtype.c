/* dtype names, sizes and IEEE half conversion (bf16 conversion is inline in dtype.h), device
 * names. Parsing a device name needs the current CUDA device: runtime/cuda/device.c. */
#include "dtype.h"

#include <stdio.h>
#include <stdlib.h>

static const struct {
    const char *name;
    size_t size;
} info[ZR_NDTYPES] = {
    [ZR_F32] = {"f32", 4}, [ZR_BF16] = {"bf16", 2}, [ZR_F16] = {"f16", 2}, [ZR_F64] = {"f64", 8},
    [ZR_I32] = {"i32", 4}, [ZR_I64] = {"i64", 8},   [ZR_U8] = {"u8", 1},
};

size_t zr_dtype_size(zr_dtype t) { return (unsigned)t < ZR_NDTYPES ? info[t].size : 0; }
const char *zr_dtype_name(zr_dtype t) { return (unsigned)t < ZR_NDTYPES ? info[t].name : "?"; }

int zr_dtype_parse(const char *s) {
    static const struct {
        const char *s;
        zr_dtype t;
    } names[] = {{"f32", ZR_F32},     {"float32", ZR_F32},  {"float", ZR_F32},    {"bf16", ZR_BF16},
                 {"bfloat16", ZR_BF16}, {"f16", ZR_F16},    {"float16", ZR_F16},  {"half", ZR_F16},
                 {"fp16", ZR_F16},    {"fp32", ZR_F32},     {"f64", ZR_F64},      {"float64", ZR_F64},
                 {"double", ZR_F64},  {"i32", ZR_I32},      {"int32", ZR_I32},    {"int", ZR_I32},
                 {"i64", ZR_I64},     {"int64", ZR_I64},    {"long", ZR_I64},     {"u8", ZR_U8},
                 {"uint8", ZR_U8},    {"bool", ZR_U8}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].s) == 0) return names[i].t;
    return -1;
}

const char *zr_device_name(zr_device d, char *buf) {
    if (d.type == ZR_CPU) snprintf(buf, 16, "cpu");
    else snprintf(buf, 16, "cuda:%d", d.index);
    return buf;
}

/* IEEE binary16 <-> binary32, round to nearest even, with subnormals, inf and NaN. */
float zr_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) u = sign;
        else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            u = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) u = sign | 0x7f800000u | (man << 13);
    else u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t zr_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int32_t exp = (int32_t)((u >> 23) & 0xff);
    uint32_t man = u & 0x7fffff;
    if (exp == 255) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    int32_t e = exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00);
    if (e <= 0) {
        if (e < -10) return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++; /* carry may roll into exponent: ok */
    return (uint16_t)half;
}
