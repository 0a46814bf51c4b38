/* gpu_check.c — baton-gpu-check: libbaton's CUDA paths against the real driver on a GPU (or
 * against tests/gpu/fake_cuda.c on a CPU rehearsal). This process is the decode side; a second
 * one (`serve`, gpu_serve.c) is the prefill side, so CUDA IPC crosses a process boundary as it
 * must. Checks: device-memory registration 4 KiB-4 GiB and deregistration, from a thread with no
 * current context too; same-GPU hand-offs over shm (CUDA IPC), layer-wise and whole-room, every
 * byte copied back and compared; device memory against tcp both ways; write_layer_after_event
 * after a real kernel; aborts from either side with device memory (fencing); rdma when a device
 * exists; bandwidth of the IPC hand-off against cuMemcpyDtoD, and of tcp from device vs host
 * memory. Prints one line per result and writes them as JSON (--out). Exit 0 all passed, 1 a
 * check failed, 77 no driver or no device (everything skipped, visibly). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "baton/transfer.h"
#include "gpu_check.h"
#include "gpu_cu.h"
#include "gpu_pattern.h"

extern char **environ;

#define KiB     ((uint64_t)1024)
#define MiB     (KiB * 1024)
#define GiB     (MiB * 1024)
#define WAIT_MS 60000

static struct {
    FILE *json;
    int n_json, failed, passed, skipped;
    uint64_t max_bytes;
    int quick;
    uint64_t seq;
    pid_t child;
    int child_in, port, port_big;
} R;

/* "4KiB", "16MiB", "1GiB" */
static const char *human(uint64_t b, char *buf, size_t cap)
{
    if (b >= GiB && b % GiB == 0)
        snprintf(buf, cap, "%" PRIu64 "GiB", b / GiB);
    else if (b >= MiB && b % MiB == 0)
        snprintf(buf, cap, "%" PRIu64 "MiB", b / MiB);
    else
        snprintf(buf, cap, "%" PRIu64 "KiB", b / KiB);
    return buf;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One result: status "pass", "fail", "skip" or "info";
 * `fields` is a JSON fragment (may be empty). */
static void result(const char *name, const char *status, const char *fields, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    printf("%-7s %-28s %s\n", status, name, msg);
    fflush(stdout);
    if (strcmp(status, "fail") == 0)
        R.failed++;
    else if (strcmp(status, "pass") == 0)
        R.passed++;
    else if (strcmp(status, "skip") == 0)
        R.skipped++;
    if (R.json) {
        fprintf(R.json, "%s\n  {\"check\": \"%s\", \"status\": \"%s\", \"detail\": \"",
                R.n_json++ ? "," : "", name, status);
        for (const char *c = msg; *c; c++)
            fputs(*c == '"' ? "\\\"" : *c == '\\' ? "\\\\" : (char[2]){*c, 0}, R.json);
        fprintf(R.json, "\"%s%s}", fields && *fields ? ", " : "", fields ? fields : "");
    }
}

/* ---- the serving process ------------------------------------------------------------------ */

static int spawn_server(const char *self, uint64_t dbytes, uint64_t hbytes, const char *tps)
{
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0)
        return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    char d[32], h[32], t[64];
    snprintf(d, sizeof(d), "%" PRIu64, dbytes);
    snprintf(h, sizeof(h), "%" PRIu64, hbytes);
    snprintf(t, sizeof(t), "%s", tps);
    char *argv[] = {"baton-gpu-check",
                    "serve",
                    "--device-bytes",
                    d,
                    "--host-bytes",
                    h,
                    "--transports",
                    t,
                    NULL};
    int rc = posix_spawn(&R.child, self, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    if (rc != 0)
        return -1;
    R.child_in = in[1];
    FILE *f = fdopen(out[0], "r");
    char line[128] = "";
    struct pollfd p = {out[0], POLLIN, 0};
    if (poll(&p, 1, 120000) != 1 || fgets(line, sizeof(line), f) == NULL ||
        sscanf(line, "port=%d port_big=%d", &R.port, &R.port_big) != 2) {
        fclose(f);
        return -1;
    }
    fclose(f);
    return 0;
}

static void stop_server(void)
{
    if (R.child <= 0)
        return;
    close(R.child_in);
    int st = 0;
    for (int i = 0; i < 200; i++) {
        if (waitpid(R.child, &st, WNOHANG) == R.child) {
            R.child = 0;
            /* a crash or a sanitizer report in the serving process fails the check too */
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
                result("serve_exit", "fail", "", "the serving process ended with status 0x%x", st);
            return;
        }
        usleep(50000);
    }
    kill(R.child, SIGKILL);
    waitpid(R.child, &st, 0);
    R.child = 0;
    result("serve_exit", "fail", "", "the serving process did not stop within 10 s");
}

/* ---- decode side ---------------------------------------------------------------------------- */

typedef struct {
    int fired, status, done_status;
    double t_end;
} offer_res_t;

static void on_offer(void *data, uint64_t room_id, int status, const baton_xfer_done_t *done)
{
    offer_res_t *o = data;
    o->fired = 1;
    o->status = status;
    o->done_status = done ? done->status : 0;
    o->t_end = now_s();
}

static int closed_engines;
static void on_closed(baton_xfer_engine_t *eng, void *data)
{
    closed_engines++;
}

static baton_xfer_engine_t *decode_engine(baton_xfer_transport_t tp, const char *id)
{
    baton_xfer_config_t cfg;
    baton_xfer_config_init(&cfg);
    cfg.engine_id = id;
    cfg.transports[0] = tp;
    cfg.n_transports = 1;
    baton_xfer_callbacks_t cbs = {NULL, NULL, NULL, NULL};
    baton_xfer_engine_t *e = NULL;
    int rc = baton_xfer_engine_create(NULL, &cfg, &cbs, &e);
    if (rc != 0) {
        fprintf(stderr, "gpu-check: decode engine %s: %s\n", id, baton_xfer_strerror(rc));
        return NULL;
    }
    baton_xfer_transport_t got[4];
    if (baton_xfer_engine_transports(e, got, 4) < 1) {
        baton_xfer_engine_destroy(e, on_closed, NULL);
        return NULL;
    }
    return e;
}

static void engine_gone(baton_xfer_engine_t *e)
{
    int want = closed_engines + 1;
    baton_xfer_engine_destroy(e, on_closed, NULL);
    while (closed_engines < want) {
        struct pollfd p = {baton_xfer_engine_fd(e), POLLIN, 0};
        poll(&p, 1, 50);
        baton_xfer_engine_dispatch(e);
    }
}

typedef struct {
    uint32_t layers, ppl;
    uint64_t page_len;
    int abort_after_ms;         /* >0: baton_xfer_abort after this long */
    baton_xfer_mem_t *busy_mem; /* deregistering it while the room is open must say EBUSY */
    int busy_seen;
} offer_opts_t;

/* Offers a room of dst pages (contiguous from dst) to the server and waits for its callback. */
static int handoff(baton_xfer_engine_t *e, int port, uint64_t room_id, void *dst, offer_opts_t *o,
                   offer_res_t *res, double *secs)
{
    size_t n = (size_t)o->layers * o->ppl;
    baton_xfer_iov_t *pages = calloc(n, sizeof(*pages));
    for (uint32_t l = 0; l < o->layers; l++)
        for (uint32_t p = 0; p < o->ppl; p++)
            pages[l * o->ppl + p] = (baton_xfer_iov_t){
                (uint8_t *)dst + page_offset(l, p, o->ppl, o->page_len), o->page_len};
    baton_xfer_offer_t offer = {room_id, o->layers, o->ppl, pages, NULL};
    memset(res, 0, sizeof(*res));
    double t0 = now_s();
    int rc = baton_xfer_offer(e, "127.0.0.1", port, &offer, on_offer, res);
    free(pages);
    if (rc != 0)
        return rc;
    if (o->busy_mem != NULL)
        o->busy_seen = baton_xfer_mem_deregister(e, o->busy_mem) == BATON_XFER_EBUSY;
    int aborted = 0;
    while (!res->fired) {
        if ((now_s() - t0) * 1000 > WAIT_MS) {
            fprintf(stderr, "gpu-check: room %016" PRIx64 " timed out\n", room_id);
            return BATON_XFER_ETIMEOUT;
        }
        if (o->abort_after_ms > 0 && !aborted && (now_s() - t0) * 1000 >= o->abort_after_ms) {
            baton_xfer_abort(e, room_id);
            aborted = 1;
        }
        struct pollfd p = {baton_xfer_engine_fd(e), POLLIN, 0};
        poll(&p, 1, 5);
        baton_xfer_engine_dispatch(e);
    }
    if (secs)
        *secs = res->t_end - t0;
    return 0;
}

/* Copies [ptr, ptr+len) to the host (device memory) and compares it with the pattern. Returns
 * the number of wrong bytes; *first the offset of the first. */
static uint64_t verify(const void *ptr, int device, uint64_t len, uint64_t *first)
{
    uint8_t *h = (uint8_t *)ptr;
    if (device) {
        h = malloc(len);
        if (h == NULL || cu.memcpy_dtoh(h, (CUdeviceptr)(uintptr_t)ptr, len) != CUDA_SUCCESS) {
            free(h);
            *first = 0;
            return len;
        }
    }
    uint64_t bad = 0;
    *first = UINT64_MAX;
    for (uint64_t i = 0; i < len; i++)
        if (h[i] != gpu_pattern_byte(GPU_SEED, i)) {
            if (bad++ == 0)
                *first = i;
        }
    if (device)
        free(h);
    return bad;
}

static void poison(void *ptr, int device, uint64_t len)
{
    if (device)
        cu.memset_d8((CUdeviceptr)(uintptr_t)ptr, POISON, len);
    else
        memset(ptr, POISON, len);
    if (device)
        cu.ctx_synchronize();
}

/* A verified hand-off: poison the destination, hand off, compare every byte. */
static void check_handoff(const char *name, baton_xfer_engine_t *e, int port, unsigned mode,
                          unsigned flags, void *dst, int dst_dev, uint32_t layers, uint32_t ppl,
                          uint64_t page_len)
{
    uint64_t total = page_offset(layers, 0, ppl, page_len);
    poison(dst, dst_dev, total);
    offer_opts_t o = {layers, ppl, page_len, 0, NULL, 0};
    offer_res_t res;
    double secs = 0;
    int rc = handoff(e, port, room_id_make(mode, flags, ++R.seq), dst, &o, &res, &secs);
    char f[256];
    snprintf(f, sizeof(f), "\"bytes\": %" PRIu64 ", \"layers\": %u, \"pages_per_layer\": %u", total,
             layers, ppl);
    int status = rc != 0 ? rc : res.status;
    if (status != 0) {
        result(name, "fail", f, "room ended %s", baton_xfer_err_name(status));
        return;
    }
    uint64_t first;
    uint64_t bad = verify(dst, dst_dev, total, &first);
    if (bad != 0 || res.done_status != 0) {
        result(name, "fail", f,
               "%" PRIu64 " wrong bytes (first at %" PRIu64 "); prefill side: %d writes failed, "
               "%d started before their event",
               bad, first, res.done_status / 1000, res.done_status % 1000);
        return;
    }
    result(name, "pass", f, "%" PRIu64 " bytes verified on the host, %.1f ms", total, secs * 1000);
}

/* ---- registration ---------------------------------------------------------------------------- */

typedef struct {
    baton_xfer_engine_t *e;
    CUdeviceptr ptr;
    size_t len;
    int had_ctx, rc, ctx_after;
    baton_xfer_mem_t *mem;
} reg_thread_t;

static void *reg_thread(void *arg)
{
    reg_thread_t *t = arg;
    CUcontext c = NULL;
    cu.ctx_get_current(&c);
    t->had_ctx = c != NULL;
    t->rc = baton_xfer_mem_register(t->e, (void *)(uintptr_t)t->ptr, t->len, BATON_XFER_MEM_CUDA, 0,
                                    &t->mem);
    c = NULL;
    cu.ctx_get_current(&c);
    t->ctx_after = c != NULL;
    return NULL;
}

static void check_registration(baton_xfer_engine_t *e, uint64_t free_b)
{
    static const uint64_t sizes[] = {4 * KiB, 64 * KiB, MiB, 16 * MiB, 256 * MiB, GiB, 4 * GiB};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        uint64_t s = sizes[i];
        char name[48], f[128];
        char hb[24];
        snprintf(name, sizeof(name), "register_%s", human(s, hb, sizeof(hb)));
        snprintf(f, sizeof(f), "\"bytes\": %" PRIu64, s);
        if (s > R.max_bytes || s > free_b / 10 * 7) {
            result(name, "skip", f, "over --max-bytes or 70%% of free device memory");
            continue;
        }
        CUdeviceptr p = 0;
        CUresult cr = cu.mem_alloc(&p, s);
        if (cr != CUDA_SUCCESS) {
            result(name, "fail", f, "cuMemAlloc: %s", gpu_cu_err(cr));
            continue;
        }
        baton_xfer_mem_t *m = NULL, *sub = NULL;
        double t0 = now_s();
        int rc = baton_xfer_mem_register(e, (void *)(uintptr_t)p, s, BATON_XFER_MEM_CUDA, 0, &m);
        double t_reg = now_s() - t0;
        int rc_d = rc == 0 ? baton_xfer_mem_deregister(e, m) : -1;
        /* a range inside the allocation (not its base): what a KV pool slice looks like */
        int rc_sub = 0, rc_sub_d = 0;
        if (s >= 16 * KiB) {
            rc_sub = baton_xfer_mem_register(e, (void *)(uintptr_t)(p + 4 * KiB), s - 8 * KiB,
                                             BATON_XFER_MEM_CUDA, 0, &sub);
            rc_sub_d = rc_sub == 0 ? baton_xfer_mem_deregister(e, sub) : -1;
        }
        cu.mem_free(p);
        snprintf(f, sizeof(f), "\"bytes\": %" PRIu64 ", \"register_ms\": %.3f", s, t_reg * 1000);
        if (rc || rc_d || rc_sub || rc_sub_d)
            result(name, "fail", f, "register %s, deregister %s, sub-range %s / %s",
                   baton_xfer_err_name(rc), baton_xfer_err_name(rc_d), baton_xfer_err_name(rc_sub),
                   baton_xfer_err_name(rc_sub_d));
        else
            result(name, "pass", f, "registered in %.3f ms, deregistered; sub-range too",
                   t_reg * 1000);
    }
    /* what the API does with memory that is not what it is said to be */
    void *host = malloc(MiB);
    baton_xfer_mem_t *m = NULL;
    int rc = baton_xfer_mem_register(e, host, MiB, BATON_XFER_MEM_CUDA, 0, &m);
    result("register_host_as_cuda", "info", "", "host malloc registered as CUDA: %s%s",
           baton_xfer_err_name(rc), rc == 0 ? " (accepted; no transport reaches it)" : "");
    if (rc == 0)
        baton_xfer_mem_deregister(e, m);
    free(host);
}

