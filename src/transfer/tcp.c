/* transfer/tcp.c — the tcp transport: several lanes per peer, the receiver reads each payload
 * straight into its destination page (device pages through tcp_stage.c's bounce buffers), every
 * slice acknowledged before a write completes. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "transfer/tcp_int.h"

/*
 * Lanes are TCP connections the decode side (TARGET) opens to the prefill side's bootstrap
 * port, each starting with LANE_HELLO(incarnation, generation, lane); the engine hands them to
 * this transport (adopt_lane) and the prefill side answers LANE_ACK. Then the prefill side
 * (INITIATOR) sends WRITE frames (40-byte header + data) and the target answers each with a
 * WACK(seq, status) in order. Slices of one write are striped over the lanes with the fewest
 * bytes in flight, bounded by a per-lane window.
 *
 * Zero copy: the initiator writev()s the header and the caller's source buffer; the target's
 * alloc callback hands libuv the destination page itself, so recv() lands the bytes in place.
 * Before that the engine checks [addr, addr+len) against the pages offered for the room
 * (resolve_dst); a refused or aborted slice is drained into a scratch buffer.
 * Device memory goes through pinned host chunks instead (tcp_stage.h: data path, owner, bound).
 *
 * Acks are batched. A WACK is still queued only once its slice's last byte is in the page, but
 * the target sends the WACKs of one loop iteration together from a uv_check handle (it runs
 * right after that iteration's reads) instead of one write() per slice: one syscall and one
 * small segment per batch, and the initiator wakes once per batch instead of once per slice.
 * The delay is bounded by one loop iteration, far below LANE_WINDOW's worth of transfer time.
 * Measured on loopback (docs/BENCHMARKS.md, "Transfer engine"): syscalls of both sides -39%,
 * epoll wake-ups -80%; throughput unchanged there (the kernel's copies dominate), the saving
 * is in packets and wake-ups, which a real NIC path pays more for.
 */

/* The lanes' phases (tcp_int.h). */
#define B(s) BATON_PHASE_BIT(s)
static const uint32_t lane_legal[LANE_N_STATES] = {
    [LANE_NONE] = B(LANE_CONNECTING) | B(LANE_READY) | B(LANE_CLOSED),
    [LANE_CONNECTING] = B(LANE_HELLO) | B(LANE_CLOSED),
    [LANE_HELLO] = B(LANE_READY) | B(LANE_CLOSED),
    [LANE_READY] = B(LANE_CLOSED),
};
#undef B
static const char *const lane_names[LANE_N_STATES] = {
    [LANE_NONE] = "none",   [LANE_CONNECTING] = "connecting", [LANE_HELLO] = "hello",
    [LANE_READY] = "ready", [LANE_CLOSED] = "closed",
};
const baton_phase_table_t baton__tcp_lane_phases = {"xfer", "tcp_lane", LANE_N_STATES, lane_legal,
                                                    lane_names};

/* ---- failure ----------------------------------------------------------------------------- */

static void failed_deferred(void *arg)
{
    tcp_peer_t *p = arg;
    if (!p->fencing)
        env_of(p)->peer_failed(&p->base, p->failed);
}

void baton__tcp_peer_fail(tcp_peer_t *p, int err, const char *why)
{
    if (p->failed || p->fencing)
        return;
    p->failed = err ? err : BATON_EPEERDOWN;
    /* A lane the peer closed with no slice queued or in flight (its process ended) lost nothing:
     * info. Losing bytes on the way is a warning. */
    int busy = p->pending.head != NULL || p->connect_cb != NULL;
    for (uint32_t i = 0; i < p->n_lanes && !busy; i++)
        busy = p->lanes[i].inflight.head != NULL;
    baton_log(busy ? BATON_LOG_WARN : BATON_LOG_INFO, "tcp",
              "lane_failed peer_gen=%016" PRIx64 " err=%s reason=\"%s\"", p->base.generation,
              baton_err_name(p->failed), why);
    if (p->connect_cb != NULL) {
        /* Still connecting: report it through the connect callback instead. */
        baton__tp_done_cb cb = p->connect_cb;
        p->connect_cb = NULL;
        cb(&p->base, p->failed, p->connect_arg);
        return;
    }
    if (baton__tp_defer(env_of(p), failed_deferred, p) != 0)
        env_of(p)->peer_failed(&p->base, p->failed);
}

/* ---- lanes: connect (target) and adopt (initiator) ---------------------------------------- */

/* Every lane is closed, so every write callback has run (libuv cancels them before the close
 * callback): no source is read and no byte lands anymore. Fail what is left, then report. */
