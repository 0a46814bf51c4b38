/* transfer/tcp.c — the tcp transport: several lanes per peer, the receiver reads each payload
 * straight into its destination page (device pages through tcp_stage.c's bounce buffers), every
 * slice acknowledged before a write completes. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/phase.h"
#include "transfer/ctrl_frame.h"
#include "transfer/tcp_stage.h"
#include "transfer/transport.h"

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

#define TCP_BLOB_VERSION 1
#define MAX_LANES        16
#define LANE_WINDOW      (8u << 20) /* bytes in flight per lane */
#define SCRATCH          (64u * 1024)
#define LANE_ACK_SIZE    (BATON__FRAME_HDR + 8)
#define ACK_BATCH        64 /* WACKs buffered per lane before a forced flush */

typedef struct tcp_peer_s tcp_peer_t;
typedef struct tcp_lane_s tcp_lane_t;

typedef struct {
    baton__tp_t base;
} tcp_tp_t;

typedef struct {
    baton__tp_mr_t base;
} tcp_mr_t;

/* One slice of a write: header + data, sent on one lane, acknowledged by one WACK. */
typedef struct tcp_slice_s {
    struct tcp_slice_s *next; /* pending queue or a lane's in-flight FIFO */
    uv_write_t req;
    uint8_t hdr[BATON__WRITE_HDR];
    baton__tp_write_t *w;
    const uint8_t *src;
    uint8_t *stage; /* device source: its pinned copy, held until the write callback */
    uint64_t dst;
    uint32_t page;
    uint32_t len;
    uint32_t seq;
    uint8_t dev;     /* the source is device memory */
    uint8_t written; /* libuv's write callback ran (or the slice was never sent) */
    uint8_t acked;   /* its WACK arrived (or it was cancelled) */
    int status;
} tcp_slice_t;

/* Per write request bookkeeping, kept in w->priv. */
typedef struct {
    tcp_slice_t *slices;
    uint32_t left; /* slices not finished */
    int status;    /* first error */
} tcp_wstate_t;

typedef struct {
    tcp_slice_t *head, *tail;
} slice_q_t;

/* A lane's phases (only LANE_MOVE changes them): the initiator's NONE -> CONNECTING -> HELLO ->
 * READY, the target's NONE -> READY (a lane handed over by the engine); any -> CLOSED. */
enum { LANE_NONE = 0, LANE_CONNECTING, LANE_HELLO, LANE_READY, LANE_CLOSED, LANE_N_STATES };
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
static const baton_phase_table_t lane_phases = {"xfer", "tcp_lane", LANE_N_STATES, lane_legal,
                                                lane_names};
#define LANE_MOVE(l, to)                                                                           \
    (void)BATON_PHASE_MOVE(&lane_phases, (l)->state, (to), "lane=%" PRIu32, (l)->index)
enum { RD_HDR = 0, RD_DATA, RD_DISCARD, RD_STAGE };

struct tcp_lane_s {
    tcp_peer_t *peer;
    uv_tcp_t *tcp;
    uv_connect_t creq;
    uv_write_t hreq;
    uint32_t index;
    int state;
    /* initiator */
    slice_q_t inflight;
    uint64_t inflight_bytes;
    uint32_t next_seq;
    /* reading */
    uint8_t rbuf[4096];
    size_t rlen;
    int rstate;
    uint8_t *dst;
    uint64_t left;
    uint8_t *stage;   /* RD_STAGE: the chunk the payload is read into, then copied to dst */
    size_t stage_len; /* bytes in it not copied yet */
    uint32_t wseq;
    uint64_t wroom;
    uint32_t wlen;
    int wstatus;
    uint8_t hello[BATON__FRAME_HDR + 20];
    /* target: WACKs of finished slices not sent yet (flushed by the peer's ack_flush) */
    size_t acks_len;
    uint8_t acks[ACK_BATCH * BATON__WACK_SIZE];
};

