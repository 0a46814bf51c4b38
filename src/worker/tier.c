/* tier.c — HiCache's L2 and L3 in baton-worker: start-up and shutdown, object names, metrics,
 * and the writes after prefill (write policies, exists before put, write-back on L2 eviction).
 * The lookup and prefetch before prefill are tier_fetch.c. */
#include "worker/tier_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/log.h"
#include "worker/job.h"
#include "common/hash.h"
#include "worker/kvxfer.h"
#include "worker/offload.h"
#include "worker/prefix_cache.h"

#define COMP "worker"

/* ---- metrics ---- */

static void metrics_init(wk_tier_t *t)
{
    baton_metrics_t *m = t->w->metrics;
    static const char *const tier_label[] = {"tier"};
    static const char *const tiers[3] = {"l1", "l2", "l3"};
    for (int i = 1; i < 3; i++) {
        const char *v[1] = {tiers[i]};
        t->m_hit[i] = baton_metric_child(t->w->f_cache_hit, v);
    }
    baton_metric_family_t *f = baton_metrics_counter(
        m, "baton_worker_tier_fetched_bytes_total",
        "KV bytes fetched from a tier for a request (l2: host pool, l3: store), each verified.", 1,
        tier_label);
    for (int i = 1; i < 3; i++) {
        const char *v[1] = {tiers[i]};
        t->m_fetched[i] = baton_metric_child(f, v);
    }
    f = baton_metrics_counter(m, "baton_worker_tier_written_bytes_total",
                              "KV bytes written to a tier (l2: host pool, l3: store).", 1,
                              tier_label);
    for (int i = 1; i < 3; i++) {
        const char *v[1] = {tiers[i]};
        t->m_written[i] = baton_metric_child(f, v);
    }
    f = baton_metrics_counter(m, "baton_worker_tier_prefetch_timeouts_total",
                              "L3 prefetches a request stopped waiting for (timeout or "
                              "best_effort) before every page arrived.",
                              0, NULL);
    t->m_pf_timeouts = baton_metric_child(f, NULL);
    f = baton_metrics_counter(m, "baton_worker_tier_corrupt_pages_total",
                              "Pages read from L2 or L3 that failed byte-for-byte verification "
                              "(recomputed).",
                              0, NULL);
    t->m_corrupt = baton_metric_child(f, NULL);
    f = baton_metrics_counter(m, "baton_worker_tier_store_errors_total",
                              "Store batches (exists, get, put) that failed as a whole.", 0, NULL);
    t->m_store_err = baton_metric_child(f, NULL);
    f = baton_metrics_counter(m, "baton_worker_tier_l3_present_bytes_total",
                              "KV bytes a write to L3 did not send: the store held them already "
                              "(exists before put) or another writer was putting them. Counted "
                              "when the write ends, beside the l3 written bytes.",
                              0, NULL);
    t->m_l3_present = baton_metric_child(f, NULL);
    f = baton_metrics_counter(m, "baton_worker_tier_loaded_pages_total",
                              "Prefill: L2 pages (hits and L3 fetches) copied into a request's KV "
                              "pages instead of filled from the definition.",
                              0, NULL);
    t->m_loaded = baton_metric_child(f, NULL);
    f = baton_metrics_counter(m, "baton_worker_tier_joined_tokens_total",
                              "Prompt tokens a request found in L2 after waiting for another "
                              "request's copy of the same pages (an L3 fetch or a fill) instead of "
                              "fetching or computing them again.",
                              0, NULL);
    t->m_joined = baton_metric_child(f, NULL);
    static const char *const work_labels[] = {"work", "thread"};
    static const char *const works[3] = {"fill", "load", "verify"};
    static const char *const threads[2] = {"loop", "pool"};
    baton_metric_family_t *fb = baton_metrics_counter(
        m, "baton_worker_tier_page_work_bytes_total",
        "Whole-page work by kind (fill: computed KV into L2, load: L2 pages into a prefill's "
        "room, verify: pages read from L2 or L3 checked) and by the thread that did it (loop: "
        "every stream on this worker waited meanwhile; pool: libuv's thread pool).",
        2, work_labels);
    baton_metric_family_t *fs = baton_metrics_counter(
        m, "baton_worker_tier_page_work_seconds_total",
        "Time the whole-page work of baton_worker_tier_page_work_bytes_total took, by kind and "
        "thread: the loop's share is time every stream on this worker stalled.",
        2, work_labels);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++) {
            const char *v[2] = {works[i], threads[j]};
            t->m_work_bytes[i][j] = baton_metric_child(fb, v);
            t->m_work_secs[i][j] = baton_metric_child(fs, v);
        }
    f = baton_metrics_gauge(m, "baton_worker_tier_l2_pages", "Pages held in the L2 host pool.", 0,
                            NULL);
    t->m_l2_pages = baton_metric_child(f, NULL);
}

