/* xfer/baseline.c — the memcpy baseline of baton-xfer-bench: one thread copying the same pages
 * (same sizes, same source offsets, same destination pool shape) that the shm transport copies. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "xbench.h"

/*
 * What is compared. The shm transport's writer copies each page from the prefill's source into
 * the decode's memfd pages, mapped MAP_SHARED in its own process, on one thread (the engine's
 * progress thread). The baseline does the same copies with the same page-aligned source offsets,
 * into a memfd pool of the same shape (window slots of room_bytes), already touched; so the
 * ratio shm / memcpy is the engine's overhead (control messages, slicing, fence flag, hand-offs
 * between threads and processes), not a cache or page-fault effect.
 *
 * Two ways of copying a page are timed: one memcpy per page ("whole") and the page in
 * slice-sized steps ("steps", the engine's slice, 64 KiB by default — what the shm writer does).
 * glibc picks its copy loop by size (rep movsb up to 1 MiB on this kind of CPU, a vector loop
 * above), and the two can differ by 10-40%; the baseline is the faster of the two, so the
 * engine is compared with the best one thread does here.
 *
 * first_touch: the same copies into a memfd mapped just before, never touched: each new 4 KiB
 * page costs a fault plus zeroing. A decode server touches its KV pool once at start, so the
 * transfer runs measure the warm case; this figure shows what a cold pool would cost.
 */

