/* xfer/serve.c — baton-xfer-bench's prefill side: answers every offered room by writing the
 * pattern bytes of each page (every layer at once), then completes it with an echo payload. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <uv.h>

#include "common/log.h"
#include "xbench.h"

static const xb_opts_t *so;
static uv_loop_t *sloop;
static baton_xfer_engine_t *seng;
static uint8_t *ssrc;
static baton_xfer_mem_t *ssrc_mem;
static uv_signal_t s_term, s_int;
static baton_xfer_iov_t *iov_buf;
static size_t iov_cap;
static uint64_t n_rooms, n_ok, n_failed, n_write_err;
static int stopping;

static void on_write(baton_xfer_room_t *room, uint32_t layer, int status, void *data)
{
    if (status != 0)
        n_write_err++;
}

static int write_all(baton_xfer_room_t *room)
{
    uint64_t id = baton_xfer_room_id(room);
    uint32_t layers = baton_xfer_room_layers(room), ppl = baton_xfer_room_pages_per_layer(room);
    if (ppl > iov_cap) {
        baton_xfer_iov_t *n = realloc(iov_buf, ppl * sizeof(*n));
        if (n == NULL)
            return BATON_ENOMEM;
        iov_buf = n;
        iov_cap = ppl;
    }
    /* Layer by layer, as a prefill would hand them over; the engine copies the iovs. */
    for (uint32_t l = 0; l < layers; l++) {
        for (uint32_t j = 0; j < ppl; j++) {
            uint64_t len = baton_xfer_room_page_len(room, l, j);
            if (len == 0 || len > so->src_bytes)
                return BATON_EINVAL;
            iov_buf[j].addr = ssrc + xb_src_offset(id, l, j, so->src_bytes, len);
            iov_buf[j].len = len;
        }
        int rc = baton_xfer_write_layer(room, l, iov_buf, ppl, on_write, NULL);
        if (rc != 0)
            return rc;
    }
    uint8_t payload[XB_DONE_PAYLOAD];
    uint64_t pages = (uint64_t)layers * ppl;
    memcpy(payload, &id, 8);
    memcpy(payload + 8, &pages, 8);
    baton_xfer_done_t done = {0, (int64_t)(id % 50000), payload, sizeof(payload)};
    return baton_xfer_room_complete(room, &done);
}

static void on_room(baton_xfer_engine_t *e, baton_xfer_room_t *room, void *data)
{
    n_rooms++;
    int rc = write_all(room);
    if (rc != 0) {
        log_warn("xfer-bench", "room_write_failed room=%" PRIu64 " err=%s",
                 baton_xfer_room_id(room), baton_err_name(rc));
        baton_xfer_room_abort(room, rc);
    }
}

static void on_room_closed(baton_xfer_engine_t *e, baton_xfer_room_t *room, int status, void *data)
{
    if (status == 0)
        n_ok++;
    else
        n_failed++;
}

static void on_closed(baton_xfer_engine_t *e, void *data)
{
    uv_stop(sloop);
}

static void on_signal(uv_signal_t *s, int signum)
{
    if (stopping)
        return;
    stopping = 1;
    uv_close((uv_handle_t *)&s_term, NULL);
    uv_close((uv_handle_t *)&s_int, NULL);
    baton_xfer_engine_destroy(seng, on_closed, NULL);
}

int xb_serve(const xb_opts_t *o)
{
    so = o;
    /* A server started by a driver must not outlive it. */
    if (o->notify_fd >= 0)
        prctl(PR_SET_PDEATHSIG, SIGTERM);
    sloop = uv_default_loop();
    ssrc = xb_source_new(o->src_bytes, o->seed);
    if (ssrc == NULL) {
        fprintf(stderr, "xfer-bench server: cannot allocate the source\n");
        return 1;
    }
    baton_xfer_config_t cfg;
    baton_xfer_config_init(&cfg);
    cfg.listen_host = o->listen_host;
    cfg.listen_port = o->listen_port;
    cfg.n_transports = o->n_tps;
    for (int i = 0; i < o->n_tps; i++)
        cfg.transports[i] = o->tps[i];
    if (o->slice)
        cfg.slice_size = o->slice;
    if (o->lanes)
        cfg.lanes = o->lanes;
    cfg.engine_id = "xfer-bench-server";
    baton_xfer_callbacks_t cbs = {on_room, on_room_closed, NULL, NULL};
    int rc = baton_xfer_engine_create(sloop, &cfg, &cbs, &seng);
    if (rc != 0) {
        fprintf(stderr, "xfer-bench server: engine_create failed: %s\n", baton_strerror(rc));
        return 1;
    }
    rc = baton_xfer_mem_register(seng, ssrc, o->src_bytes, BATON_XFER_MEM_HOST, 0, &ssrc_mem);
    if (rc != 0) {
        fprintf(stderr, "xfer-bench server: mem_register failed: %s\n", baton_strerror(rc));
        return 1;
    }
    uv_signal_init(sloop, &s_term);
    uv_signal_start(&s_term, on_signal, SIGTERM);
    uv_signal_init(sloop, &s_int);
    uv_signal_start(&s_int, on_signal, SIGINT);
    char line[64];
    int n = snprintf(line, sizeof(line), "port=%d\n", baton_xfer_engine_listen_port(seng));
    if (o->notify_fd >= 0) {
        if (write(o->notify_fd, line, (size_t)n) != n)
            return 1;
        close(o->notify_fd);
    } else {
        fputs(line, stdout);
        fflush(stdout);
    }
    uv_run(sloop, UV_RUN_DEFAULT);
    fprintf(stderr,
            "xfer-bench server: rooms=%" PRIu64 " ok=%" PRIu64 " failed=%" PRIu64
            " write_errors=%" PRIu64 "\n",
            n_rooms, n_ok, n_failed, n_write_err);
    free(iov_buf);
    free(ssrc);
    return 0;
}
