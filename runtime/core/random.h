/* The global random generator: a seed and an offset into the Philox stream. Every fill advances
 * the offset by ceil(numel/4), so CPU and CUDA fills in the same order give the same numbers. */
#ifndef ZR_RANDOM_H
#define ZR_RANDOM_H

#include "core/tensor.h"

void zr_manual_seed(uint64_t seed);
void zr_random_get_state(uint64_t *seed, uint64_t *offset);
void zr_random_set_state(uint64_t seed, uint64_t offset);
/* Reserves the counters for n elements and returns the starting offset. */
uint64_t zr_random_reserve(int64_t n);

zr_status zr_tensor_uniform_(zr_tensor *t, double lo, double hi);
zr_status zr_tensor_normal_(zr_tensor *t, double mean, double std);
/* Fills u8 t with 1 with probability keep (dropout masks). */
zr_status zr_tensor_bernoulli_(zr_tensor *t, double keep);

/* Fisher-Yates permutation of 0..n-1 into out, from a Philox stream keyed by seed alone
 * (independent of the global generator), so every rank computes the same order. */
void zr_randperm(int64_t n, uint64_t seed, int64_t *out);
/* torch.randperm(n) with a CPU generator seeded `seed` (MT19937): the same permutation torch gives. */
void zr_randperm_torch(int64_t n, uint64_t seed, int64_t *out);
/* numpy.random.default_rng(seed).permutation(n) (SeedSequence, PCG64): the order Hugging Face datasets'
 * shuffle(seed=) and train_test_split(seed=) give. */
void zr_randperm_numpy(int64_t n, uint64_t seed, int64_t *out);

/* Installed by the CUDA backend: fill a contiguous device tensor (kind 0 uniform, 1 normal,
 * 2 bernoulli) from (seed, offset). */
typedef zr_status (*zr_device_random_fn)(zr_tensor *t, int kind, double a, double b, uint64_t seed,
                                         uint64_t offset);
void zr_random_set_device_fill(zr_device_random_fn fn);

#endif