struct tcp_peer_s {
    baton__tp_peer_t base;
    uint32_t n_lanes;
    uint32_t lanes_ready;
    tcp_lane_t lanes[MAX_LANES];
    baton__tp_done_cb connect_cb;
    void *connect_arg;
    slice_q_t pending;
    int failed;
    int fencing;
    int open_handles;
    baton__tp_done_cb fence_cb;
    void *fence_arg;
    uint8_t *scratch;
    tcp_stage_t stage;     /* device memory: pinned bounce chunks (tcp_stage.h) */
    uv_check_t *ack_flush; /* target: sends the buffered WACKs once per loop iteration */
    int ack_flush_on;
    baton__tp_done_cb deferred_cb; /* for the connect / fence callbacks run from a defer */
    void *deferred_arg;
    int deferred_status;
};

static void q_push(slice_q_t *q, tcp_slice_t *s)
{
    s->next = NULL;
    if (q->tail)
        q->tail->next = s;
    else
        q->head = s;
    q->tail = s;
}

static tcp_slice_t *q_pop(slice_q_t *q)
{
    tcp_slice_t *s = q->head;
    if (s) {
        q->head = s->next;
        if (q->head == NULL)
            q->tail = NULL;
        s->next = NULL;
    }
    return s;
}

static const baton__tp_env_t *env_of(tcp_peer_t *p)
{
    return p->base.tp->env;
}

/* ---- failure ----------------------------------------------------------------------------- */

static void failed_deferred(void *arg)
{
    tcp_peer_t *p = arg;
    if (!p->fencing)
        env_of(p)->peer_failed(&p->base, p->failed);
}

static void peer_fail(tcp_peer_t *p, int err, const char *why)
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

/* ---- slices and write requests ------------------------------------------------------------ */

static void slice_finish(tcp_slice_t *s)
{
    if (!s->written || !s->acked)
        return;
    baton__tp_write_t *w = s->w;
    tcp_wstate_t *ws = (tcp_wstate_t *)w->priv;
    if (s->status != 0 && ws->status == 0)
        ws->status = s->status;
    if (--ws->left == 0) {
        free(ws->slices);
        ws->slices = NULL;
        w->cb(w, ws->status);
    }
}

static void pump(tcp_peer_t *p);

static void on_slice_written(uv_write_t *req, int status)
{
    tcp_slice_t *s = container_of(req, tcp_slice_t, req);
    tcp_lane_t *lane = req->data;
    tcp_peer_t *p = lane->peer;
    int staged = s->stage != NULL;
    if (staged) {
        /* the kernel holds the bytes now: the chunk may carry the next device slice */
        tcp_stage_put(&p->stage, s->stage);
        s->stage = NULL;
    }
    s->written = 1;
    if (status < 0 && s->status == 0)
        s->status = BATON_EPEERDOWN;
    if (status < 0 && status != UV_ECANCELED)
        peer_fail(p, BATON_EPEERDOWN, uv_strerror(status));
    slice_finish(s);
    if (staged)
        pump(p); /* device slices may be waiting for a chunk */
}

static tcp_lane_t *pick_lane(tcp_peer_t *p, uint32_t len)
{
    tcp_lane_t *best = NULL;
    for (uint32_t i = 0; i < p->n_lanes; i++) {
        tcp_lane_t *l = &p->lanes[i];
        if (l->state != LANE_READY)
            continue;
        if (l->inflight_bytes != 0 && l->inflight_bytes + len > LANE_WINDOW)
            continue;
        if (best == NULL || l->inflight_bytes < best->inflight_bytes)
            best = l;
    }
    return best;
}