void wk__tier_sync_gauges(wk_tier_t *t)
{
    wk_l2_stats_t st;
    wk_l2_stats(t->l2, &st);
    baton_gauge_set(t->m_l2_pages, (double)st.used);
}

void wk__tier_page_work(wk_tier_t *t, int work, int on_pool, uint64_t bytes, uint64_t ns)
{
    baton_counter_add(t->m_work_bytes[work][on_pool], (double)bytes);
    baton_counter_add(t->m_work_secs[work][on_pool], (double)ns / 1e9);
}

/* ---- names ---- */

int wk__tier_names(const wk_tier_t *t, const wk_tier_key_t *keys, uint32_t n, char *buf,
                   const char **names)
{
    for (uint32_t i = 0; i < n; i++) {
        for (int h = 0; h < 2; h++) {
            char *at = buf + ((size_t)i * 2 + h) * t->name_cap;
            if (wk_tier_object_name(at, t->name_cap, t->w->cfg.model_name, &keys[i], t->cfg.tp_rank,
                                    h ? 'v' : 'k') < 0)
                return BATON_EINVAL;
            names[i * 2 + h] = at;
        }
    }
    return 0;
}

/* ---- writes ---- */

/* One batch of pages going to L3: exists first, then a put of the missing ones from their L2
 * slots (pinned until the put's callback). Freed when its in-flight count reaches zero. */
typedef struct {
    wk_tier_t *t;
    uint32_t n; /* pages */
    unsigned inflight;
    int32_t *slots; /* n */
    int writeback;  /* dirty pages evicted from L2: cleaned when done */
    /* Bytes the store held already or another writer was putting (a decode's offload writes the
     * prompt pages its prefill writes too): not sent, yet in L3, so counted when the op ends. */
    uint64_t present;
    char *name_buf;
    const char **names; /* 2n */
    baton_store_obj_t *objs;
    /* The KV block each page holds (NULL where its token ids are not known here: write-back
     * and decode offload): given with the page's first object (k), so the store master
     * publishes one BlockStored (medium L3) per page, the same block its L1 event names. */
    baton_store_block_t *blk;     /* n */
    uint32_t *tok;                /* n × page tokens */
    baton_store_block_t *put_blk; /* 2n: per object of the put */
} put_op_t;

static void put_op_release(put_op_t *op)
{
    if (op->inflight)
        return;
    wk_tier_t *t = op->t;
    baton_counter_add(t->m_l3_present, (double)op->present);
    for (uint32_t i = 0; i < op->n; i++) {
        if (op->writeback)
            wk_l2_clean(t->l2, op->slots[i]);
        wk_l2_unpin(t->l2, op->slots[i]);
    }
    free(op->slots);
    free(op->name_buf);
    free(op->names);
    free(op->objs);
    free(op->blk);
    free(op->tok);
    free(op->put_blk);
    free(op);
    wk__tier_op_done(t);
}

