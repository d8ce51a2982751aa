/* Element types and devices. bf16/f16 are stored as uint16_t bit patterns; on the CPU they are
 * widened to f32 for compute (round-to-nearest-even when narrowed back). */
#ifndef ZR_DTYPE_H
#define ZR_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum {
    ZR_F32 = 0,
    ZR_BF16,
    ZR_F16,
    ZR_F64,
    ZR_I32,
    ZR_I64,
    ZR_U8,
    ZR_NDTYPES
} zr_dtype;

typedef enum { ZR_CPU = 0, ZR_CUDA = 1 } zr_device_type;

typedef struct {
    int8_t type;  /* zr_device_type */
    int8_t index; /* CUDA ordinal; 0 for the CPU */
} zr_device;

#define ZR_MAX_DEVICES 17 /* slot 0: cpu; slots 1..16: cuda:0..15 */
static inline zr_device zr_cpu(void) { return (zr_device){ZR_CPU, 0}; }
static inline int zr_device_slot(zr_device d) { return d.type == ZR_CPU ? 0 : 1 + d.index; }
static inline int zr_device_eq(zr_device a, zr_device b) {
    return a.type == b.type && a.index == b.index;
}
/* "cpu", "cuda:0"; buf must hold 16 bytes. */
const char *zr_device_name(zr_device d, char *buf);

size_t zr_dtype_size(zr_dtype t);
const char *zr_dtype_name(zr_dtype t);
/* Accepts "f32"/"float32"/"float", "bf16"/"bfloat16", "f16"/"float16"/"half", "f64"/"float64"/
 * "double", "i32"/"int32", "i64"/"int64"/"long", "u8"/"uint8". Returns -1 if unknown. */
int zr_dtype_parse(const char *s);
static inline int zr_dtype_is_float(zr_dtype t) { return t <= ZR_F64; }

static inline float zr_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t zr_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                       /* round to nearest even */
    return (uint16_t)(u >> 16);
}
float zr_f16_to_f32(uint16_t h);
uint16_t zr_f32_to_f16(float f);

#endif