static void pump(tcp_peer_t *p)
{
    while (p->pending.head != NULL && !p->failed && !p->fencing) {
        tcp_slice_t *s = p->pending.head;
        tcp_wstate_t *ws = (tcp_wstate_t *)s->w->priv;
        if (ws->status != 0) {
            /* The request already failed (the target refused a slice): skip the rest. */
            q_pop(&p->pending);
            s->written = s->acked = 1;
            s->status = ws->status;
            slice_finish(s);
            continue;
        }
        tcp_lane_t *l = pick_lane(p, s->len);
        if (l == NULL)
            return;
        const uint8_t *data = s->src;
        if (s->dev) {
            int err = tcp_stage_source(&p->stage, s->src, s->len, &s->stage);
            if (err == 0 && s->stage == NULL)
                return; /* every chunk is on the wire: on_slice_written pumps again */
            if (err != 0) {
                /* this write fails (the rest of its slices are skipped above); the peer stays */
                q_pop(&p->pending);
                s->written = s->acked = 1;
                s->status = err;
                slice_finish(s);
                continue;
            }
            data = s->stage;
        }
        q_pop(&p->pending);
        s->seq = l->next_seq++;
        baton__enc_write_hdr(s->hdr, s->w->room_id, s->dst, s->page, s->seq, s->len);
        uv_buf_t bufs[2] = {uv_buf_init((char *)s->hdr, BATON__WRITE_HDR),
                            uv_buf_init((char *)data, s->len)};
        s->req.data = l;
        int rc = uv_write(&s->req, (uv_stream_t *)l->tcp, bufs, 2, on_slice_written);
        if (rc != 0) {
            if (s->stage != NULL)
                tcp_stage_put(&p->stage, s->stage);
            s->stage = NULL;
            s->written = 1;
            s->acked = 1;
            s->status = BATON_EPEERDOWN;
            slice_finish(s);
            peer_fail(p, BATON_EPEERDOWN, uv_strerror(rc));
            return;
        }
        q_push(&l->inflight, s);
        l->inflight_bytes += s->len;
    }
}

/* The bytes of one WRITE frame's payload (a device slice's chunk has this size). */
static uint64_t tcp_slice_size(const baton__tp_env_t *env)
{
    uint64_t slice = env->cfg->slice_size;
    return slice == 0 || slice > BATON__WRITE_DATA_MAX ? 64 * 1024 : slice;
}

static int tcp_write(baton__tp_peer_t *tpp, baton__tp_write_t *w)
{
    tcp_peer_t *p = (tcp_peer_t *)tpp;
    if (p->failed || p->fencing)
        return BATON_EPEERDOWN;
    uint64_t slice = tcp_slice_size(env_of(p));
    uint64_t n = 0;
    for (size_t i = 0; i < w->n_sges; i++) {
        if (w->sges[i].len == 0)
            return BATON_EINVAL;
        n += (w->sges[i].len + slice - 1) / slice;
    }
    if (n == 0 || n > UINT32_MAX)
        return BATON_EINVAL;
    tcp_slice_t *slices = calloc(n, sizeof(*slices));
    if (slices == NULL)
        return BATON_ENOMEM;
    _Static_assert(sizeof(tcp_wstate_t) <= sizeof(w->priv), "priv too small");
    tcp_wstate_t *ws = (tcp_wstate_t *)w->priv;
    ws->slices = slices;
    ws->left = (uint32_t)n;
    ws->status = 0;
    size_t k = 0;
    for (size_t i = 0; i < w->n_sges; i++) {
        const baton__tp_sge_t *g = &w->sges[i];
        for (uint64_t off = 0; off < g->len; off += slice) {
            tcp_slice_t *s = &slices[k++];
            s->w = w;
            s->src = (const uint8_t *)g->src + off;
            s->dev = g->src_mr != NULL && g->src_mr->kind == BATON_XFER_MEM_CUDA;
            s->dst = g->dst + off;
            s->page = g->dst_page;
            s->len = (uint32_t)(g->len - off < slice ? g->len - off : slice);
            q_push(&p->pending, s);
        }
    }
    pump(p);
    return 0;
}

/* ---- reading --------------------------------------------------------------------------- */

typedef struct {
    uv_write_t req;
    uint8_t data[]; /* the unsent rest of the frame(s) */
} small_req_t;

static void small_sent(uv_write_t *req, int status)
{
    free(container_of(req, small_req_t, req));
}