static void *memfd_map(size_t len)
{
    int fd = memfd_create("xfer-bench-baseline", MFD_CLOEXEC);
    if (fd < 0)
        return NULL;
    if (ftruncate(fd, (off_t)len) != 0) {
        close(fd);
        return NULL;
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

/* Copies one room's pages; step 0: one memcpy per page, else in steps of `step` bytes. */
static void copy_room(const xb_opts_t *o, const xb_case_t *c, const uint8_t *src, uint8_t *dst,
                      uint64_t room, uint64_t step)
{
    for (uint32_t l = 0; l < c->n_layers; l++) {
        for (uint32_t j = 0; j < c->ppl; j++) {
            uint8_t *d = dst + ((size_t)l * c->ppl + j) * c->page_len;
            const uint8_t *s = src + xb_src_offset(room, l, j, o->src_bytes, c->page_len);
            if (step == 0 || step >= c->page_len) {
                memcpy(d, s, c->page_len);
                continue;
            }
            for (uint64_t off = 0; off < c->page_len; off += step)
                memcpy(d + off, s + off, c->page_len - off < step ? c->page_len - off : step);
        }
    }
}

typedef struct {
    double median, min, max;
    double cpu_s_per_gb; /* this thread's CPU time per GB copied, all runs */
} gbps_t;

static double thread_cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* `runs` timed runs copying rooms round robin into the pool (kv: one room per run). */
static gbps_t timed_runs(const xb_opts_t *o, const xb_case_t *c, const uint8_t *src, uint8_t *pool,
                         uint64_t *room, uint64_t step, double *g, uint32_t runs)
{
    int is_kv = strcmp(c->kind, "kv") == 0;
    double cpu0 = thread_cpu_s(), total = 0;
    for (uint32_t r = 0; r < runs; r++) {
        uint64_t t0 = xb_now_ns(), deadline = t0 + (uint64_t)o->run_ms * 1000000ull;
        uint64_t bytes = 0, n = 0;
        uint64_t min_rooms = is_kv ? 1 : c->window;
        uint64_t max_rooms = is_kv ? 1 : UINT64_MAX;
        while (n < max_rooms &&
               (n < min_rooms || (bytes < o->run_bytes && xb_now_ns() < deadline))) {
            copy_room(o, c, src, pool + (size_t)(n % c->window) * c->room_bytes, (*room)++, step);
            bytes += c->room_bytes;
            n++;
        }
        double s = (double)(xb_now_ns() - t0) / 1e9;
        g[r] = s > 0 ? (double)bytes / s / 1e9 : 0;
        total += (double)bytes;
    }
    /* CPU time, unlike wall time, does not grow when other processes take the CPU away. */
    gbps_t res = {0, g[0], g[0], total > 0 ? (thread_cpu_s() - cpu0) / (total / 1e9) : 0};
    for (uint32_t r = 1; r < runs; r++) {
        res.min = g[r] < res.min ? g[r] : res.min;
        res.max = g[r] > res.max ? g[r] : res.max;
    }
    res.median = xb_median(g, runs);
    return res;
}

int xb_memcpy_baseline(const xb_opts_t *o, const xb_case_t *cases, int n_cases, const uint8_t *src,
                       json_t *out)
{
    uint64_t room = 1;
    uint64_t step = o->slice ? o->slice : 65536;
    for (int ci = 0; ci < n_cases; ci++) {
        const xb_case_t *c = &cases[ci];
        int is_kv = strcmp(c->kind, "kv") == 0;
        size_t pool_len = (size_t)c->window * c->room_bytes;
        uint8_t *pool = memfd_map(pool_len);
        if (pool == NULL) {
            json_array_append_new(
                out, json_pack("{s:s, s:s}", "case", c->name, "error", strerror(errno)));
            continue;
        }
        memset(pool, XFER_POISON, pool_len);
        uint32_t runs = is_kv ? o->kv_runs : o->runs;
        double *g = calloc(runs, sizeof(double));
        if (g == NULL) {
            munmap(pool, pool_len);
            return 1;
        }
        /* warm-up: one pass over the pool */
        for (uint32_t s = 0; s < c->window; s++)
            copy_room(o, c, src, pool + (size_t)s * c->room_bytes, room++, 0);
        gbps_t whole = timed_runs(o, c, src, pool, &room, 0, g, runs);
        gbps_t steps = whole;
        if (step < c->page_len)
            steps = timed_runs(o, c, src, pool, &room, step, g, runs);
        int use_steps = steps.median > whole.median;
        gbps_t best = use_steps ? steps : whole;
        munmap(pool, pool_len);
        free(g);

        /* First touch: a fresh memfd of at least 64 MiB (at most 1 GiB), filled once. */
        uint64_t ft_len = pool_len < (64u << 20) ? (64u << 20) : pool_len;
        if (ft_len > (1ull << 30))
            ft_len = 1ull << 30;
        uint64_t ft_rooms = ft_len / c->room_bytes;
        if (ft_rooms == 0)
            ft_rooms = 1;
        ft_len = ft_rooms * c->room_bytes;
        double ft = -1;
        uint8_t *fresh = memfd_map(ft_len);
        if (fresh != NULL) {
            uint64_t t0 = xb_now_ns();
            for (uint64_t i = 0; i < ft_rooms; i++)
                copy_room(o, c, src, fresh + i * c->room_bytes, room++, use_steps ? step : 0);
            double s = (double)(xb_now_ns() - t0) / 1e9;
            ft = s > 0 ? (double)ft_len / s / 1e9 : 0;
            munmap(fresh, ft_len);
        }
        json_t *j = json_pack(
            "{s:s, s:s, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:I, s:s, s:f}", "case", c->name, "kind",
            c->kind, "room_bytes", (json_int_t)c->room_bytes, "page_bytes", (json_int_t)c->page_len,
            "gbps", best.median, "gbps_min", best.min, "gbps_max", best.max, "gbps_whole",
            whole.median, "gbps_steps", steps.median, "step_bytes", (json_int_t)step, "best",
            use_steps ? "steps" : "whole", "cpu_s_per_gb", best.cpu_s_per_gb);
        json_object_set_new(j, "first_touch_gbps", ft >= 0 ? json_real(ft) : json_null());
        json_array_append_new(out, j);
        if (!o->quiet)
            fprintf(stderr, "xfer-bench: memcpy %-8s %.3f GB/s (whole pages %.3f, steps %.3f)\n",
                    c->name, best.median, whole.median, steps.median);
    }
    return 0;
}