/* ---- bandwidth ------------------------------------------------------------------------------ */

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Best and median of `reps` unverified whole-room hand-offs of `bytes` (pages of 4 MiB). */
static int measure(baton_xfer_engine_t *e, int port, unsigned flags, void *dst, uint64_t bytes,
                   int reps, double *best, double *median)
{
    uint64_t page = bytes < 4 * MiB ? bytes : 4 * MiB;
    offer_opts_t o = {1, (uint32_t)(bytes / page), page, 0, NULL, 0};
    double t[16];
    for (int i = 0; i < reps; i++) {
        offer_res_t res;
        int rc = handoff(e, port, room_id_make(MODE_ROOM, flags, ++R.seq), dst, &o, &res, &t[i]);
        if (rc == 0)
            rc = res.status;
        if (rc != 0)
            return rc;
    }
    qsort(t, (size_t)reps, sizeof(t[0]), cmp_d);
    *best = t[0];
    *median = t[reps / 2];
    return 0;
}

static void check_bandwidth(baton_xfer_engine_t *shm, baton_xfer_engine_t *tcp, CUdeviceptr dst,
                            CUdeviceptr scratch, uint8_t *hdst, uint64_t dbytes, uint64_t hbytes)
{
    int reps = R.quick ? 2 : 5;
    for (uint64_t s = MiB; s <= dbytes; s *= 4) {
        char name[48], f[384];
        double best = 0, med = 0, ref = 1e30;
        for (int i = 0; i < reps; i++) { /* the device's own copy, same size, same run */
            double t0 = now_s();
            cu.memcpy_dtod(scratch, dst, s);
            cu.ctx_synchronize();
            double dt = now_s() - t0;
            ref = dt < ref ? dt : ref;
        }
        for (int big = 0; big < 2; big++) {
            char hb[24];
            snprintf(name, sizeof(name), "bw_ipc_%s%s", human(s, hb, sizeof(hb)),
                     big ? "_slice16M" : "");
            int rc = measure(shm, big ? R.port_big : R.port, 0, (void *)(uintptr_t)dst, s, reps,
                             &best, &med);
            if (rc != 0) {
                result(name, "fail", "", "hand-off failed: %s", baton_xfer_err_name(rc));
                continue;
            }
            snprintf(f, sizeof(f),
                     "\"bytes\": %" PRIu64 ", \"slice\": \"%s\", \"best_s\": %.6f, "
                     "\"median_s\": %.6f, \"gbps_best\": %.2f, \"dtod_s\": %.6f, "
                     "\"dtod_gbps\": %.2f, \"ratio\": %.3f",
                     s, big ? "16MiB" : "default", best, med, s / best / 1e9, ref, s / ref / 1e9,
                     ref / best);
            result(name, "info", f,
                   "IPC %.2f GB/s best (median %.2f) vs cuMemcpyDtoD %.2f GB/s: "
                   "%.0f%%",
                   s / best / 1e9, s / med / 1e9, s / ref / 1e9, 100 * ref / best);
        }
    }
    for (uint64_t s = MiB; s <= hbytes; s *= 4) {
        for (int dev = 0; dev < 2; dev++) {
            char name[48], f[256];
            double best = 0, med = 0;
            char hb[24];
            snprintf(name, sizeof(name), "bw_tcp_%s_%s", dev ? "device" : "host",
                     human(s, hb, sizeof(hb)));
            int rc = measure(tcp, R.port, dev ? 0 : FLAG_HOST_SRC, hdst, s, reps, &best, &med);
            if (rc != 0) {
                result(name, "fail", "", "hand-off failed: %s", baton_xfer_err_name(rc));
                continue;
            }
            snprintf(f, sizeof(f),
                     "\"bytes\": %" PRIu64 ", \"best_s\": %.6f, \"median_s\": %.6f, "
                     "\"gbps_best\": %.2f",
                     s, best, med, s / best / 1e9);
            result(name, "info", f, "tcp %s source %.2f GB/s best (median %.2f)",
                   dev ? "device" : "host", s / best / 1e9, s / med / 1e9);
        }
    }
}