static void fence_complete(void *arg)
{
    tcp_peer_t *p = arg;
    for (uint32_t i = 0; i < p->n_lanes; i++) {
        tcp_slice_t *s;
        while ((s = q_pop(&p->lanes[i].inflight)) != NULL) {
            s->acked = s->written = 1;
            if (s->status == 0)
                s->status = BATON_EPEERDOWN;
            baton__tcp_slice_finish(s);
        }
    }
    tcp_slice_t *s;
    while ((s = q_pop(&p->pending)) != NULL) {
        s->acked = s->written = 1;
        s->status = BATON_EPEERDOWN;
        baton__tcp_slice_finish(s);
    }
    baton__tp_done_cb cb = p->fence_cb;
    p->fence_cb = NULL;
    if (cb != NULL)
        cb(&p->base, 0, p->fence_arg);
}

static void lane_closed(uv_handle_t *h)
{
    tcp_lane_t *l = h->data;
    free(h);
    tcp_peer_t *p = l->peer;
    l->tcp = NULL;
    LANE_MOVE(l, LANE_CLOSED);
    if (--p->open_handles == 0 && p->fencing)
        fence_complete(p);
}

static void ack_flush_closed(uv_handle_t *h)
{
    tcp_peer_t *p = h->data;
    free(h);
    p->ack_flush = NULL;
    if (--p->open_handles == 0 && p->fencing)
        fence_complete(p);
}

static void free_handle(uv_handle_t *h)
{
    free(h);
}

static void hello_sent(uv_write_t *req, int status)
{
    tcp_lane_t *l = req->data;
    if (status < 0 && status != UV_ECANCELED)
        baton__tcp_peer_fail(l->peer, BATON_EPEERDOWN, uv_strerror(status));
}

static void lane_connected(uv_connect_t *req, int status)
{
    tcp_lane_t *l = req->data;
    tcp_peer_t *p = l->peer;
    if (p->failed || p->fencing)
        return;
    if (status < 0) {
        baton__tcp_peer_fail(p, BATON_EPEERDOWN, uv_strerror(status));
        return;
    }
    uv_tcp_nodelay(l->tcp, 1);
    const baton__tp_env_t *env = env_of(p);
    baton_buf_t b = BATON_BUF_INIT;
    if (baton__enc_lane_hello(&b, env->incarnation, p->base.generation, l->index) != 0 ||
        b.len != sizeof(l->hello)) {
        baton_buf_free(&b);
        baton__tcp_peer_fail(p, BATON_ENOMEM, "cannot encode LANE_HELLO");
        return;
    }
    memcpy(l->hello, b.data, sizeof(l->hello));
    baton_buf_free(&b);
    uv_buf_t ub = uv_buf_init((char *)l->hello, sizeof(l->hello));
    l->hreq.data = l;
    LANE_MOVE(l, LANE_HELLO);
    int rc = uv_write(&l->hreq, (uv_stream_t *)l->tcp, &ub, 1, hello_sent);
    if (rc == 0)
        rc = uv_read_start((uv_stream_t *)l->tcp, baton__tcp_lane_alloc, baton__tcp_lane_read);
    if (rc != 0)
        baton__tcp_peer_fail(p, BATON_EPEERDOWN, uv_strerror(rc));
}

static int tcp_adopt_lane(baton__tp_peer_t *tpp, uv_tcp_t *stream, uint32_t index,
                          const uint8_t *rest, size_t rest_len)
{
    tcp_peer_t *p = (tcp_peer_t *)tpp;
    if (p->base.role != BATON__TP_ROLE_INITIATOR || p->failed || p->fencing)
        return BATON_EPEERDOWN;
    if (index >= p->n_lanes || p->lanes[index].state != LANE_NONE)
        return BATON_EPROTO;
    if (rest_len > 0)
        return BATON_EPROTO; /* the target waits for LANE_ACK before it sends anything */
    tcp_lane_t *l = &p->lanes[index];
    uint8_t ack[BATON__FRAME_HDR + 8];
    baton_buf_t b = BATON_BUF_INIT;
    if (baton__enc_lane_ack(&b, index, 0) != 0 || b.len != sizeof(ack)) {
        baton_buf_free(&b);
        return BATON_ENOMEM;
    }
    memcpy(ack, b.data, sizeof(ack));
    baton_buf_free(&b);
    l->tcp = stream;
    stream->data = l;
    p->open_handles++;
    LANE_MOVE(l, LANE_READY);
    uv_tcp_nodelay(stream, 1);
    int rc = uv_read_start((uv_stream_t *)stream, baton__tcp_lane_alloc, baton__tcp_lane_read);
    if (rc != 0) {
        /* The stream is ours now: close it through the normal path. */
        baton__tcp_peer_fail(p, BATON_EPEERDOWN, uv_strerror(rc));
        return 0;
    }
    baton__tcp_send_small(l, ack, sizeof(ack));
    p->lanes_ready++;
    baton__tcp_pump(p);
    return 0;
}