static void on_put(void *data, int status, const baton_store_result_t *res, size_t n, size_t prefix)
{
    put_op_t *op = data;
    wk_tier_t *t = op->t;
    (void)prefix;
    op->inflight--;
    if (status != 0) {
        baton_counter_add(t->m_store_err, 1);
        log_warn_limited(COMP, "tier_put_failed", "tier_put_failed err=%s",
                         baton_store_strerror(status));
    } else {
        for (size_t i = 0; i < n; i++) {
            if (res[i].status == 0)
                baton_counter_add(t->m_written[2], (double)res[i].len);
            else if (res[i].status == BATON_XFER_EEXIST) /* committed or being put meanwhile */
                op->present += t->half;
        }
    }
    put_op_release(op);
}

static void on_put_exists(void *data, int status, const baton_store_result_t *res, size_t n,
                          size_t prefix)
{
    put_op_t *op = data;
    wk_tier_t *t = op->t;
    (void)prefix;
    op->inflight--;
    if (status != 0 || t->closing) {
        if (status != 0) {
            baton_counter_add(t->m_store_err, 1);
            log_warn_limited(COMP, "tier_exists_failed", "tier_exists_failed err=%s",
                             baton_store_strerror(status));
        }
        put_op_release(op);
        return;
    }
    /* exists before put: only the objects the store does not hold yet */
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (res[i].status == 0) {
            op->present += t->half;
            continue;
        }
        uint32_t page = (uint32_t)(i / 2);
        uint8_t *base = wk_l2_addr(t->l2, op->slots[page]);
        op->objs[m].key = op->names[i];
        op->objs[m].addr = base + (i % 2 ? t->half : 0);
        op->objs[m].len = t->half;
        if (op->put_blk)
            op->put_blk[m] = i % 2 ? (baton_store_block_t){0} : op->blk[page];
        m++;
    }
    baton_store_put_opts_t po;
    baton_store_put_opts_init(&po);
    po.blocks = op->put_blk;
    if (m > 0 && baton_store_put(t->sc, op->objs, m, &po, on_put, op) == 0)
        op->inflight++;
    else if (m > 0)
        baton_counter_add(t->m_store_err, 1);
    put_op_release(op);
}

/* Sends the pages in `slots` (pinned by the caller, handed over) to L3; blk and tok (handed
 * over, may be NULL) the blocks they hold. */
static void put_pages(wk_tier_t *t, int32_t *slots, uint32_t n, int writeback,
                      baton_store_block_t *blk, uint32_t *tok)
{
    put_op_t *op = calloc(1, sizeof(*op));
    if (op && blk) {
        op->blk = blk;
        op->tok = tok;
        op->put_blk = malloc((size_t)n * 2 * sizeof(*op->put_blk));
        if (!op->put_blk) { /* the pages still go, unannounced */
            free(blk);
            free(tok);
            op->blk = NULL;
            op->tok = NULL;
        }
    } else {
        free(blk);
        free(tok);
    }
    if (op) {
        op->t = t;
        op->n = n;
        op->slots = slots;
        op->writeback = writeback;
        op->name_buf = malloc((size_t)n * 2 * t->name_cap);
        op->names = malloc((size_t)n * 2 * sizeof(*op->names));
        op->objs = malloc((size_t)n * 2 * sizeof(*op->objs));
    }
    wk_tier_key_t *keys = op ? malloc(n * sizeof(*keys)) : NULL;
    int ok = keys && op->name_buf && op->names && op->objs;
    for (uint32_t i = 0; ok && i < n; i++)
        keys[i] = *wk_l2_key(t->l2, slots[i]);
    if (ok)
        ok = wk__tier_names(t, keys, n, op->name_buf, op->names) == 0;
    free(keys);
    if (!ok) {
        if (!op) {
            for (uint32_t i = 0; i < n; i++) {
                if (writeback)
                    wk_l2_clean(t->l2, slots[i]);
                wk_l2_unpin(t->l2, slots[i]);
            }
            free(slots);
            return;
        }
        t->n_ops++;
        put_op_release(op);
        return;
    }
    t->n_ops++;
    if (baton_store_exists(t->sc, op->names, (size_t)n * 2, on_put_exists, op) == 0)
        op->inflight++;
    else
        baton_counter_add(t->m_store_err, 1);
    put_op_release(op);
}

