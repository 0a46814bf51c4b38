/* gpu_pattern.h — the byte pattern of the GPU checks, one definition for the nvcc kernel
 * (fill.cu), the fake driver's kernel (fake_cuda.c) and the host-side verifier (gpu_check.c):
 * byte o of a seed's pattern is a byte of a splitmix64 output of the word index o / 8, so any
 * range can be filled or checked on its own, in parallel, and a byte placed at the wrong offset
 * is caught. */
#ifndef BATON_GPU_PATTERN_H
#define BATON_GPU_PATTERN_H

#include <stdint.h>

#ifdef __CUDACC__
#define GPU_PATTERN_FN __host__ __device__ static inline
#else
#define GPU_PATTERN_FN static inline
#endif

GPU_PATTERN_FN uint64_t gpu_pattern_word(uint64_t seed, uint64_t word)
{
    uint64_t z = seed + (word + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

GPU_PATTERN_FN uint8_t gpu_pattern_byte(uint64_t seed, uint64_t off)
{
    return (uint8_t)(gpu_pattern_word(seed, off >> 3) >> ((off & 7) * 8));
}

/* The kernel's name and parameters (cuLaunchKernel's order): fills [dst, dst+len) with the
 * pattern bytes at offsets [off, off+len) after spinning delay_ns on the GPU. */
#define GPU_FILL_KERNEL "baton_gpu_fill"

#endif