static void send_small(tcp_lane_t *l, const uint8_t *frame, size_t len)
{
    uv_buf_t b = uv_buf_init((char *)frame, (unsigned)len);
    int n = uv_try_write((uv_stream_t *)l->tcp, &b, 1);
    if (n == (int)len)
        return;
    if (n < 0 && n != UV_EAGAIN) {
        peer_fail(l->peer, BATON_EPEERDOWN, uv_strerror(n));
        return;
    }
    size_t done = n > 0 ? (size_t)n : 0;
    small_req_t *r = malloc(sizeof(*r) + (len - done));
    if (r == NULL) {
        peer_fail(l->peer, BATON_ENOMEM, "out of memory queueing an ack");
        return;
    }
    memcpy(r->data, frame + done, len - done);
    b = uv_buf_init((char *)r->data, (unsigned)(len - done));
    int rc = uv_write(&r->req, (uv_stream_t *)l->tcp, &b, 1, small_sent);
    if (rc != 0) {
        free(r);
        peer_fail(l->peer, BATON_EPEERDOWN, uv_strerror(rc));
    }
}

static void lane_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    tcp_lane_t *l = h->data;
    tcp_peer_t *p = l->peer;
    if (p->base.role == BATON__TP_ROLE_TARGET && l->state == LANE_READY) {
        if (l->rstate == RD_DATA) {
            /* Straight into the destination page. */
            size_t n = l->left > (1u << 30) ? (1u << 30) : (size_t)l->left;
            *buf = uv_buf_init((char *)l->dst, (unsigned)n);
            return;
        }
        if (l->rstate == RD_STAGE) {
            /* Into the lane's chunk, at most to its end; lane_read copies it to the device. */
            size_t room = p->stage.chunk - l->stage_len;
            size_t n = l->left > room ? room : (size_t)l->left;
            *buf = uv_buf_init((char *)l->stage + l->stage_len, (unsigned)n);
            return;
        }
        if (l->rstate == RD_DISCARD) {
            size_t n = l->left > SCRATCH ? SCRATCH : (size_t)l->left;
            *buf = uv_buf_init((char *)p->scratch, (unsigned)n);
            return;
        }
        /* Exactly the rest of the next WRITE header, so no payload byte is read here. */
        *buf = uv_buf_init((char *)l->rbuf + l->rlen, (unsigned)(BATON__WRITE_HDR - l->rlen));
        return;
    }
    if (p->base.role == BATON__TP_ROLE_TARGET) {
        /* Before READY only the LANE_ACK comes: read exactly it. */
        *buf = uv_buf_init((char *)l->rbuf + l->rlen, (unsigned)(LANE_ACK_SIZE - l->rlen));
        return;
    }
    *buf = uv_buf_init((char *)l->rbuf + l->rlen, (unsigned)(sizeof(l->rbuf) - l->rlen));
}

static void target_payload_done(tcp_lane_t *l);

static void target_write_header(tcp_lane_t *l)
{
    tcp_peer_t *p = l->peer;
    baton__frame_t f;
    size_t used;
    const char *why = NULL;
    int rc = baton__frame_decode(l->rbuf, l->rlen, &f, &used, &why);
    if (rc != 0 || f.type != BATON__F_WRITE || used != BATON__WRITE_HDR) {
        peer_fail(p, BATON_EPROTO, rc < 0 ? why : "expected a WRITE frame on a lane");
        return;
    }
    l->rlen = 0;
    l->wseq = f.u.write.seq;
    l->wroom = f.u.write.room;
    l->wlen = f.u.write.data_len;
    l->left = f.u.write.data_len;
    void *dst = NULL;
    baton_xfer_mem_kind_t kind = BATON_XFER_MEM_HOST;
    rc = env_of(p)->resolve_dst(&p->base, f.u.write.room, f.u.write.page, f.u.write.addr,
                                f.u.write.data_len, &dst, &kind);
    if (rc == 0 && kind == BATON_XFER_MEM_CUDA) {
        /* one chunk per lane: the pool's bound is the lane count, so only errors return NULL */
        l->stage = tcp_stage_get(&p->stage, dst, &rc);
        if (l->stage == NULL && rc == 0)
            rc = BATON_ENOMEM;
        l->stage_len = 0;
    }
    l->wstatus = rc;
    if (rc == 0) {
        l->dst = dst;
        l->rstate = kind == BATON_XFER_MEM_CUDA ? RD_STAGE : RD_DATA;
    } else {
        l->rstate = RD_DISCARD;
    }
}

/* RD_STAGE: nread more bytes are in the lane's chunk. A full chunk, or the slice's last bytes,
 * go to the device page now; the slice ends (and may be acknowledged) only after that. */
