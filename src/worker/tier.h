/* tier.h — HiCache's L2 and L3 in baton-worker: the host page pool and baton-store behind the
 * prefix cache (L1), the lookup and prefetch before prefill, the writes after it, their metrics.
 * Private to src/worker. */
#ifndef BATON_WORKER_TIER_H
#define BATON_WORKER_TIER_H

#include <stdint.h>

#include "worker/tier_policy.h"

/*
 * Everything runs on the worker's loop thread (the store client's callbacks come there too),
 * except the whole-page work — L2 fills, page checks, L2-to-room copies — which runs on libuv's
 * thread pool while the pages it touches are pinned or FILLING.
 *
 * Lifetimes: a lookup (one per job) and a write (one per sequence's pages) are objects of their
 * own, each with an in-flight count of the store calls it started; they hold pins on the L2
 * slots the store reads or writes. A job that goes away (abort, failure) detaches from its
 * lookup; the lookup is freed, and its slots unpinned, only when its count reaches zero (store
 * calls, thread-pool checks and room copies, and a wait for another request's copy all count),
 * so no late callback ever finds freed memory or a slot reused under a transfer or a copy.
 */

typedef struct wk_tier_cfg_s {
    int decode_offload;   /* decode: offload each request's KV to L2 / L3 (offload.h) */
    uint64_t l2_bytes;    /* 0: no L2 (and no L3: the store reads and writes L2 pages) */
    const char *store;    /* "H:P" or "etcd://h:p/prefix"; NULL: no L3 */
    const char *store_ns; /* NULL: "default" */
    unsigned tp_rank;     /* in the object names */
    wk_wp_policy_t write_policy;
    wk_pf_policy_t prefetch_policy;
    wk_pf_cfg_t pf;
} wk_tier_cfg_t;

typedef struct wk_tier_s wk_tier_t;
struct wk_worker_s;
struct wk_job_s;
struct wk_sstate_s;

/* Creates L2 (and the store client when cfg.store). 0 or an error (logged). */
int wk_tier_create(wk_tier_t **t_p, struct wk_worker_s *w);
/* Every job is gone. Store calls in flight end with the client's shutdown; cb runs after. */
void wk_tier_close(wk_tier_t *t, void (*cb)(void *arg), void *arg);

/* Looks every sequence's pages past its L1 hit up in L2, then L3 (batch exists), fetching an L3
 * prefix into L2 under the prefetch policy. Sets the items' per-tier counts and cached_tokens.
 * Returns 1 when then(job) ran (everything was local) or runs later, 0 when the lookup could not
 * start (out of memory, closing): the caller goes on itself. */
int wk_tier_lookup(wk_tier_t *t, struct wk_job_s *job, void (*then)(struct wk_job_s *job));
/* The job goes away: its lookup (if any) carries on without it. */
void wk_tier_detach(wk_tier_t *t, struct wk_job_s *job);
/* The sequence's prompt KV was computed: its pages go to L2 / L3 as the write policy says. */
void wk_tier_store(wk_tier_t *t, struct wk_sstate_s *ss);
/* Writes the pages of ids[0..n). */
void wk_tier_store_ids(wk_tier_t *t, const int64_t *ids, uint32_t n);

/* Decode offload: starts the offload thread once the KV pool exists (decode mode). */
int wk_tier_offload_start(wk_tier_t *t);
/* A decode sequence starts decoding (its KV verified in its pages): its prompt goes out. */
void wk_tier_offload_seq_begin(wk_tier_t *t, struct wk_sstate_s *ss);
/* It ended (finished: its generated tokens' pages too); its object goes after its copies. */
void wk_tier_offload_seq_end(wk_tier_t *t, struct wk_sstate_s *ss, int finished);

#endif
