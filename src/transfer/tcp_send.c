/* transfer/tcp_send.c — the tcp transport's sending side: a write cut into slices, striped over
 * the lanes with the fewest bytes in flight within their window, finished by the slices' WACKs. */
#include <stdlib.h>

#include "transfer/tcp_int.h"

void baton__tcp_slice_finish(tcp_slice_t *s)
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
        baton__tcp_peer_fail(p, BATON_EPEERDOWN, uv_strerror(status));
    baton__tcp_slice_finish(s);
    if (staged)
        baton__tcp_pump(p); /* device slices may be waiting for a chunk */
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

void baton__tcp_pump(tcp_peer_t *p)
{
    while (p->pending.head != NULL && !p->failed && !p->fencing) {
        tcp_slice_t *s = p->pending.head;
        tcp_wstate_t *ws = (tcp_wstate_t *)s->w->priv;
        if (ws->status != 0) {
            /* The request already failed (the target refused a slice): skip the rest. */
            q_pop(&p->pending);
            s->written = s->acked = 1;
            s->status = ws->status;
            baton__tcp_slice_finish(s);
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
                baton__tcp_slice_finish(s);
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
            baton__tcp_slice_finish(s);
            baton__tcp_peer_fail(p, BATON_EPEERDOWN, uv_strerror(rc));
            return;
        }
        q_push(&l->inflight, s);
        l->inflight_bytes += s->len;
    }
}

uint64_t baton__tcp_slice_size(const baton__tp_env_t *env)
{
    uint64_t slice = env->cfg->slice_size;
    return slice == 0 || slice > BATON__WRITE_DATA_MAX ? 64 * 1024 : slice;
}

int baton__tcp_write(baton__tp_peer_t *tpp, baton__tp_write_t *w)
{
    tcp_peer_t *p = (tcp_peer_t *)tpp;
    if (p->failed || p->fencing)
        return BATON_EPEERDOWN;
    uint64_t slice = baton__tcp_slice_size(env_of(p));
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
    baton__tcp_pump(p);
    return 0;
}
