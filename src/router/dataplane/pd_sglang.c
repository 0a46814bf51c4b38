/* pd_sglang.c — SGLang's PD protocol: one body with a fresh bootstrap room per prompt, the same
 * bytes sent to the prefill and the decode at once. */
#include "router/dataplane/proxy_pd.h"

#include <stdlib.h>

#include "baton/error.h"
#include "common/log.h"

static int build(baton__preq_t *pr)
{
    baton__upstream_t *p = pr->up[UP_PREFILL], *d = pr->up[UP_MAIN];
    uint64_t rooms_stack[16], *rooms = rooms_stack;
    size_t n = baton_pdreq_n_rooms(&pr->pd);
    if (n > 16 && !(rooms = malloc(n * sizeof(*rooms))))
        return BATON_ENOMEM;
    for (size_t i = 0; i < n; i++)
        rooms[i] = baton_bootstrap_room();
    int rc = baton_pdreq_inject(&pr->pd, p->w->parsed.host, p->w->bootstrap_port, rooms);
    if (rooms != rooms_stack)
        free(rooms);
    if (rc)
        return rc;
    /* this attempt's bytes, shared by both legs: a retry serializes its own */
    baton__body_t *b = baton__pd_body_new(&pr->pd.out, 2);
    if (!b)
        return BATON_ENOMEM;
    p->body = d->body = b;
    p->buffer = pr->pd.logprobs;
    return 0;
}

static int dispatch(baton__preq_t *pr)
{
    baton__pd_send_legs(pr, "pd_dispatch");
    log_debug("router", "dispatch route=%s prefill=%s decode=%s batch=%zu stream=%d attempt=%u",
              pr->route, pr->up[UP_PREFILL]->w->url, pr->up[UP_MAIN]->w->url, pr->pd.batch,
              pr->pd.stream, pr->attempts);
    return 0;
}

const baton__pd_ops_t baton__pd_sglang = {
    .name = "sglang",
    .build = build,
    .dispatch = dispatch,
    .on_prefill_done = baton__pd_no_prefill_step,
    .on_decode_progress = baton__pd_no_progress,
    .release = baton__pd_no_release,
    .alone = baton__pd_no_alone,
};
