/* pd_vllm_mooncake.c — vLLM's Mooncake PD protocol: one transfer_id for both legs, sent at
 * once, the decode naming the prefill's engine (and its DP rank's engine). */
#include "router/dataplane/proxy_pd.h"

#include <stdio.h>

#include "baton/error.h"
#include "common/log.h"
#include "router/dataplane/dp_rank.h"
#include "router/dataplane/pdproto.h"

/* A retry is a new transfer with a new id (the old prefill may still push for the old one). A
 * data-parallel prefill runs it on the rank the router picks: the prefill leg carries
 * X-data-parallel-rank (vLLM's API server routes by it) and the decode names that rank's engine,
 * {engine_id}_dp{rank} (what vLLM's DP engine cores register with the Mooncake bootstrap server;
 * docs/PROTOCOLS.md §3). */
static int build(baton__preq_t *pr)
{
    baton__upstream_t *p = pr->up[UP_PREFILL], *d = pr->up[UP_MAIN];
    baton__pd_request_id_init(pr);
    /* vLLM merges no prompt logprobs across legs: decode's answer is the client's as is. */
    pr->pd.logprobs = 0;
    pr->lp_ready = 0;
    char xfer[96], engine[320];
    snprintf(xfer, sizeof(xfer), "xfer-%s-%u", pr->reqid, pr->attempts);
    snprintf(engine, sizeof(engine), "%s", p->w->engine_id);
    if (p->w->dp_size > 1) {
        int rank = baton_dp_pick(p->w, baton__pd_dp_round_robin(pr));
        baton__pd_dp_hold(p, rank);
        snprintf(p->dp_hdr, sizeof(p->dp_hdr), "%d", rank);
        snprintf(engine, sizeof(engine), "%.300s_dp%d", p->w->engine_id, rank);
    }
    baton_buf_t pb = BATON_BUF_INIT, db = BATON_BUF_INIT;
    int rc = baton_pdproto_mooncake(&pr->pd, xfer, engine, p->w->bootstrap_addr, &pb, &db);
    if (!rc && (!(p->body = baton__pd_body_new(&pb, 1)) || !(d->body = baton__pd_body_new(&db, 1))))
        rc = BATON_ENOMEM;
    baton_buf_free(&pb);
    baton_buf_free(&db);
    log_debug("router",
              "dispatch route=%s protocol=vllm-mooncake prefill=%s transfer_id=%s engine=%s",
              pr->route, p->w->url, xfer, engine);
    return rc;
}

static int dispatch(baton__preq_t *pr)
{
    return baton__pd_send_legs(pr, "mooncake_dispatch");
}

const baton__pd_ops_t baton__pd_vllm_mooncake = {
    .name = "vllm-mooncake",
    .build = build,
    .dispatch = dispatch,
    .on_prefill_done = baton__pd_no_prefill_step,
    .on_decode_progress = baton__pd_no_progress,
    .release = baton__pd_no_release,
    .alone = baton__pd_alone_send,
};