/* L2 wants to evict a dirty page (write_back): it goes to L3 first. */
static void on_dirty(void *ud, wk_l2_t *l2, int32_t slot, const wk_tier_key_t *key)
{
    wk_tier_t *t = ud;
    (void)key;
    int32_t *slots = t->sc && !t->closing ? malloc(sizeof(*slots)) : NULL;
    if (!slots) { /* nowhere to write it: it is just dropped */
        wk_l2_clean(l2, slot);
        wk_l2_unpin(l2, slot);
        return;
    }
    slots[0] = slot; /* pinned by the pool for us */
    put_pages(t, slots, 1, 1, NULL, NULL);
}

static uint32_t page_uses(wk_tier_t *t, const wk_tier_key_t *key)
{
    if (t->cfg.write_policy != WK_WP_WRITE_THROUGH_SELECTIVE)
        return 1;
    uint64_t id = 0;
    for (int i = 0; i < 16; i++)
        id = id << 4 | (uint64_t)(key->hex[i] >= 'a' ? key->hex[i] - 'a' + 10 : key->hex[i] - '0');
    if (t->uses.count > (1u << 20)) { /* bounded: forget and start counting again */
        baton_u64map_free(&t->uses);
        baton_u64map_init(&t->uses);
    }
    uintptr_t n = (uintptr_t)baton_u64map_get(&t->uses, id) + 1;
    baton_u64map_del(&t->uses, id);
    baton_u64map_put(&t->uses, id, (void *)n);
    return (uint32_t)n;
}

/* Sends the pinned slots to_l3[0..n3) — pages at[] of ids — to L3 in batches the store accepts
 * (two objects a page), each page with its KV block when bh (the pages' event hashes) is given;
 * frees to_l3. */
static void put_batches(wk_tier_t *t, int32_t *to_l3, const uint32_t *at, uint32_t n3,
                        const int64_t *ids, const uint64_t *bh)
{
    uint32_t P = t->shape.page_tokens;
    uint32_t per = BATON_STORE_BATCH_MAX / 2;
    for (uint32_t off = 0; off < n3; off += per) {
        uint32_t m = n3 - off < per ? n3 - off : per;
        int32_t *slots = malloc(m * sizeof(*slots));
        if (!slots) {
            for (uint32_t i = off; i < n3; i++)
                wk_l2_unpin(t->l2, to_l3[i]);
            break;
        }
        memcpy(slots, to_l3 + off, m * sizeof(*slots));
        baton_store_block_t *blk = bh && at ? calloc(m, sizeof(*blk)) : NULL;
        uint32_t *tok = blk ? malloc((size_t)m * P * sizeof(*tok)) : NULL;
        if (blk && tok) {
            for (uint32_t j = 0; j < m; j++) {
                uint32_t pg = at[off + j];
                for (uint32_t k = 0; k < P; k++)
                    tok[(size_t)j * P + k] = (uint32_t)ids[(size_t)pg * P + k];
                blk[j] = (baton_store_block_t){.hash = (int64_t)bh[pg],
                                               .has_parent = pg > 0,
                                               .parent_hash = pg ? (int64_t)bh[pg - 1] : 0,
                                               .token_ids = tok + (size_t)j * P,
                                               .n_tokens = P};
            }
        } else {
            free(blk);
            free(tok);
            blk = NULL;
            tok = NULL;
        }
        put_pages(t, slots, m, 0, blk, tok);
    }
    free(to_l3);
}

/*
 * The device-to-host copies of one sequence's computed pages, on the thread pool: a page of a
 * large model is megabytes, and written on the loop it would stall every other stream. The new
 * L2 slots stay FILLING and pinned (no lookup finds them, no eviction takes them) until the
 * loop commits them; the pages already in L2 that go to L3 are pinned from the start. The job
 * counts as one of the tier's operations, so the tier cannot close under it.
 */
