/* Where the parts of a fused q/k/v projection lie, shared by the CPU and CUDA qkv_rope kernels:
 * the packed product and the q, k, v heads it is split into, as element strides. Plain C. */
#ifndef ZR_BASE_QKV_LAYOUT_H
#define ZR_BASE_QKV_LAYOUT_H

#include <stdint.h>

/* packed: (B, T, (H + 2 KV)·Dh), element (b, t, j·Dh + d) at b*sb + t*st + j*Dh + d: q heads
 * j < H, then k heads, then v heads. q (B, H, T, Dh), k and v (B, KV, T, Dh): element
 * (b, h, t, d) at b*part[i][0] + h*part[i][1] + t*part[i][2] + d (the last dim contiguous). */
typedef struct {
    int64_t sb, st;
    int64_t part[3][3];
} zr_qkv_layout;

#endif
