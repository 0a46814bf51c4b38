/* transfer/tcp_recv.c — reading a tcp lane: WRITE payloads straight into their pages (staged for
 * device pages, drained when refused), WACKs batched per loop iteration, LANE_ACK and WACKs. */
#include <stdlib.h>
#include <string.h>

#include "transfer/tcp_int.h"

typedef struct {
    uv_write_t req;
    uint8_t data[]; /* the unsent rest of the frame(s) */
} small_req_t;

static void small_sent(uv_write_t *req, int status)
{
    free(container_of(req, small_req_t, req));
}

void baton__tcp_send_small(tcp_lane_t *l, const uint8_t *frame, size_t len)
{
    uv_buf_t b = uv_buf_init((char *)frame, (unsigned)len);
    int n = uv_try_write((uv_stream_t *)l->tcp, &b, 1);
    if (n == (int)len)
        return;
    if (n < 0 && n != UV_EAGAIN) {
        baton__tcp_peer_fail(l->peer, BATON_EPEERDOWN, uv_strerror(n));
        return;
    }
    size_t done = n > 0 ? (size_t)n : 0;
    small_req_t *r = malloc(sizeof(*r) + (len - done));
    if (r == NULL) {
        baton__tcp_peer_fail(l->peer, BATON_ENOMEM, "out of memory queueing an ack");
        return;
    }
    memcpy(r->data, frame + done, len - done);
    b = uv_buf_init((char *)r->data, (unsigned)(len - done));
    int rc = uv_write(&r->req, (uv_stream_t *)l->tcp, &b, 1, small_sent);
    if (rc != 0) {
        free(r);
        baton__tcp_peer_fail(l->peer, BATON_EPEERDOWN, uv_strerror(rc));
    }
}

void baton__tcp_lane_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
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
        baton__tcp_peer_fail(p, BATON_EPROTO, rc < 0 ? why : "expected a WRITE frame on a lane");
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
        baton__tcp_send_small(l, l->acks, n);
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
            baton__tcp_peer_fail(p, BATON_EPROTO, why);
            return;
        }
        off += used;
        if (p->base.role == BATON__TP_ROLE_TARGET) {
            if (f.type != BATON__F_LANE_ACK || l->state != LANE_HELLO ||
                f.u.lane_ack.lane != l->index || f.u.lane_ack.status != 0) {
                baton__tcp_peer_fail(p, BATON_EPROTO, "bad LANE_ACK");
                return;
            }
            l->rlen = 0; /* exactly the ack was read (baton__tcp_lane_alloc) */
            lane_ready(l);
            return;
        }
        if (f.type != BATON__F_WACK) {
            baton__tcp_peer_fail(p, BATON_EPROTO, "expected WACK on a lane");
            return;
        }
        tcp_slice_t *s = l->inflight.head;
        if (s == NULL || s->seq != f.u.wack.seq) {
            baton__tcp_peer_fail(p, BATON_EPROTO, "WACK out of order");
            return;
        }
        q_pop(&l->inflight);
        l->inflight_bytes -= s->len;
        s->acked = 1;
        if (f.u.wack.status != 0 && s->status == 0)
            s->status = f.u.wack.status;
        baton__tcp_slice_finish(s);
    }
    if (off > 0) {
        memmove(l->rbuf, l->rbuf + off, l->rlen - off);
        l->rlen -= off;
    }
    baton__tcp_pump(p);
}

void baton__tcp_lane_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    tcp_lane_t *l = st->data;
    tcp_peer_t *p = l->peer;
    if (nread < 0) {
        baton__tcp_peer_fail(p, BATON_EPEERDOWN,
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
                    baton__tcp_peer_fail(p, BATON_EPROTO, why);
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