typedef struct {
    uv_work_t req;
    wk_tier_t *t;
    uint32_t n_fill, n3;
    int32_t *fill_slots; /* FILLING, pinned by their alloc */
    uint32_t *fill_pages;
    uint8_t *fill_to_l3;
    int32_t *to_l3; /* pages already in L2 going to L3 (pinned), then the filled ones */
    uint32_t *at;   /* the page index of each to_l3 entry */
    uint32_t pages;
    int64_t *ids;   /* the sequence's ids of its whole pages */
    uint64_t ns;    /* the thread's time on the fills */
} store_job_t;

static void store_work(uv_work_t *req)
{
    store_job_t *j = req->data;
    wk_tier_t *t = j->t;
    uint32_t P = t->shape.page_tokens;
    uint64_t t0 = uv_hrtime();
    for (uint32_t k = 0; k < j->n_fill; k++) {
        uint32_t i = j->fill_pages[k];
        /* pinned FILLING: only this job writes the slot */
        wk_tier_page_fill(wk_l2_addr(t->l2, j->fill_slots[k]), &t->shape, j->ids + (size_t)i * P,
                          i * P);
    }
    j->ns = uv_hrtime() - t0;
}

static void store_done(uv_work_t *req, int status)
{
    store_job_t *j = req->data;
    wk_tier_t *t = j->t;
    for (uint32_t k = 0; k < j->n_fill; k++) {
        int32_t slot = j->fill_slots[k];
        if (status != 0) {
            wk_l2_drop(t->l2, slot);
            continue;
        }
        baton_counter_add(t->m_written[1], (double)t->page_bytes);
        wk_l2_commit(t->l2, slot, t->sc && wk_wp_on_evict(t->cfg.write_policy));
        if (j->fill_to_l3[k] && !t->closing) {
            wk_l2_pin(t->l2, slot);
            j->at[j->n3] = j->fill_pages[k];
            j->to_l3[j->n3++] = slot;
        }
    }
    if (status == 0 && j->n_fill)
        wk__tier_page_work(t, WK_TIER_WORK_FILL, 1, (uint64_t)j->n_fill * t->page_bytes, j->ns);
    if (t->closing) {
        for (uint32_t i = 0; i < j->n3; i++)
            wk_l2_unpin(t->l2, j->to_l3[i]);
        free(j->to_l3);
    } else {
        /* the pages' event hashes, chained as the prefix cache names them in its L1 events */
        uint32_t P = t->shape.page_tokens;
        uint64_t *bh = j->n3 ? malloc(j->pages * sizeof(*bh)) : NULL;
        for (uint32_t i = 0; bh && i < j->pages; i++)
            bh[i] = wk_pcache_block_hash(i > 0, i ? bh[i - 1] : 0, j->ids + (size_t)i * P, P);
        put_batches(t, j->to_l3, j->at, j->n3, j->ids, bh);
        free(bh);
    }
    free(j->fill_slots);
    free(j->fill_pages);
    free(j->fill_to_l3);
    free(j->at);
    free(j->ids);
    free(j);
    wk__tier_sync_gauges(t);
    wk__tier_wake(t);
    wk__tier_op_done(t);
}