/* ---- ops --------------------------------------------------------------------------------- */

static int tcp_init(const baton__tp_env_t *env, baton__tp_t **tp_p)
{
    tcp_tp_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return BATON_ENOMEM;
    *tp_p = &t->base;
    return 0;
}

static void tcp_fini(baton__tp_t *tp)
{
    free(tp);
}

static int tcp_query(baton__tp_t *tp, baton__tp_caps_t *caps)
{
    memset(caps, 0, sizeof(*caps));
    caps->max_slice = BATON__WRITE_DATA_MAX;
    caps->remote_check = 1;
#ifdef BATON_HAVE_CUDA
    caps->cuda_local = 1; /* through the bounce buffers of tcp_stage.c */
    caps->cuda_remote = 1;
#endif
    return 0;
}

static int tcp_mem_reg(baton__tp_t *tp, const baton__tp_mem_params_t *prm, baton__tp_mr_t **mr_p)
{
    if (prm->kind != BATON_XFER_MEM_HOST &&
        (prm->kind != BATON_XFER_MEM_CUDA || tcp_stage_reg(prm->addr, prm->len) != 0))
        return BATON_ENOTSUP;
    tcp_mr_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return BATON_ENOMEM;
    m->base.addr = prm->addr;
    m->base.len = prm->len;
    m->base.kind = prm->kind;
    *mr_p = &m->base;
    return 0;
}

static int tcp_mem_key(baton__tp_mr_t *mr, uint8_t *buf, size_t cap, size_t *len_p)
{
    *len_p = 0; /* the receiver checks bounds itself; nothing to hand out */
    return 0;
}

static int tcp_mem_dereg(baton__tp_mr_t *mr)
{
    free(mr);
    return 0;
}

static int tcp_peer_create(baton__tp_t *tp, baton__tp_role_t role, uint64_t generation,
                           baton__tp_peer_t **peer_p)
{
    tcp_peer_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return BATON_ENOMEM;
    p->base.tp = tp;
    p->base.role = role;
    p->base.generation = generation;
    uint32_t lanes = tp->env->cfg->lanes;
    p->n_lanes = lanes == 0 ? 4 : lanes > MAX_LANES ? MAX_LANES : lanes;
    for (uint32_t i = 0; i < MAX_LANES; i++) {
        p->lanes[i].peer = p;
        p->lanes[i].index = i;
    }
    tcp_stage_init(&p->stage, tp->env, role == BATON__TP_ROLE_TARGET,
                   baton__tcp_slice_size(tp->env), MAX_LANES);
    if (role == BATON__TP_ROLE_TARGET) {
        p->scratch = malloc(SCRATCH);
        p->ack_flush = malloc(sizeof(*p->ack_flush));
        if (p->scratch == NULL || p->ack_flush == NULL) {
            free(p->scratch);
            free(p->ack_flush);
            free(p);
            return BATON_ENOMEM;
        }
        uv_check_init(tp->env->loop, p->ack_flush);
        p->ack_flush->data = p;
        p->open_handles++;
    }
    *peer_p = &p->base;
    return 0;
}

static int tcp_peer_info(baton__tp_peer_t *tpp, uint8_t *buf, size_t cap, size_t *len_p)
{
    tcp_peer_t *p = (tcp_peer_t *)tpp;
    if (cap < 2)
        return BATON_ETOOBIG;
    buf[0] = TCP_BLOB_VERSION;
    buf[1] = (uint8_t)p->n_lanes;
    *len_p = 2;
    return 0;
}

static void deferred_done(void *arg)
{
    tcp_peer_t *p = arg;
    baton__tp_done_cb cb = p->deferred_cb;
    p->deferred_cb = NULL;
    if (cb != NULL)
        cb(&p->base, p->deferred_status, p->deferred_arg);
}

