/* pd_sglang_dp.c — SGLang's PD protocol with a data-parallel (DP attention) worker in the pair:
 * a rank on each side that can share a bootstrap room, rooms that agree with both, and each leg
 * its own body naming its ranks. */
#include "router/dataplane/proxy_pd.h"

#include <stdlib.h>

#include "baton/error.h"
#include "common/log.h"
#include "router/dataplane/dp_rank.h"
#include "router/dataplane/pdproto.h"

static int build(baton__preq_t *pr)
{
    baton__upstream_t *p = pr->up[UP_PREFILL], *d = pr->up[UP_MAIN];
    int dp_p = p->w->dp_size, dp_d = d->w->dp_size, rank_p, rank_d;
    /* Least loaded (or round robin) per worker over its ranks; the decode's rank is one that can
     * share the room with the prefill's (dp_rank.h, pdproto.h). */
    baton_dp_pick_pair(p->w, d->w, baton__pd_dp_round_robin(pr), &rank_p, &rank_d);
    baton__pd_dp_hold(p, rank_p);
    baton__pd_dp_hold(d, rank_d);
    size_t n = baton_pdreq_n_rooms(&pr->pd);
    uint64_t rooms_stack[16], *rooms = n > 16 ? malloc(n * sizeof(*rooms)) : rooms_stack;
    if (!rooms)
        return BATON_ENOMEM;
    for (size_t i = 0; i < n; i++)
        rooms[i] = baton_pdproto_dp_room(baton_bootstrap_room(), dp_p, rank_p, dp_d, rank_d);
    /* The bootstrap members once, then each leg its own splice with its ranks. */
    baton_buf_t bs = BATON_BUF_INIT;
    int rc =
        baton_pdreq_bootstrap_members(&pr->pd, p->w->parsed.host, p->w->bootstrap_port, rooms, &bs);
    if (rooms != rooms_stack)
        free(rooms);
    baton_buf_t pb = BATON_BUF_INIT, db = BATON_BUF_INIT;
    if (!rc)
        rc = baton_pdproto_dp_body(&pr->pd, bs.data, rank_p, -1, &pb);
    if (!rc)
        rc = baton_pdproto_dp_body(&pr->pd, bs.data, rank_d, rank_p, &db);
    baton_buf_free(&bs);
    p->buffer = pr->pd.logprobs;
    if (!rc && (!(p->body = baton__pd_body_new(&pb, 1)) || !(d->body = baton__pd_body_new(&db, 1))))
        rc = BATON_ENOMEM;
    baton_buf_free(&pb);
    baton_buf_free(&db);
    log_debug("router", "dispatch route=%s dp prefill=%s rank=%d/%d decode=%s rank=%d/%d",
              pr->route, p->w->url, rank_p, dp_p, d->w->url, rank_d, dp_d);
    return rc;
}

static int dispatch(baton__preq_t *pr)
{
    return baton__pd_send_legs(pr, "pd_dispatch_dp");
}

const baton__pd_ops_t baton__pd_sglang_dp = {
    .name = "sglang-dp",
    .build = build,
    .dispatch = dispatch,
    .on_prefill_done = baton__pd_no_prefill_step,
    .on_decode_progress = baton__pd_no_progress,
    .release = baton__pd_no_release,
    .alone = baton__pd_no_alone,
};