void wk_tier_store_ids(wk_tier_t *t, const int64_t *ids, uint32_t n)
{
    uint32_t P = t->shape.page_tokens, pages = n / P;
    if (pages == 0 || t->closing)
        return;
    wk_tier_key_t *keys = malloc(pages * sizeof(*keys));
    store_job_t *j = calloc(1, sizeof(*j));
    if (j) {
        j->t = t;
        j->fill_slots = malloc(pages * sizeof(*j->fill_slots));
        j->fill_pages = malloc(pages * sizeof(*j->fill_pages));
        j->fill_to_l3 = malloc(pages);
        j->to_l3 = malloc(pages * sizeof(*j->to_l3));
        j->at = malloc(pages * sizeof(*j->at));
        j->pages = pages;
        j->ids = malloc((size_t)pages * P * sizeof(*j->ids));
    }
    if (!keys || !j || !j->fill_slots || !j->fill_pages || !j->fill_to_l3 || !j->to_l3 || !j->at ||
        !j->ids) {
        free(keys);
        if (j) {
            free(j->fill_slots);
            free(j->fill_pages);
            free(j->fill_to_l3);
            free(j->to_l3);
            free(j->at);
            free(j->ids);
        }
        free(j);
        return;
    }
    memcpy(j->ids, ids, (size_t)pages * P * sizeof(*ids));
    wk_tier_keys(ids, n, P, pages, keys);
    for (uint32_t i = 0; i < pages; i++) {
        uint32_t uses = page_uses(t, &keys[i]);
        if (!wk_wp_to_l2(t->cfg.write_policy, uses))
            continue;
        int to_l3 = t->sc && wk_wp_to_l3(t->cfg.write_policy, uses);
        int32_t slot = wk_l2_find(t->l2, &keys[i]);
        if (slot >= 0) {
            if (to_l3) {
                wk_l2_pin(t->l2, slot);
                j->at[j->n3] = i;
                j->to_l3[j->n3++] = slot;
            }
            continue;
        }
        slot = wk_l2_alloc(t->l2, &keys[i]);
        if (slot < 0)
            continue; /* every slot busy (maybe being written back), or being fetched */
        j->fill_slots[j->n_fill] = slot;
        j->fill_pages[j->n_fill] = i;
        j->fill_to_l3[j->n_fill++] = (uint8_t)to_l3;
    }
    free(keys);
    t->n_ops++;
    j->req.data = j;
    if (j->n_fill == 0 || uv_queue_work(t->w->loop, &j->req, store_work, store_done) != 0)
        store_done(&j->req, j->n_fill ? UV_ECANCELED : 0);
}

void wk_tier_store(wk_tier_t *t, wk_sstate_t *ss)
{
    const wk_item_t *it = &ss->job->req.items[ss->index];
    const int64_t *ids;
    int64_t *tmp;
    if (wk__item_ids(it, &ids, &tmp) != 0)
        return;
    wk_tier_store_ids(t, ids, it->prompt_tokens);
    free(tmp);
}

/* ---- decode offload ---- */

static void off_lease_drop(void *ud, wk_kvlease_t *l, unsigned hold)
{
    wk_tier_t *t = ud;
    wk_kv_recv_lease_drop(t->w->kv, l, hold);
}

static void off_page(void *ud, int32_t slot)
{
    wk_tier_t *t = ud;
    baton_counter_add(t->m_written[1], (double)t->page_bytes);
    wk__tier_wake(t); /* the page left FILLING */
    int32_t *slots = t->sc && !t->closing ? malloc(sizeof(*slots)) : NULL;
    if (!slots) {
        wk_l2_unpin(t->l2, slot);
        return;
    }
    slots[0] = slot; /* pinned for us by the offload */
    put_pages(t, slots, 1, 0, NULL, NULL);
}

int wk_tier_offload_start(wk_tier_t *t)
{
    wk_worker_t *w = t->w;
    if (!t->cfg.decode_offload || w->cfg.mode != WK_MODE_DECODE || !w->kv)
        return 0;
    wk_offload_cfg_t oc = {.shape = t->shape,
                           .l1_base = wk_kv_region(w->kv),
                           .l1_slots = wk_kv_pool_slots(w->kv),
                           .l2 = t->l2,
                           .lease_drop = off_lease_drop,
                           .page_cb = off_page,
                           .ud = t};
    int rc = wk_offload_create(&t->off, w->loop, &oc);
    if (rc != 0)
        log_error(COMP, "start_failed what=decode_offload err=%s", baton_strerror(rc));
    return rc;
}

