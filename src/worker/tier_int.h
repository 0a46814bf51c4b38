/* tier_int.h — the state shared by tier.c and tier_fetch.c (private to them). */
#ifndef BATON_WORKER_TIER_INT_H
#define BATON_WORKER_TIER_INT_H

#include "baton/store.h"
#include "common/list.h"
#include "common/metrics.h"
#include "common/u64map.h"
#include "worker/tier.h"
#include "worker/tier_key.h"
#include "worker/tier_l2.h"
#include "worker/worker.h"

/* The page work that moves or reads whole pages: fills of L2 pages from computed KV, copies of
 * L2 pages into a room, verifications of pages read from L2 or L3. */
enum { WK_TIER_WORK_FILL, WK_TIER_WORK_LOAD, WK_TIER_WORK_VERIFY };

struct wk_tier_s {
    wk_worker_t *w;
    wk_tier_cfg_t cfg;
    wk_kvshape_t shape;
    uint64_t page_bytes, half; /* a page object, one of its two halves (K or V) */
    wk_l2_t *l2;
    void *plain; /* L2's memory without a store (else the engine's region) */
    baton_xfer_engine_t *eng;
    baton_xfer_mem_t *mem;
    baton_store_client_t *sc;
    size_t name_cap;          /* bytes of one object name's buffer */
    baton_u64map_t uses;      /* write_through_selective: page → times used */
    struct wk_offload_s *off; /* decode offload (offload.h), NULL when off */
    unsigned n_ops;           /* lookups and writes alive */
    baton_list_t waiters;     /* lookups waiting for pages FILLING in L2 (tier_fetch.c) */
    int closing, client_open, engine_open;
    void (*close_cb)(void *arg);
    void *close_arg;
    /* [1] l2, [2] l3 */
    baton_metric_child_t *m_hit[3], *m_fetched[3], *m_written[3];
    /* page work (WK_TIER_WORK_*) by thread: [work][0] the loop's, [work][1] the thread pool's */
    baton_metric_child_t *m_work_bytes[3][2], *m_work_secs[3][2];
    baton_metric_child_t *m_joined; /* tokens found in L2 after waiting for another's copy */
    baton_metric_child_t *m_pf_timeouts, *m_corrupt, *m_store_err, *m_l2_pages, *m_loaded;
    baton_metric_child_t *m_l3_present; /* bytes an L3 write found held or being put already */
};

/* Names of the K and V objects of n pages: names[2i], names[2i+1], in buf (2n × name_cap). */
int wk__tier_names(const wk_tier_t *t, const wk_tier_key_t *keys, uint32_t n, char *buf,
                   const char **names);
/* Pages left FILLING in L2 (committed or dropped): lookups waiting for them look again. */
void wk__tier_wake(wk_tier_t *t);
/* A lookup or write object was freed (the tier may finish closing). */
void wk__tier_op_done(wk_tier_t *t);
void wk__tier_sync_gauges(wk_tier_t *t);
/* Counts page work of `bytes` that took `ns`, on the loop's thread or the pool's (on the loop). */
void wk__tier_page_work(wk_tier_t *t, int work, int on_pool, uint64_t bytes, uint64_t ns);

#endif
