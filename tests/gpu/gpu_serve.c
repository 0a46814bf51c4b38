/* gpu_serve.c — the prefill process of baton-gpu-check: two engines (the default slice and a
 * large one) serve every offered room from a device-memory source (or a host one), the way the
 * room id asks (gpu_check.h), and report event-order violations in DONE's status. It runs until
 * its stdin closes. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "baton/transfer.h"
#include "gpu_check.h"
#include "gpu_cu.h"
#include "gpu_pattern.h"

typedef struct {
    CUdeviceptr dsrc;
    uint8_t *hsrc;
    size_t dbytes, hbytes;
    CUstream stream;
    int closed;
} serve_t;

typedef struct {
    serve_t *s;
    uint32_t layers, ppl;
    uint64_t page_len;
    CUevent *evs;
    int violations; /* writes whose callback ran before their event had completed */
    int failed;     /* writes that ended with an error */
    int pending;
    int issued, aborting;
} sroom_t;

static serve_t S;

/* DONE's status tells the decode side what only this side saw: failed writes (thousands) and
 * writes that started before their event (units). */
#define DONE_STATUS(r) ((r)->failed * 1000 + (r)->violations)

/* The last write callback completes the room, so DONE's status can carry what they saw. */
static void on_write(baton_xfer_room_t *room, uint32_t layer, int status, void *data)
{
    sroom_t *r = data;
    r->pending--;
    if (status != 0)
        r->failed++;
    if (status == 0 && r->evs != NULL && layer < r->layers &&
        cu.event_query(r->evs[layer]) != CUDA_SUCCESS)
        r->violations++;
    if (r->pending == 0 && r->issued && !r->aborting) {
        baton_xfer_done_t done = {DONE_STATUS(r), 7, NULL, 0};
        int rc = baton_xfer_room_complete(room, &done);
        if (rc != 0)
            fprintf(stderr, "gpu-serve: complete: %s\n", baton_xfer_strerror(rc));
    }
}

/* Every write is issued (rc 0), or the room is refused with rc and aborted. */
static void issued(baton_xfer_room_t *room, sroom_t *r, int rc)
{
    if (rc != 0) {
        fprintf(stderr, "gpu-serve: room %016" PRIx64 " write refused: %s\n",
                baton_xfer_room_id(room), baton_xfer_strerror(rc));
        r->aborting = 1;
        baton_xfer_room_abort(room, rc);
        return;
    }
    r->issued = 1; /* callbacks never run inside the calls: pending > 0 here */
}

