/* fill.cu — the GPU checks' one kernel: after delay_ns of spinning on the device it writes the
 * pattern of gpu_pattern.h into a range, so a hand-off that started before the kernel's event
 * completed would carry the poison that was there before. Built to a fat binary that
 * baton-gpu-check loads with cuModuleLoadData (no CUDA runtime). */
#include "gpu_pattern.h"

extern "C" __global__ void baton_gpu_fill(unsigned long long dst, unsigned long long len,
                                          unsigned long long off, unsigned long long seed,
                                          unsigned long long delay_ns)
{
    if (delay_ns) {
        unsigned long long t0, t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        do {
            __nanosleep(1000);
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        } while (t - t0 < delay_ns);
    }
    unsigned char *p = (unsigned char *)dst;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < len;
         i += stride)
        p[i] = gpu_pattern_byte(seed, off + i);
}
