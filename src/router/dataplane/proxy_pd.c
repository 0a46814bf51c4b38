/* proxy_pd.c — what the PD protocols share: choosing a pair's protocol, leg bodies, sending
 * the legs, DP rank holds, the vLLM request id and the stubs of steps a protocol lacks. */
#include "router/dataplane/proxy_pd.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"

static const baton__pd_ops_t *const by_protocol[BATON_PD_COUNT] = {
    [BATON_PD_SGLANG] = &baton__pd_sglang,
    [BATON_PD_VLLM_NIXL] = &baton__pd_vllm_nixl,
    [BATON_PD_VLLM_MOONCAKE] = &baton__pd_vllm_mooncake,
};

const baton__pd_ops_t *baton__pd_ops_for(const baton_worker_t *p, const baton_worker_t *d)
{
    const baton__pd_ops_t *ops = by_protocol[p->pd_protocol];
    /* SGLang with a data-parallel worker on either side: ranks and rooms that agree. (vLLM
     * Mooncake handles a DP prefill itself: the rank rides on a header.) */
    if (ops == &baton__pd_sglang && (p->dp_size > 1 || d->dp_size > 1))
        ops = &baton__pd_sglang_dp;
    return ops;
}

baton__body_t *baton__pd_body_new(baton_buf_t *buf, unsigned refs)
{
    baton__body_t *b = calloc(1, sizeof(*b));
    if (!b)
        return NULL;
    b->buf = *buf;
    *buf = (baton_buf_t)BATON_BUF_INIT;
    b->refs = refs;
    return b;
}

void baton__pd_up_send(baton__preq_t *pr, baton__upstream_t *u)
{
    int rc = baton__up_start(pr, u, "POST", baton_api_path(pr->pd.api), u->body->buf.data,
                             u->body->buf.len);
    if (rc)
        baton__side_failed(pr, u, rc);
}

int baton__pd_send_legs(baton__preq_t *pr, const char *why)
{
    baton__upstream_t *p = pr->up[UP_PREFILL], *d = pr->up[UP_MAIN];
    baton__pr_set_phase(pr, PH_SENT, why);
    baton__pd_up_send(pr, p);
    /* A prefill that could not be sent abandoned or decided the attempt: decode stays home. */
    if (pr->up[UP_MAIN] == d && d->w && d->body && !baton__pr_decided(pr) && pr->phase == PH_SENT)
        baton__pd_up_send(pr, d);
    return 0;
}

void baton__pd_dp_hold(baton__upstream_t *u, int rank)
{
    u->dp_rank = rank;
    u->dp_held = u->w->dp_size > 1;
}

int baton__pd_dp_round_robin(const baton__preq_t *pr)
{
    const baton_config_t *cfg = pr->pl->router->cfg;
    return cfg && cfg->dp_round_robin;
}

/* The client's X-Request-Id is kept when it is a plain token (it names the request in both
 * engines' logs); anything else gets a fresh id. */
void baton__pd_request_id_init(baton__preq_t *pr)
{
    if (pr->reqid[0])
        return;
    const baton_http_header_t *h = baton_http_req_header(pr->req, "X-Request-Id");
    size_t len = h ? strlen(h->value) : 0;
    int ok = len > 0 && len < sizeof(pr->reqid);
    for (size_t i = 0; ok && i < len; i++)
        ok = isalnum((unsigned char)h->value[i]) || strchr("-_.:", h->value[i]);
    if (ok)
        memcpy(pr->reqid, h->value, len + 1);
    else
        snprintf(pr->reqid, sizeof(pr->reqid), "baton-%016" PRIx64, baton_bootstrap_room());
}

int baton__pd_no_prefill_step(baton__preq_t *pr, baton__upstream_t *p)
{
    (void)pr;
    (void)p;
    return 0;
}

void baton__pd_no_progress(baton__preq_t *pr)
{
    (void)pr;
}

void baton__pd_no_release(baton__upstream_t *p)
{
    (void)p;
}

int baton__pd_alone_send(baton__preq_t *pr)
{
    baton__upstream_t *u = pr->up[UP_MAIN];
    pr->borrowed = 1;
    baton__pr_set_phase(pr, PH_SENT, "decode_alone");
    int rc = baton__up_start(pr, u, "POST", baton_api_path(pr->pd.api), pr->req->body,
                             pr->req->body_len);
    if (rc)
        baton__side_failed(pr, u, rc);
    return 0;
}

int baton__pd_no_alone(baton__preq_t *pr)
{
    (void)pr;
    return BATON_ENOTSUP;
}