static void on_room(baton_xfer_engine_t *eng, baton_xfer_room_t *room, void *data)
{
    uint64_t id = baton_xfer_room_id(room);
    sroom_t *r = calloc(1, sizeof(*r));
    r->s = &S;
    r->layers = baton_xfer_room_layers(room);
    r->ppl = baton_xfer_room_pages_per_layer(room);
    r->page_len = baton_xfer_room_page_len(room, 0, 0);
    baton_xfer_room_set_data(room, r);
    unsigned mode = room_mode(id);
    int host = room_flags(id) & FLAG_HOST_SRC;
    uint64_t total = page_offset(r->layers, 0, r->ppl, r->page_len);
    if (total > (host ? S.hbytes : S.dbytes)) {
        issued(room, r, BATON_XFER_EINVAL);
        return;
    }
    size_t n = (size_t)r->layers * r->ppl;
    baton_xfer_iov_t *src = calloc(n, sizeof(*src));
    for (uint32_t l = 0; l < r->layers; l++)
        for (uint32_t p = 0; p < r->ppl; p++) {
            uint64_t off = page_offset(l, p, r->ppl, r->page_len);
            src[l * r->ppl + p].addr =
                host ? (void *)(S.hsrc + off) : (void *)(uintptr_t)(S.dsrc + off);
            src[l * r->ppl + p].len = r->page_len;
        }
    int rc = 0;
    switch (mode) {
    case MODE_LAYER:
        for (uint32_t l = 0; rc == 0 && l < r->layers; l++) {
            rc = baton_xfer_write_layer(room, l, src + (size_t)l * r->ppl, r->ppl, on_write, r);
            r->pending += rc == 0;
        }
        issued(room, r, rc);
        break;
    case MODE_ROOM:
        rc = baton_xfer_write_room(room, src, n, on_write, r);
        r->pending += rc == 0;
        issued(room, r, rc);
        break;
    case MODE_ABORT:
        rc = baton_xfer_write_layer(room, 0, src, r->ppl, on_write, r);
        r->pending += rc == 0;
        r->aborting = 1;
        baton_xfer_room_abort(room, BATON_XFER_EABORTED);
        break;
    case MODE_EVENT:
    case MODE_SLOW_EVENT: {
        uint64_t delay = mode == MODE_EVENT ? EVENT_DELAY_NS : SLOW_EVENT_DELAY_NS;
        if (host) {
            rc = BATON_XFER_EINVAL;
            issued(room, r, rc);
            break;
        }
        /* Poison the source first: a copy that starts before the kernel has written it moves
         * the poison, and the decode side sees it. */
        if (cu.memset_d8(S.dsrc, POISON, total) != CUDA_SUCCESS ||
            cu.ctx_synchronize() != CUDA_SUCCESS) {
            issued(room, r, BATON_XFER_EINVAL);
            break;
        }
        r->evs = calloc(r->layers, sizeof(CUevent));
        for (uint32_t l = 0; rc == 0 && l < r->layers; l++) {
            uint64_t off = page_offset(l, 0, r->ppl, r->page_len);
            CUresult cr = cu.event_create(&r->evs[l], CU_EVENT_DISABLE_TIMING);
            if (cr == CUDA_SUCCESS)
                cr = gpu_cu_fill(S.stream, S.dsrc + off, (uint64_t)r->ppl * r->page_len, off,
                                 GPU_SEED, delay);
            if (cr == CUDA_SUCCESS)
                cr = cu.event_record(r->evs[l], S.stream);
            if (cr != CUDA_SUCCESS) {
                fprintf(stderr, "gpu-serve: kernel/event: %s\n", gpu_cu_err(cr));
                rc = BATON_XFER_EINVAL;
                break;
            }
            r->pending++;
            rc = baton_xfer_write_layer_after_event(room, l, src + (size_t)l * r->ppl, r->ppl,
                                                    r->evs[l], on_write, r);
            if (rc != 0)
                r->pending--;
        }
        issued(room, r, rc);
        break;
    }
    default:
        issued(room, r, BATON_XFER_EINVAL);
    }
    free(src);
}

static void on_room_closed(baton_xfer_engine_t *eng, baton_xfer_room_t *room, int status,
                           void *data)
{
    sroom_t *r = baton_xfer_room_get_data(room);
    if (r == NULL)
        return;
    if (r->evs != NULL) {
        /* the kernels may still run (an aborted room): wait before the events go */
        cu.stream_synchronize(S.stream);
        for (uint32_t l = 0; l < r->layers; l++)
            if (r->evs[l])
                cu.event_destroy(r->evs[l]);
        free(r->evs);
    }
    free(r);
}

static void on_closed(baton_xfer_engine_t *eng, void *data)
{
    S.closed++;
}

static int start(baton_xfer_engine_t **e, const char *transports, uint32_t slice,
                 baton_xfer_mem_t **dm, baton_xfer_mem_t **hm)
{
    baton_xfer_config_t cfg;
    baton_xfer_config_init(&cfg);
    cfg.engine_id = slice ? "gpu-serve-big-slice" : "gpu-serve";
    cfg.listen_host = "127.0.0.1";
    cfg.listen_port = 0;
    if (slice)
        cfg.slice_size = slice;
    char buf[64];
    snprintf(buf, sizeof(buf), "%s", transports);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && cfg.n_transports < 4;
         t = strtok_r(NULL, ",", &save))
        if (baton_xfer_transport_parse(t, &cfg.transports[cfg.n_transports]) == 0)
            cfg.n_transports++;
    baton_xfer_callbacks_t cbs = {on_room, on_room_closed, NULL, NULL};
    int rc = baton_xfer_engine_create(NULL, &cfg, &cbs, e);
    if (rc == 0)
        rc = baton_xfer_mem_register(*e, (void *)(uintptr_t)S.dsrc, S.dbytes, BATON_XFER_MEM_CUDA,
                                     0, dm);
    if (rc == 0)
        rc = baton_xfer_mem_register(*e, S.hsrc, S.hbytes, BATON_XFER_MEM_HOST, 0, hm);
    if (rc != 0)
        fprintf(stderr, "gpu-serve: engine: %s\n", baton_xfer_strerror(rc));
    return rc;
}

