/* A fast non-cryptographic hash of a byte string (8 bytes per round, multiply-xorshift mixing),
 * for the open-addressing tables of the JSON parser and the tokenizers. */
#ifndef ZR_HASH_H
#define ZR_HASH_H

#include <stdint.h>
#include <string.h>

static inline uint64_t zr_hash_bytes(const char *s, int64_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ ((uint64_t)n * 0x100000001B3ull);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    uint64_t w = 0;
    memcpy(&w, s + i, (size_t)(n - i));
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 29);
}

#endif
