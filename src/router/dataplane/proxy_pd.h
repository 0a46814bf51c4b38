/* proxy_pd.h — the PD protocols behind one ops table (SGLang, SGLang with DP attention,
 * vLLM NIXL, vLLM Mooncake), one implementation per file, chosen once per attempt. */
#ifndef BATON_ROUTER_PROXY_PD_H
#define BATON_ROUTER_PROXY_PD_H

#include "router/dataplane/proxy_internal.h"

/*
 * A PD attempt is a prefill and a decode picked together (same protocol: proxy_dispatch.c).
 * baton__pd_ops_for() picks the protocol's table from the pair once, when the attempt starts;
 * the generic handlers (proxy.c, proxy_dispatch.c) then call only through the table, so a new
 * protocol is one new file and one line in baton__pd_ops_for. Every entry is set: a protocol
 * without a step points at the baton__pd_no_* stub, never NULL (as transfer/transport.h).
 */
struct baton__pd_ops_s {
    const char *name; /* the pd_protocol value, or "sglang-dp" */
    /* Builds the attempt's leg bodies into up[]'s `body` (a leg sent later keeps NULL) and
     * says which answers to buffer. 0 or BATON_ENOMEM; nothing is sent yet. */
    int (*build)(baton__preq_t *pr);
    /* Sends what build made (phase SENT). 0 or BATON_ENOMEM; a send failure goes through
     * baton__side_failed. */
    int (*dispatch)(baton__preq_t *pr);
    /* The prefill answered 2xx: 1 when the protocol takes the next step itself (vllm-nixl's
     * decode leg), 0 when the prefill's answer is final and is relayed as usual. */
    int (*on_prefill_done)(baton__preq_t *pr, baton__upstream_t *p);
    /* The decode produced bytes or answered 2xx: it has read the prefill's KV. */
    void (*on_decode_progress)(baton__preq_t *pr);
    /* p is freed while still `held`: its worker keeps KV for a decode that never read it. */
    void (*release)(baton__upstream_t *p);
    /* The decode alone (up[UP_MAIN]; no prefill leg): the decode already holds all but a few
     * tokens of the prompt (--pd-uncached-token-threshold), so it computes the rest itself.
     * vLLM's decode does that for a request without kv_transfer_params, so the vLLM protocols
     * send the client's request as it came (baton__pd_alone_send); an SGLang decode needs a
     * bootstrap for every request, so SGLang's tables point at baton__pd_no_alone and the
     * request takes both legs as usual. 0, or a send failure gone through
     * baton__side_failed. */
    int (*alone)(baton__preq_t *pr);
};

extern const baton__pd_ops_t baton__pd_sglang, baton__pd_sglang_dp, baton__pd_vllm_nixl,
    baton__pd_vllm_mooncake;

/* The protocol of the pair (prefill p, decode d): the one choice per attempt. */
const baton__pd_ops_t *baton__pd_ops_for(const baton_worker_t *p, const baton_worker_t *d);

/* ---- proxy_pd.c: what the protocols share ---- */

/* A leg's body, taking buf's bytes (buf is left empty); NULL when out of memory. */
baton__body_t *baton__pd_body_new(baton_buf_t *buf, unsigned refs);
/* Moves to SENT and sends the prefill leg, then the decode leg when it has a body and the
 * attempt still stands. 0 (a send failure went through baton__side_failed). */
int baton__pd_send_legs(baton__preq_t *pr, const char *why);
/* Sends one leg with its body; a failure goes through baton__side_failed. */
void baton__pd_up_send(baton__preq_t *pr, baton__upstream_t *u);
/* The attempt holds an in-flight count on the upstream's DP rank until it settles. */
void baton__pd_dp_hold(baton__upstream_t *u, int rank);
/* --dp-round-robin: ranks taken in turn rather than least loaded. */
int baton__pd_dp_round_robin(const baton__preq_t *pr);
/* vLLM protocols: the id both legs carry (X-Request-Id), set once per request. */
void baton__pd_request_id_init(baton__preq_t *pr);
/* The stubs of a step a protocol does not have. */
int baton__pd_no_prefill_step(baton__preq_t *pr, baton__upstream_t *p);
void baton__pd_no_progress(baton__preq_t *pr);
void baton__pd_no_release(baton__upstream_t *p);
/* The decode alone: the client's body to up[UP_MAIN], relayed as a regular worker's answer. */
int baton__pd_alone_send(baton__preq_t *pr);
/* The stub of a protocol whose decode cannot serve a request alone (never called). */
int baton__pd_no_alone(baton__preq_t *pr);

#endif