/* ---- rdma ------------------------------------------------------------------------------------ */

static int rdma_devices(char *names, size_t cap)
{
    int n = 0;
    struct ibv_device **l = ibv_get_device_list(&n);
    names[0] = '\0';
    for (int i = 0; l && i < n; i++) {
        size_t at = strlen(names);
        snprintf(names + at, cap - at, "%s%s", at ? "," : "", ibv_get_device_name(l[i]));
    }
    if (l)
        ibv_free_device_list(l);
    return n;
}

static void check_rdma(void *ddst, uint8_t *hdst, uint64_t hlen)
{
    char names[256];
    int n = rdma_devices(names, sizeof(names));
    if (n == 0) {
        result("rdma", "skip", "",
               "no RDMA device (ibv_get_device_list is empty; scripts/"
               "gpu-check.sh tries Soft-RoCE first)");
        return;
    }
    result("rdma_devices", "info", "", "%d device(s): %s", n, names);
    baton_xfer_engine_t *e = decode_engine(BATON_XFER_TRANSPORT_RDMA, "gpu-check-rdma");
    if (e == NULL) {
        result("rdma", "fail", "", "the rdma transport did not start on %s", names);
        return;
    }
    baton_xfer_mem_t *dm = NULL, *hm = NULL;
    int rc = baton_xfer_mem_register(e, hdst, hlen, BATON_XFER_MEM_HOST, 0, &hm);
    if (rc == 0)
        check_handoff("rdma_host_to_host", e, R.port, MODE_ROOM, FLAG_HOST_SRC, hdst, 0, 4, 4,
                      256 * KiB);
    else
        result("rdma_host_to_host", "fail", "", "register host: %s", baton_xfer_err_name(rc));
    rc = baton_xfer_mem_register(e, ddst, 4 * MiB, BATON_XFER_MEM_CUDA, 0, &dm);
    if (rc == 0)
        check_handoff("rdma_device_to_device", e, R.port, MODE_ROOM, 0, ddst, 1, 4, 4, 256 * KiB);
    else
        result("rdma_device_to_device", "fail", "",
               "register device memory (dma-buf): %s (see the log for the driver's reason)",
               baton_xfer_err_name(rc));
    if (hm)
        baton_xfer_mem_deregister(e, hm);
    if (dm)
        baton_xfer_mem_deregister(e, dm);
    engine_gone(e);
}