int gpu_serve_main(int argc, char **argv)
{
    const char *transports = "shm,tcp";
    uint32_t big_slice = 16u << 20;
    static const struct option lo[] = {{"device-bytes", required_argument, 0, 'd'},
                                       {"host-bytes", required_argument, 0, 'h'},
                                       {"transports", required_argument, 0, 't'},
                                       {"big-slice", required_argument, 0, 's'},
                                       {0, 0, 0, 0}};
    S.dbytes = 64u << 20;
    S.hbytes = 64u << 20;
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        if (c == 'd')
            S.dbytes = strtoull(optarg, NULL, 0);
        else if (c == 'h')
            S.hbytes = strtoull(optarg, NULL, 0);
        else if (c == 't')
            transports = optarg;
        else if (c == 's')
            big_slice = (uint32_t)strtoul(optarg, NULL, 0);
        else
            return 2;
    }
    const char *why = NULL;
    if (gpu_cu_load(&why) != 0 || gpu_cu_bind() != 0) {
        fprintf(stderr, "gpu-serve: %s\n", why ? why : "no context");
        return 1;
    }
    CUresult cr = cu.mem_alloc(&S.dsrc, S.dbytes);
    if (cr == CUDA_SUCCESS)
        cr = cu.stream_create(&S.stream, CU_STREAM_NON_BLOCKING);
    if (cr == CUDA_SUCCESS)
        cr = gpu_cu_fill(S.stream, S.dsrc, S.dbytes, 0, GPU_SEED, 0);
    if (cr == CUDA_SUCCESS)
        cr = cu.stream_synchronize(S.stream);
    if (cr != CUDA_SUCCESS) {
        fprintf(stderr, "gpu-serve: device source: %s\n", gpu_cu_err(cr));
        return 1;
    }
    baton_xfer_engine_t *e[2] = {NULL, NULL};
    baton_xfer_mem_t *dm[2], *hm[2];
    /* host source: plain host memory (a source needs no memfd, only a destination over shm) */
    S.hsrc = malloc(S.hbytes);
    if (S.hsrc == NULL)
        return 1;
    for (size_t i = 0; i < S.hbytes; i++)
        S.hsrc[i] = gpu_pattern_byte(GPU_SEED, i);
    if (start(&e[0], transports, 0, &dm[0], &hm[0]) != 0 ||
        start(&e[1], transports, big_slice, &dm[1], &hm[1]) != 0)
        return 1;
    printf("port=%d port_big=%d\n", baton_xfer_engine_listen_port(e[0]),
           baton_xfer_engine_listen_port(e[1]));
    fflush(stdout);
    for (;;) {
        struct pollfd p[3] = {{baton_xfer_engine_fd(e[0]), POLLIN, 0},
                              {baton_xfer_engine_fd(e[1]), POLLIN, 0},
                              {STDIN_FILENO, POLLIN, 0}};
        if (poll(p, 3, 100) < 0 && errno != EINTR)
            break;
        baton_xfer_engine_dispatch(e[0]);
        baton_xfer_engine_dispatch(e[1]);
        if (p[2].revents) {
            char b[16];
            if (read(STDIN_FILENO, b, sizeof(b)) <= 0)
                break; /* the check is over */
        }
    }
    for (int i = 0; i < 2; i++) {
        baton_xfer_mem_deregister(e[i], dm[i]);
        baton_xfer_mem_deregister(e[i], hm[i]);
        baton_xfer_engine_destroy(e[i], on_closed, NULL);
        while (S.closed <= i) {
            struct pollfd p = {baton_xfer_engine_fd(e[i]), POLLIN, 0};
            poll(&p, 1, 50);
            baton_xfer_engine_dispatch(e[i]);
        }
    }
    cu.mem_free(S.dsrc);
    free(S.hsrc);
    return 0;
}
