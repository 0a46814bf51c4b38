/* router/control/kv_route.h — the router's KV-event subscriptions: one thread that follows the
 * registry, subscribes to every worker's (and DP rank's) KV events, keeps the exact block index
 * the `precise` policy reads, and what /workers and /metrics show of it. */
#ifndef BATON_ROUTER_KV_ROUTE_H
#define BATON_ROUTER_KV_ROUTE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/metrics.h"
#include "router/control/registry.h"

/*
 * Design.
 *
 * One thread of its own runs a zmq_poll loop over the SUB sockets (kvevents/zsock.h); nothing
 * of it runs on the request loops. Every 200 ms, and whenever the registry's generation moves,
 * it compares the subscriptions with the registered workers that name a kv_events_endpoint:
 *   - a new worker gets one subscription per DP rank (dp_size ranks; vLLM's rule: rank r
 *     publishes on the endpoint's TCP port + r, and replays on the replay port + r), each an
 *     index source of its own (kvevents/index.h, 64 sources in all: workers past that are not
 *     indexed, counted in baton_kv_subscriptions{state="no_source"});
 *   - before a subscription counts, it replays its publisher's history from sequence 0
 *     (baton_kvev_sub_sync_start): a router started after the traffic knows what the workers
 *     hold. A replay (this one, or one a sequence gap starts) runs inside the same poll loop,
 *     its socket polled beside the others, for at most replay_timeout_ms (2 s): a worker whose
 *     replay socket does not answer delays no other worker's events.
 *     Only then are the source's bits set in the worker's kv_sources (registry.h), which is
 *     all the request path reads: a worker whose history did not come whole is "partial"
 *     (the blocks it did replay count, its older ones are unknown);
 *   - a removed worker, or a new incarnation of one (the health layer saw it come back: a
 *     restart empties its cache), has its sources cleared and, for a new incarnation, its
 *     subscriptions opened again; a publisher restart or a gap older than the replay buffer
 *     (a RESET from the subscriber) clears the source and goes on.
 * A malformed or hostile stream (an ERROR from the subscriber, a block size other than the
 * index's, more blocks than max_blocks_per_source) drops that subscription: its source is
 * cleared and it is retried after a back-off (health/backoff.h, 200 ms doubling to 30 s); the
 * rest of the router never sees it. Memory per worker is bounded by the decoder's limits (one
 * batch) and max_blocks_per_source (the index).
 *
 * The index is created at the first stored block with that event's block_size; every worker
 * must use the same (a mismatching subscription is dropped as above, with one warning).
 *
 * Threading: the index is read by the request threads under its read-write lock, which the
 * subscription thread holds for at most one slice of BATON_KVIDX_WRITE_SLICE blocks
 * (kvevents/index.h). A worker's kv_sources is an atomic written by the subscription thread
 * before (set) and after (cleared, then the source is emptied) the source's life, so a request
 * never reads a source that belongs to another worker: a source is reused only after its bits
 * were cleared from the old worker. The per-worker figures /workers shows are read under the
 * route's mutex; the counters are atomics.
 */

typedef struct baton_kvroute_s baton_kvroute_t;

typedef struct baton_kvroute_opts_s {
    uint64_t max_blocks_per_source; /* 0: 4 Mi blocks */
    int replay_timeout_ms;          /* one replay (0: 2,000) */
    /* The silent-zero-hits check: a worker whose events never matched any of this many routed
     * requests (it held blocks while they were matched) is reported, once. 0: 100. */
    uint64_t unmatched_after;
    /* The KV store's masters (baton-store --kv-events-endpoint), comma-separated: one more
     * index source, shared by them (a standby publishes nothing; a new leader opens with
     * AllBlocksCleared and republishes what it holds), whose blocks every worker can fetch:
     * they count as L3 on all. NULL: none. The replay endpoints, comma-separated in the same
     * order, may be NULL. */
    const char *store_endpoint;
    const char *store_replay_endpoint;
} baton_kvroute_opts_t;

/* metrics may be NULL (nothing exported). 0, BATON_ENOMEM or BATON_EINVAL. */
int baton_kvroute_create(baton_kvroute_t **out, baton_registry_t *reg, baton_metrics_t *metrics,
                         const baton_kvroute_opts_t *opts);
/* Starts the thread. 0 or a libuv error. */
int baton_kvroute_start(baton_kvroute_t *kr);
/* Stops and joins the thread, closes the sockets, frees everything. NULL is ignored. */
void baton_kvroute_destroy(baton_kvroute_t *kr);

/* ---- the request path (any thread) ---- */

/* The index's block size; 0 before any worker announced a block. */
uint32_t baton_kvroute_block_size(const baton_kvroute_t *kr);
/*
 * For each candidate w[i]: the leading blocks of keys[0..nb) (baton_kvidx_chain) it holds in
 * L1 (l1[i]) and, continuing them, in L2 (l2[i]); the best of its DP ranks. 0 for a worker
 * without known sources. Counts the match for the unmatched-events check.
 */
void baton_kvroute_match(baton_kvroute_t *kr, const uint64_t *keys, uint32_t nb,
                         baton_worker_t *const *w, size_t n, uint32_t *l1, uint32_t *l2);
/* The leading blocks of keys[0..nb) the KV store holds (reachable by every worker as L3); 0
 * without a store source or before its history is known. */
uint32_t baton_kvroute_match_l3(baton_kvroute_t *kr, const uint64_t *keys, uint32_t nb);

/* The store source's state for GET /workers and the admin views: endpoints, state, blocks, last
 * sequence number; NULL without --store-kv-events. */
json_t *baton_kvroute_store_json(baton_kvroute_t *kr);

/* ---- control plane ---- */

/* The worker's subscription state as a JSON object for GET /workers/{id}: state, blocks per
 * tier, last sequence number, events / gaps / replays; NULL when it has none. */
json_t *baton_kvroute_worker_json(baton_kvroute_t *kr, const baton_worker_t *w);

/* Tests only, before the thread starts: applies b as index source src of w, as the subscription
 * thread does once w's history is known (the index created at the first stored block). 0, or -1
 * when the batch does not fit the index. */
int baton__kvroute_inject(baton_kvroute_t *kr, baton_worker_t *w, int src, const void *batch);
/* Tests only: the same for the store's L3 source (w NULL in the call above is not allowed). */
int baton__kvroute_inject_l3(baton_kvroute_t *kr, int src, const void *batch);

/* Totals for tests and logs. */
typedef struct baton_kvroute_stats_s {
    uint64_t batches, events, blocks_stored, blocks_removed, gaps, replays, resets, errors;
    uint64_t index_blocks;
    size_t index_bytes;
    unsigned subscriptions, synced;
} baton_kvroute_stats_t;
void baton_kvroute_stats(baton_kvroute_t *kr, baton_kvroute_stats_t *st);

#endif
