/* job_cache.c — a job's use of the worker's prefix cache: lookup before prefill (only the
 * uncached tokens are charged), storing a computed or received prompt, releasing holds, and the
 * cache's metrics. */
#include "worker/job.h"
#include "worker/kvev.h"

#include <stdlib.h>

#include "baton/error.h"

int wk__item_ids(const wk_item_t *it, const int64_t **ids_p, int64_t **tmp_p)
{
    *tmp_p = NULL;
    if (it->ids != NULL) {
        *ids_p = it->ids; /* a token-id prompt: its ids are the tokens */
        return 0;
    }
    if (it->text_ids != NULL) {
        *ids_p = it->text_ids; /* --tokenizer: the model's ids of the text */
        return 0;
    }
    int64_t *ids = malloc((size_t)it->prompt_tokens * sizeof(*ids));
    if (ids == NULL)
        return BATON_ENOMEM;
    wk_sim_word_ids(it->prompt ? it->prompt : "", it->prompt_len, ids, it->prompt_tokens);
    *ids_p = ids;
    *tmp_p = ids;
    return 0;
}

/* Evictions and size are read from the cache's own counters after every change. */
static void cache_metrics(wk_worker_t *w)
{
    wk_pcache_stats_t st;
    wk_pcache_stats(w->pcache, &st);
    baton_counter_add(w->m_cache_evict, (double)(st.evicted_tokens - w->cache_evictions_seen));
    w->cache_evictions_seen = st.evicted_tokens;
    baton_gauge_set(w->m_cache_size, (double)st.cached_tokens);
}

void wk__job_cache_match(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    if (!w->pcache)
        return;
    for (size_t i = 0; i < job->req.n_items; i++) {
        wk_item_t *it = &job->req.items[i];
        wk_sstate_t *ss = &job->ss[i];
        const int64_t *ids;
        int64_t *tmp;
        if (ss->cache_hold || wk__item_ids(it, &ids, &tmp) != 0)
            continue; /* matched already, or no memory: computed in full, still correct */
        it->cached_tokens = wk_pcache_match(w->pcache, ids, it->prompt_tokens, &ss->cache_hold);
        ss->seq.cached_tokens = it->cached_tokens;
        free(tmp);
        baton_counter_add(w->m_cache_hit, it->cached_tokens);
        it->cached_l1 = it->cached_tokens;
        if (!w->tier) /* else counted once L2 and L3 had their say */
            baton_counter_add(w->m_cache_miss, it->prompt_tokens - it->cached_tokens);
    }
}

void wk__job_cache_store(wk_sstate_t *ss)
{
    wk_worker_t *w = ss->job->w;
    if (!w->pcache)
        return;
    const wk_item_t *it = &ss->job->req.items[ss->index];
    const int64_t *ids;
    int64_t *tmp;
    if (wk__item_ids(it, &ids, &tmp) == 0) {
        wk_pcache_insert(w->pcache, ids, it->prompt_tokens);
        wk_kvev_flush(w->kvev); /* this insert's stores and evictions, one batch */
        free(tmp);
    }
    wk_pcache_release(w->pcache, ss->cache_hold);
    ss->cache_hold = NULL;
    cache_metrics(w);
}

void wk__job_cache_release(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    if (!w->pcache || !job->ss)
        return;
    for (size_t i = 0; i < job->req.n_items; i++) {
        wk_pcache_release(w->pcache, job->ss[i].cache_hold);
        job->ss[i].cache_hold = NULL;
    }
}