static void target_staged(tcp_lane_t *l, size_t nread)
{
    tcp_peer_t *p = l->peer;
    l->left -= nread;
    int rc = tcp_stage_arrived(&p->stage, l->stage, &l->stage_len, nread, &l->dst, l->left);
    if (rc != 0 || l->left == 0) {
        tcp_stage_put(&p->stage, l->stage);
        l->stage = NULL;
    }
    if (rc != 0) {
        l->wstatus = rc; /* its WACK carries the error; the rest of the payload is drained */
        l->rstate = RD_DISCARD;
    }
    if (l->left == 0)
        target_payload_done(l);
}

static void flush_acks(tcp_lane_t *l)
{
    size_t n = l->acks_len;
    l->acks_len = 0;
    if (n > 0 && l->tcp != NULL && !uv_is_closing((uv_handle_t *)l->tcp))
        send_small(l, l->acks, n);
}

static void on_ack_flush(uv_check_t *h)
{
    tcp_peer_t *p = h->data;
    uv_check_stop(h);
    p->ack_flush_on = 0;
    for (uint32_t i = 0; i < p->n_lanes && !p->failed && !p->fencing; i++)
        flush_acks(&p->lanes[i]);
}

static void target_payload_done(tcp_lane_t *l)
{
    tcp_peer_t *p = l->peer;
    /* The slice's last byte is in the page: its WACK may go (with the batch). */
    baton__enc_wack_fixed(l->acks + l->acks_len, l->wseq, l->wstatus);
    l->acks_len += BATON__WACK_SIZE;
    l->rstate = RD_HDR;
    if (l->wstatus == 0)
        env_of(p)->placed(&p->base, l->wroom, l->wlen);
    if (l->acks_len == sizeof(l->acks)) {
        flush_acks(l);
    } else if (!p->ack_flush_on) {
        p->ack_flush_on = 1;
        uv_check_start(p->ack_flush, on_ack_flush);
    }
}

static void lane_ready(tcp_lane_t *l)
{
    tcp_peer_t *p = l->peer;
    LANE_MOVE(l, LANE_READY);
    if (++p->lanes_ready == p->n_lanes && p->connect_cb != NULL) {
        baton__tp_done_cb cb = p->connect_cb;
        p->connect_cb = NULL;
        cb(&p->base, 0, p->connect_arg);
    }
}

/* Buffered frames: LANE_ACK on the target before READY, WACKs on the initiator. */
static void parse_small_frames(tcp_lane_t *l)
{
    tcp_peer_t *p = l->peer;
    size_t off = 0;
    while (!p->failed && !p->fencing) {
        baton__frame_t f;
        size_t used;
        const char *why = NULL;
        int rc = baton__frame_decode(l->rbuf + off, l->rlen - off, &f, &used, &why);
        if (rc == 1)
            break;
        if (rc < 0) {
            peer_fail(p, BATON_EPROTO, why);
            return;
        }
        off += used;
        if (p->base.role == BATON__TP_ROLE_TARGET) {
            if (f.type != BATON__F_LANE_ACK || l->state != LANE_HELLO ||
                f.u.lane_ack.lane != l->index || f.u.lane_ack.status != 0) {
                peer_fail(p, BATON_EPROTO, "bad LANE_ACK");
                return;
            }
            l->rlen = 0; /* exactly the ack was read (lane_alloc) */
            lane_ready(l);
            return;
        }
        if (f.type != BATON__F_WACK) {
            peer_fail(p, BATON_EPROTO, "expected WACK on a lane");
            return;
        }
        tcp_slice_t *s = l->inflight.head;
        if (s == NULL || s->seq != f.u.wack.seq) {
            peer_fail(p, BATON_EPROTO, "WACK out of order");
            return;
        }
        q_pop(&l->inflight);
        l->inflight_bytes -= s->len;
        s->acked = 1;
        if (f.u.wack.status != 0 && s->status == 0)
            s->status = f.u.wack.status;
        slice_finish(s);
    }
    if (off > 0) {
        memmove(l->rbuf, l->rbuf + off, l->rlen - off);
        l->rlen -= off;
    }
    pump(p);
}