/* ---- main ----------------------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(
        stderr,
        "Usage: baton-gpu-check run [--out FILE] [--max-bytes N] [--quick] [--no-rdma]\n"
        "       baton-gpu-check serve ... (the prefill process; started by run)\n"
        "Runs libbaton's CUDA checks on device 0 and prints one line per result; --out also\n"
        "writes them as JSON. Exit 0: all passed; 1: a check failed; 77: no CUDA driver or\n"
        "device (everything skipped). BATON_GPU_CHECK_FAKE=1 marks a run on the fake driver.\n");
}

static int run(int argc, char **argv)
{
    const char *out = NULL;
    int do_rdma = 1;
    R.max_bytes = 4 * GiB;
    static const struct option lo[] = {{"out", required_argument, 0, 'o'},
                                       {"max-bytes", required_argument, 0, 'm'},
                                       {"quick", no_argument, 0, 'q'},
                                       {"no-rdma", no_argument, 0, 'r'},
                                       {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (c == 'o')
            out = optarg;
        else if (c == 'm')
            R.max_bytes = strtoull(optarg, NULL, 0);
        else if (c == 'q')
            R.quick = 1;
        else if (c == 'r')
            do_rdma = 0;
        else {
            usage();
            return 2;
        }
    }
    alarm(540); /* the whole check stays well inside a 10-minute device slot */
    if (out && (R.json = fopen(out, "w")) == NULL) {
        perror(out);
        return 2;
    }
    const char *why = NULL;
    int fake = getenv("BATON_GPU_CHECK_FAKE") != NULL;
    if (R.json)
        fprintf(R.json, "{\"fake_driver\": %s,\n \"results\": [", fake ? "true" : "false");
    if (gpu_cu_load(&why) != 0) {
        result("all", "skip", "", "SKIP: %s: every GPU check skipped", why);
        if (R.json) {
            fprintf(R.json, "\n]}\n");
            fclose(R.json);
        }
        return 77;
    }
    CUdevice dev;
    char dname[128] = "?";
    int drv = 0;
    size_t free_b = 0, total_b = 0;
    if (gpu_cu_bind() != 0 || cu.device_get(&dev, 0) != CUDA_SUCCESS) {
        result("all", "fail", "", "no context on device 0");
        return 1;
    }
    cu.device_name(dname, sizeof(dname), dev);
    cu.driver_version(&drv);
    cu.mem_get_info(&free_b, &total_b);
    char f[512];
    snprintf(f, sizeof(f),
             "\"device\": \"%s\", \"driver_api\": \"%d.%d\", \"headers\": \"%d.%d\", "
             "\"mem_total\": %zu, \"mem_free\": %zu, \"fake\": %s",
             dname, drv / 1000, drv % 1000 / 10, CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10,
             total_b, free_b, fake ? "true" : "false");
    result("device", "info", f, "%s, driver API %d.%d, %.1f GiB (%.1f free)%s", dname, drv / 1000,
           drv % 1000 / 10, total_b / (double)GiB, free_b / (double)GiB,
           fake ? ", FAKE DRIVER (CPU rehearsal)" : "");

    /* bandwidth rooms up to 1 GiB, capped by --max-bytes and memory */
    uint64_t dbytes = GiB, hbytes = 256 * MiB;
    while (dbytes > R.max_bytes || dbytes > free_b / 8)
        dbytes /= 4;
    if (hbytes > dbytes)
        hbytes = dbytes;
    if (dbytes < 16 * MiB) {
        result("all", "fail", "", "less than 16 MiB of device memory to work with");
        return 1;
    }
    if (spawn_server("/proc/self/exe", dbytes, hbytes, do_rdma ? "shm,tcp,rdma" : "shm,tcp") != 0) {
        result("all", "fail", "", "the serving process did not start (see its stderr)");
        stop_server();
        return 1;
    }
    baton_xfer_engine_t *shm = decode_engine(BATON_XFER_TRANSPORT_SHM, "gpu-check-shm");
    baton_xfer_engine_t *tcp = decode_engine(BATON_XFER_TRANSPORT_TCP, "gpu-check-tcp");
    CUdeviceptr dall = 0, scratch = 0;
    if (shm == NULL || tcp == NULL || cu.mem_alloc(&dall, dbytes + 64 * KiB) != CUDA_SUCCESS ||
        cu.mem_alloc(&scratch, dbytes) != CUDA_SUCCESS) {
        result("all", "fail", "", "engines or device memory not available");
        stop_server();
        return 1;
    }

    check_registration(shm, free_b);

    /* The destination region is registered from a thread that has no current context; the
     * pages start 4 KiB into the allocation (an IPC handle names the allocation's base). */
    reg_thread_t rt = {shm, dall, dbytes + 64 * KiB, 0, 0, 0, NULL};
    pthread_t th;
    pthread_create(&th, NULL, reg_thread, &rt);
    pthread_join(th, NULL);
    void *ddst = (void *)(uintptr_t)(dall + 4 * KiB);
    if (rt.rc != 0 || rt.had_ctx)
        result("register_no_context", "fail", "", "thread had a context: %d, register: %s",
               rt.had_ctx, baton_xfer_err_name(rt.rc));
    else
        result("register_no_context", "pass", "",
               "registered from a thread with no current context; context current after: %s",
               rt.ctx_after ? "yes (libbaton made the primary context current)" : "no");

    /* shm: CUDA IPC between the two processes */
    uint64_t odd = 256 * KiB + 3; /* not a multiple of the slice: the tail matters */
    check_handoff("ipc_layerwise", shm, R.port, MODE_LAYER, 0, ddst, 1, 4, 8, odd);
    check_handoff("ipc_whole_room", shm, R.port, MODE_ROOM, 0, ddst, 1, 4, 8, odd);
    check_handoff("ipc_whole_room_slice16M", shm, R.port_big, MODE_ROOM, 0, ddst, 1, 2, 4,
                  dbytes / 8 < 8 * MiB ? dbytes / 8 : 8 * MiB);
    check_handoff("ipc_host_src_to_device", shm, R.port, MODE_ROOM, FLAG_HOST_SRC, ddst, 1, 4, 8,
                  odd);
    baton_xfer_mem_t *shm_h = NULL;
    int rc = baton_xfer_mem_alloc(shm, 16 * MiB, &shm_h);
    if (rc == 0)
        check_handoff("ipc_device_src_to_host", shm, R.port, MODE_ROOM, 0,
                      baton_xfer_mem_addr(shm_h), 0, 4, 8, odd);

    /* the event: a kernel writes each layer after 20 ms; the copy must wait for it */
    check_handoff("after_event_kernel", shm, R.port, MODE_EVENT, 0, ddst, 1, 4, 4, MiB);

    /* aborts with device memory: the callback only after the fence, nothing lands after it */
    for (int side = 0; side < 2; side++) {
        const char *name = side ? "abort_decode_during_event" : "abort_prefill";
        poison(ddst, 1, 16 * MiB);
        offer_opts_t o = {4, 4, MiB, side ? 100 : 0, NULL, 0};
        offer_res_t res;
        double secs = 0;
        rc = handoff(shm, R.port, room_id_make(side ? MODE_SLOW_EVENT : MODE_ABORT, 0, ++R.seq),
                     ddst, &o, &res, &secs);
        uint8_t *a = malloc(16 * MiB), *b = malloc(16 * MiB);
        cu.memcpy_dtoh(a, (CUdeviceptr)(uintptr_t)ddst, 16 * MiB);
        usleep(side ? 3000000 : 300000); /* past the slow kernels: a late write would show */
        cu.memcpy_dtoh(b, (CUdeviceptr)(uintptr_t)ddst, 16 * MiB);
        int moved = memcmp(a, b, 16 * MiB) != 0;
        free(a);
        free(b);
        if (rc != 0 || res.status != BATON_XFER_EABORTED || moved)
            result(name, "fail", "", "offer %s, room %s, bytes changed after the callback: %s",
                   baton_xfer_err_name(rc), baton_xfer_err_name(res.status), moved ? "yes" : "no");
        else
            result(name, "pass", "",
                   "room ended EABORTED after %.0f ms; no byte changed after "
                   "the callback",
                   secs * 1000);
    }
    /* fencing: a destination region stays registered while a room uses it */
    {
        baton_xfer_mem_t *m = NULL;
        CUdeviceptr p = 0;
        cu.mem_alloc(&p, 4 * MiB);
        rc =
            baton_xfer_mem_register(shm, (void *)(uintptr_t)p, 4 * MiB, BATON_XFER_MEM_CUDA, 0, &m);
        offer_opts_t o = {2, 2, MiB, 0, m, 0};
        offer_res_t res;
        if (rc == 0)
            rc = handoff(shm, R.port, room_id_make(MODE_EVENT, 0, ++R.seq), (void *)(uintptr_t)p,
                         &o, &res, NULL);
        int rc_after = m ? baton_xfer_mem_deregister(shm, m) : -1;
        if (rc == 0)
            rc = res.status;
        if (rc != 0 || !o.busy_seen || rc_after != 0)
            result("fence_deregister_busy", "fail", "",
                   "room %s, EBUSY while open: %s, deregister after: %s", baton_xfer_err_name(rc),
                   o.busy_seen ? "yes" : "no", baton_xfer_err_name(rc_after));
        else
            result("fence_deregister_busy", "pass", "",
                   "deregister said EBUSY while the room was open, 0 after its callback");
        cu.mem_free(p);
    }

    /* tcp: device memory as a source (to host memory) and as a destination */
    baton_xfer_mem_t *tcp_h = NULL, *tcp_d = NULL;
    rc = baton_xfer_mem_alloc(tcp, hbytes, &tcp_h);
    if (rc == 0)
        rc = baton_xfer_mem_register(tcp, ddst, dbytes, BATON_XFER_MEM_CUDA, 0, &tcp_d);
    if (rc != 0) {
        result("tcp", "fail", "", "registration on the tcp engine: %s", baton_xfer_err_name(rc));
    } else {
        uint8_t *hdst = baton_xfer_mem_addr(tcp_h);
        check_handoff("tcp_host_to_host", tcp, R.port, MODE_ROOM, FLAG_HOST_SRC, hdst, 0, 4, 8,
                      odd);
        check_handoff("tcp_device_src_to_host", tcp, R.port, MODE_ROOM, 0, hdst, 0, 4, 8, odd);
        baton_xfer_stats_t st0, st1;
        baton_xfer_engine_stats_sized(tcp, &st0, sizeof(st0));
        check_handoff("tcp_host_src_to_device", tcp, R.port, MODE_ROOM, FLAG_HOST_SRC, ddst, 1, 4,
                      8, odd);
        check_handoff("tcp_device_to_device", tcp, R.port, MODE_ROOM, 0, ddst, 1, 4, 8, odd);
        baton_xfer_engine_stats_sized(tcp, &st1, sizeof(st1));
        /* this (decode) side copied both rooms out of its bounce buffers, bounded per lane */
        uint64_t want = 2 * page_offset(4, 0, 8, odd);
        uint64_t got = st1.staged_bytes - st0.staged_bytes;
        result("tcp_stage_stats",
               got == want && st1.stage_buffer_bytes <= 16 * 512 * KiB ? "pass" : "fail", "",
               "staged_bytes +%" PRIu64 " (expected %" PRIu64 "), stage_buffer_bytes %" PRIu64, got,
               want, st1.stage_buffer_bytes);
        /* 1 MiB slices: a receiver chunk (512 KiB) fills and is copied more than once a slice */
        check_handoff("tcp_device_to_device_slice16M", tcp, R.port_big, MODE_ROOM, 0, ddst, 1, 2, 4,
                      MiB + odd);
        check_bandwidth(shm, tcp, (CUdeviceptr)(uintptr_t)ddst, scratch, hdst, dbytes, hbytes);
    }

    if (do_rdma) {
        uint8_t *hd = malloc(16 * MiB);
        check_rdma(ddst, hd, 16 * MiB);
        free(hd);
    } else {
        result("rdma", "skip", "", "--no-rdma");
    }

    if (tcp_h)
        baton_xfer_mem_deregister(tcp, tcp_h);
    if (tcp_d)
        baton_xfer_mem_deregister(tcp, tcp_d);
    if (shm_h)
        baton_xfer_mem_deregister(shm, shm_h);
    if (rt.mem)
        baton_xfer_mem_deregister(shm, rt.mem);
    engine_gone(shm);
    engine_gone(tcp);
    stop_server();
    cu.mem_free(dall);
    cu.mem_free(scratch);
    printf("gpu-check: %d passed, %d failed, %d skipped%s\n", R.passed, R.failed, R.skipped,
           fake ? " (fake driver)" : "");
    if (R.json) {
        fprintf(R.json, "\n]}\n");
        fclose(R.json);
    }
    return R.failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "run") == 0)
        return run(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "serve") == 0)
        return gpu_serve_main(argc - 1, argv + 1);
    usage();
    return 2;
}