static int tcp_peer_connect(baton__tp_peer_t *tpp, const uint8_t *blob, size_t len,
                            baton__tp_done_cb cb, void *arg)
{
    tcp_peer_t *p = (tcp_peer_t *)tpp;
    if (len != 2 || blob[0] != TCP_BLOB_VERSION || blob[1] == 0 || blob[1] > MAX_LANES)
        return BATON_EPROTO;
    if (p->base.role == BATON__TP_ROLE_INITIATOR) {
        /* The target decides how many lanes it opens (at most what we allow). */
        if (blob[1] > p->n_lanes)
            return BATON_EPROTO;
        p->n_lanes = blob[1];
        p->deferred_cb = cb;
        p->deferred_arg = arg;
        p->deferred_status = 0;
        return baton__tp_defer(p->base.tp->env, deferred_done, p);
    }
    /* TARGET: open the lanes to where the control connection goes. */
    if (blob[1] < p->n_lanes)
        p->n_lanes = blob[1];
    uv_loop_t *loop = p->base.tp->env->loop;
    p->connect_cb = cb;
    p->connect_arg = arg;
    for (uint32_t i = 0; i < p->n_lanes; i++) {
        tcp_lane_t *l = &p->lanes[i];
        l->tcp = malloc(sizeof(*l->tcp));
        if (l->tcp == NULL) {
            p->connect_cb = NULL;
            return BATON_ENOMEM; /* lanes already opened close in peer_fence */
        }
        uv_tcp_init(loop, l->tcp);
        l->tcp->data = l;
        p->open_handles++;
        LANE_MOVE(l, LANE_CONNECTING);
        l->creq.data = l;
        int rc = uv_tcp_connect(&l->creq, l->tcp, (const struct sockaddr *)&p->base.remote_addr,
                                lane_connected);
        if (rc != 0) {
            p->connect_cb = NULL;
            return rc;
        }
    }
    return 0;
}

static int tcp_peer_fence(baton__tp_peer_t *tpp, baton__tp_done_cb cb, void *arg)
{
    tcp_peer_t *p = (tcp_peer_t *)tpp;
    if (p->fencing)
        return BATON_EBUSY;
    p->fencing = 1;
    p->connect_cb = NULL;
    p->fence_cb = cb;
    p->fence_arg = arg;
    int any = 0;
    for (uint32_t i = 0; i < MAX_LANES; i++) {
        tcp_lane_t *l = &p->lanes[i];
        if (l->tcp != NULL && !uv_is_closing((uv_handle_t *)l->tcp)) {
            /* No read callback runs after this: nothing more lands in our pages. */
            uv_close((uv_handle_t *)l->tcp, lane_closed);
            any = 1;
        }
    }
    if (p->ack_flush != NULL && !uv_is_closing((uv_handle_t *)p->ack_flush)) {
        /* Buffered WACKs are dropped: the lanes are gone, the initiator fails those writes. */
        uv_close((uv_handle_t *)p->ack_flush, ack_flush_closed);
        any = 1;
    }
    if (!any) /* no lane was ever opened: finish from a defer, never inline */
        return baton__tp_defer(p->base.tp->env, fence_complete, p);
    return 0;
}

static void tcp_peer_destroy(baton__tp_peer_t *tpp)
{
    tcp_peer_t *p = (tcp_peer_t *)tpp;
    if (p->ack_flush != NULL) {
        /* Never fenced (never connected): the handle outlives p until its close callback. */
        p->ack_flush->data = NULL;
        if (!uv_is_closing((uv_handle_t *)p->ack_flush))
            uv_close((uv_handle_t *)p->ack_flush, free_handle);
    }
    tcp_stage_fini(&p->stage);
    free(p->scratch);
    free(p);
}

static int tcp_mem_add(baton__tp_peer_t *peer, uint32_t mem_id, uint64_t base, uint64_t len,
                       baton_xfer_mem_kind_t kind, const uint8_t *blob, size_t blob_len)
{
    /* device pages: the peer fills them from its bounce buffers (tcp_stage.h) */
    return kind == BATON_XFER_MEM_HOST || (kind == BATON_XFER_MEM_CUDA && TCP_STAGE_CUDA)
               ? 0
               : BATON_ENOTSUP;
}

static int tcp_mem_del(baton__tp_peer_t *peer, uint32_t mem_id)
{
    return 0;
}

const baton__tp_ops_t baton__tp_tcp_ops = {
    .name = "tcp",
    .id = BATON_XFER_TRANSPORT_TCP,
    .init = tcp_init,
    .fini = tcp_fini,
    .query = tcp_query,
    .mem_reg = tcp_mem_reg,
    .mem_key = tcp_mem_key,
    .mem_dereg = tcp_mem_dereg,
    .peer_create = tcp_peer_create,
    .peer_info = tcp_peer_info,
    .peer_connect = tcp_peer_connect,
    .mem_add = tcp_mem_add,
    .mem_del = tcp_mem_del,
    .write = baton__tcp_write,
    .read = baton__tp_notsup_read, /* tcp pulls are served by the holder's writes */
    .flush = baton__tp_notsup_flush,
    .peer_fence = tcp_peer_fence,
    .peer_destroy = tcp_peer_destroy,
    .adopt_lane = tcp_adopt_lane,
};