static void lane_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    tcp_lane_t *l = st->data;
    tcp_peer_t *p = l->peer;
    if (nread < 0) {
        peer_fail(p, BATON_EPEERDOWN,
                  nread == UV_EOF ? "lane closed by peer" : uv_strerror((int)nread));
        return;
    }
    if (nread == 0 || p->failed || p->fencing)
        return;
    if (p->base.role == BATON__TP_ROLE_TARGET && l->state == LANE_READY) {
        switch (l->rstate) {
        case RD_HDR:
            l->rlen += (size_t)nread;
            if (l->rlen == BATON__WRITE_HDR)
                target_write_header(l);
            else if (l->rlen >= BATON__FRAME_HDR) {
                /* Fail fast on garbage instead of waiting for 40 bytes that may never come. */
                baton__frame_t f;
                size_t used;
                const char *why = NULL;
                if (baton__frame_decode(l->rbuf, l->rlen, &f, &used, &why) < 0)
                    peer_fail(p, BATON_EPROTO, why);
            }
            break;
        case RD_STAGE:
            target_staged(l, (size_t)nread);
            break;
        case RD_DATA:
            l->dst += nread;
            /* fall through */
        case RD_DISCARD:
            l->left -= (uint64_t)nread;
            if (l->left == 0)
                target_payload_done(l);
            break;
        }
        return;
    }
    l->rlen += (size_t)nread;
    parse_small_frames(l);
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
            slice_finish(s);
        }
    }
    tcp_slice_t *s;
    while ((s = q_pop(&p->pending)) != NULL) {
        s->acked = s->written = 1;
        s->status = BATON_EPEERDOWN;
        slice_finish(s);
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
        peer_fail(l->peer, BATON_EPEERDOWN, uv_strerror(status));
}

static void lane_connected(uv_connect_t *req, int status)
{
    tcp_lane_t *l = req->data;
    tcp_peer_t *p = l->peer;
    if (p->failed || p->fencing)
        return;
    if (status < 0) {
        peer_fail(p, BATON_EPEERDOWN, uv_strerror(status));
        return;
    }
    uv_tcp_nodelay(l->tcp, 1);
    const baton__tp_env_t *env = env_of(p);
    baton_buf_t b = BATON_BUF_INIT;
    if (baton__enc_lane_hello(&b, env->incarnation, p->base.generation, l->index) != 0 ||
        b.len != sizeof(l->hello)) {
        baton_buf_free(&b);
        peer_fail(p, BATON_ENOMEM, "cannot encode LANE_HELLO");
        return;
    }
    memcpy(l->hello, b.data, sizeof(l->hello));
    baton_buf_free(&b);
    uv_buf_t ub = uv_buf_init((char *)l->hello, sizeof(l->hello));
    l->hreq.data = l;
    LANE_MOVE(l, LANE_HELLO);
    int rc = uv_write(&l->hreq, (uv_stream_t *)l->tcp, &ub, 1, hello_sent);
    if (rc == 0)
        rc = uv_read_start((uv_stream_t *)l->tcp, lane_alloc, lane_read);
    if (rc != 0)
        peer_fail(p, BATON_EPEERDOWN, uv_strerror(rc));
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
    int rc = uv_read_start((uv_stream_t *)stream, lane_alloc, lane_read);
    if (rc != 0) {
        /* The stream is ours now: close it through the normal path. */
        peer_fail(p, BATON_EPEERDOWN, uv_strerror(rc));
        return 0;
    }
    send_small(l, ack, sizeof(ack));
    p->lanes_ready++;
    pump(p);
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
    tcp_stage_init(&p->stage, tp->env, role == BATON__TP_ROLE_TARGET, tcp_slice_size(tp->env),
                   MAX_LANES);
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
    .write = tcp_write,
    .read = baton__tp_notsup_read, /* tcp pulls are served by the holder's writes */
    .flush = baton__tp_notsup_flush,
    .peer_fence = tcp_peer_fence,
    .peer_destroy = tcp_peer_destroy,
    .adopt_lane = tcp_adopt_lane,
};