void wk_tier_offload_seq_begin(wk_tier_t *t, wk_sstate_t *ss)
{
    if (!t->off || !ss->recv || ss->offload)
        return;
    const wk_item_t *it = &ss->job->req.items[ss->index];
    const int64_t *ids;
    int64_t *tmp;
    if (wk__item_ids(it, &ids, &tmp) != 0)
        return;
    uint64_t rid = it->rid ? baton_fnv1a64_add_str(BATON_FNV1A64_INIT, it->rid)
                           : baton_fnv1a64_add_str(BATON_FNV1A64_INIT, ss->job->id);
    ss->offload = wk_offload_begin(t->off, wk_kv_recv_lease(ss->recv), ids, it->prompt_tokens,
                                   rid ^ ss->index);
    free(tmp);
}

void wk_tier_offload_seq_end(wk_tier_t *t, wk_sstate_t *ss, int finished)
{
    if (!ss->offload)
        return;
    const wk_item_t *it = &ss->job->req.items[ss->index];
    const int64_t *ids;
    int64_t *tmp;
    if (finished && wk__item_ids(it, &ids, &tmp) == 0) {
        /* the prompt and the generated tokens: the next turn's prompt when a client sends
         * input_ids back (output_ids appended) */
        uint32_t n = it->prompt_tokens + ss->gen.n_tokens;
        int64_t *all = malloc((size_t)n * sizeof(*all));
        if (all) {
            memcpy(all, ids, (size_t)it->prompt_tokens * sizeof(*all));
            for (uint32_t i = 0; i < ss->gen.n_tokens; i++)
                all[it->prompt_tokens + i] = ss->gen.ids[i];
            wk_offload_tokens(ss->offload, all, n);
            free(all);
        }
        free(tmp);
    }
    wk_offload_end(ss->offload);
    ss->offload = NULL;
}

/* ---- start and close ---- */

static void on_room(baton_xfer_engine_t *e, baton_xfer_room_t *room, void *data)
{
    (void)e;
    (void)data;
    baton_xfer_room_abort(room, BATON_XFER_ENOTSUP); /* this engine only serves the store */
}

static void on_room_closed(baton_xfer_engine_t *e, baton_xfer_room_t *room, int st, void *data)
{
    (void)e;
    (void)room;
    (void)st;
    (void)data;
}

