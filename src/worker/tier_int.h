/* tier_int.h — the state shared by tier.c and tier_fetch.c (private to them). */
#ifndef BATON_WORKER_TIER_INT_H
#define BATON_WORKER_TIER_INT_H

#include "baton/store.h"
#include "common/metrics.h"
#include "common/u64map.h"
#include "worker/tier.h"
#include "worker/tier_key.h"
#include "worker/tier_l2.h"
#include "worker/worker.h"

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
    int closing, client_open, engine_open;
    void (*close_cb)(void *arg);
    void *close_arg;
    /* [1] l2, [2] l3 */
    baton_metric_child_t *m_hit[3], *m_fetched[3], *m_written[3];
    baton_metric_child_t *m_pf_timeouts, *m_corrupt, *m_store_err, *m_l2_pages, *m_loaded;
};

/* Names of the K and V objects of n pages: names[2i], names[2i+1], in buf (2n × name_cap). */
int wk__tier_names(const wk_tier_t *t, const wk_tier_key_t *keys, uint32_t n, char *buf,
                   const char **names);
/* A lookup or write object was freed (the tier may finish closing). */
void wk__tier_op_done(wk_tier_t *t);
void wk__tier_sync_gauges(wk_tier_t *t);

#endif