int wk_tier_create(wk_tier_t **t_p, wk_worker_t *w)
{
    const wk_tier_cfg_t *c = &w->cfg.tier;
    wk_tier_t *t = calloc(1, sizeof(*t));
    if (!t)
        return BATON_ENOMEM;
    t->w = w;
    t->cfg = *c;
    t->shape = w->cfg.shape;
    t->page_bytes = wk_tier_page_bytes(&t->shape);
    t->half = t->page_bytes / 2;
    baton_u64map_init(&t->uses);
    baton_list_init(&t->waiters);
    t->name_cap = BATON_STORE_KEY_MAX + 1;
    metrics_init(t);
    int rc = 0;
    void *mem = NULL;
    if (c->store) {
        baton_xfer_config_t xc;
        baton_xfer_config_init(&xc);
        xc.listen_host = w->cfg.host; /* the nodes pull a put's bytes from here */
        xc.listen_port = 0;
        xc.log_level = BATON_XFER_LOG_WARN; /* no second bootstrap_listening line */
        uint8_t secret[BATON_XFER_SECRET_MAX + 1];
        size_t slen = 0;
        if (w->cfg.kv_secret_file &&
            (rc = wk_kv_secret_read(w->cfg.kv_secret_file, secret, sizeof(secret), &slen)) != 0)
            goto fail;
        if (slen) {
            xc.secret = secret;
            xc.secret_len = slen;
        }
        baton_xfer_callbacks_t cbs = {on_room, on_room_closed, NULL, t};
        rc = baton_xfer_engine_create(w->loop, &xc, &cbs, &t->eng);
        if (rc == 0)
            rc = baton_xfer_mem_alloc(t->eng, c->l2_bytes, &t->mem);
        if (rc == 0) {
            baton_store_config_t sc;
            baton_store_config_init(&sc);
            sc.master = c->store;
            sc.engine = t->eng;
            sc.host = w->cfg.host;
            sc.ns = c->store_ns;
            sc.secret = slen ? secret : NULL;
            sc.secret_len = slen;
            sc.request_timeout_ms = 2000;
            /* Inline reads block the calling thread, here the loop that runs every stream of
             * this worker: a node that stops answering would stall them all for up to 200 ms.
             * The engines' path never blocks the loop. */
            sc.inline_max = 0;
            rc = baton_store_client_create(w->loop, &sc, &t->sc);
        }
        explicit_bzero(secret, sizeof(secret));
        if (rc != 0) {
            log_error(COMP, "start_failed what=store_client err=%s", baton_store_strerror(rc));
            goto fail;
        }
        mem = baton_xfer_mem_addr(t->mem);
    } else {
        mem = t->plain = malloc(c->l2_bytes);
        if (!mem) {
            rc = BATON_ENOMEM;
            goto fail;
        }
    }
    rc = wk_l2_create(&t->l2, mem, c->l2_bytes, t->page_bytes, on_dirty, t);
    if (rc != 0) {
        log_error(COMP,
                  "start_failed what=l2 err=%s reason=\"--l2-bytes holds no whole page of "
                  "%llu bytes\"",
                  baton_strerror(rc), (unsigned long long)t->page_bytes);
        goto fail;
    }
    log_info(COMP,
             "hicache l2_pages=%llu page_bytes=%llu store=%s write_policy=%s "
             "prefetch_policy=%s",
             (unsigned long long)(c->l2_bytes / t->page_bytes), (unsigned long long)t->page_bytes,
             c->store ? c->store : "off", wk_wp_policy_name(c->write_policy),
             wk_pf_policy_name(c->prefetch_policy));
    *t_p = t;
    return 0;
fail:
    /* the process stops on a failed start: the engine's threads go with it */
    free(t->plain);
    baton_u64map_free(&t->uses);
    free(t);
    return rc ? rc : BATON_EINVAL;
}

static void maybe_closed(wk_tier_t *t)
{
    if (!t->closing || t->n_ops || t->client_open || t->engine_open)
        return;
    void (*cb)(void *) = t->close_cb;
    void *arg = t->close_arg;
    wk_l2_destroy(t->l2);
    free(t->plain);
    baton_u64map_free(&t->uses);
    free(t);
    if (cb)
        cb(arg);
}

void wk__tier_op_done(wk_tier_t *t)
{
    t->n_ops--;
    maybe_closed(t);
}

static void on_engine_closed(baton_xfer_engine_t *e, void *data)
{
    wk_tier_t *t = data;
    (void)e;
    t->engine_open = 0;
    maybe_closed(t);
}

static void on_client_closed(baton_store_client_t *c, void *data)
{
    wk_tier_t *t = data;
    (void)c;
    t->client_open = 0;
    /* every op's store calls have ended by now: the engine may go */
    if (t->eng) {
        t->engine_open = 1;
        baton_xfer_engine_destroy(t->eng, on_engine_closed, t);
        t->eng = NULL;
    }
    maybe_closed(t);
}

static void close_client(wk_tier_t *t);

static void on_offload_closed(void *arg)
{
    wk_tier_t *t = arg;
    t->off = NULL;
    t->n_ops--;
    close_client(t);
}

void wk_tier_close(wk_tier_t *t, void (*cb)(void *arg), void *arg)
{
    t->closing = 1;
    t->close_cb = cb;
    t->close_arg = arg;
    if (t->off) { /* its copies read L1 pages and write L2 ones: it goes first */
        t->n_ops++;
        wk_offload_close(t->off, on_offload_closed, t);
        return;
    }
    close_client(t);
}

static void close_client(wk_tier_t *t)
{
    if (t->sc) {
        t->client_open = 1;
        baton_store_client_destroy(t->sc, on_client_closed, t);
        t->sc = NULL;
        return;
    }
    maybe_closed(t);
}
