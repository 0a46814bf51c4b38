/* tier_fetch.c — a request's lookup past its L1 hit: L2, then L3's batch exists (prefix count),
 * the L3 prefix fetched into L2 pages in place and verified byte for byte (on the thread pool),
 * under the prefetch policy, waiting for pages other requests are copying into L2; the hit
 * pages copied into a prefill's room; the per-tier counts it leaves on the request. */
#include "worker/tier_int.h"

#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/log.h"
#include "worker/job.h"
#include "worker/kvxfer.h"

#define COMP "worker"

/* SGLang's storage batch: pages per get. */
#define FETCH_BATCH_PAGES 128

typedef struct {
    uint32_t l1_pages, max_pages, l2_pages;
    int64_t *ids; /* the first max_pages pages' ids, to verify what arrives */
    wk_tier_key_t *keys;
    uint32_t l3_first; /* first page asked of L3 */
    uint32_t l3_n;     /* pages being fetched (an L2 slot each) */
    int32_t *slots;
    int8_t *state; /* per fetched page: 0 on its way, 1 arrived and verified, -1 failed */
    char *name_buf;
    const char **names;
    baton_store_obj_t *objs;
    unsigned batches_left;
    int exists_pending;
    wk_pf_t pf;
    int32_t *l2_slots; /* the L2 run's slots, pinned (with the verified L3 pages') until the
                        * request went and its room got them */
    uint8_t waiting;   /* for a page another request is copying into L2 */
    uint8_t waits;     /* times it waited (bounded) */
    uint32_t ready_before; /* pages of its L2 run before it first waited */
} item_t;

struct wk_tier_lookup_s {
    wk_tier_t *t;
    wk_job_t *job; /* NULL once it went or the job went away */
    void (*then)(wk_job_t *job);
    size_t n;
    item_t *items;
    unsigned inflight; /* store calls and room loads not yet called back */
    unsigned loading;  /* room loads (thread pool) the job waits for */
    int setting_up;    /* wk_tier_lookup has not started every item yet */
    int went, freeing;
    int released; /* the pins on hit pages are gone: late pages are not pinned any more */
    uv_timer_t timer;
    baton_list_t wait_link; /* in the tier's waiters while an item waits */
    int on_wait_list;
};
typedef struct wk_tier_lookup_s lookup_t;

/* Times an item waits for pages another request is copying into L2 before it gives up on them
 * (each wait ends when some copy ends). */
#define MAX_WAITS 16

typedef struct {
    lookup_t *op;
    size_t item;
    uint32_t first, m; /* fetched pages [first, first + m) of the item */
} batch_t;

static void timer_closed(uv_handle_t *h)
{
    lookup_t *op = h->data;
    wk_tier_t *t = op->t;
    for (size_t i = 0; i < op->n; i++) {
        item_t *it = &op->items[i];
        free(it->ids);
        free(it->keys);
        free(it->slots);
        free(it->state);
        free(it->name_buf);
        free(it->names);
        free(it->objs);
        free(it->l2_slots);
    }
    free(op->items);
    free(op);
    wk__tier_op_done(t);
}

/* Unpins the hit pages (once). */
static void release_pins(lookup_t *op)
{
    if (op->released)
        return;
    op->released = 1;
    for (size_t i = 0; i < op->n; i++) {
        item_t *it = &op->items[i];
        for (uint32_t k = 0; k < it->l2_pages; k++)
            wk_l2_unpin(op->t->l2, it->l2_slots[k]);
        for (uint32_t k = 0; k < it->l3_n; k++)
            if (it->state[k] == 1)
                wk_l2_unpin(op->t->l2, it->slots[k]);
    }
}

static void went(lookup_t *op);
static void maybe_free(lookup_t *op);
static int wait_item(lookup_t *op, size_t i, uint32_t ready);

typedef struct {
    lookup_t *op;
    uint32_t n;
} load_t;

/* A room's copy of hit pages is done: the request goes once every item's is. */
static void on_loaded(void *arg, int status, uint64_t ns)
{
    load_t *ld = arg;
    lookup_t *op = ld->op;
    if (status == 0) {
        baton_counter_add(op->t->m_loaded, ld->n);
        wk__tier_page_work(op->t, WK_TIER_WORK_LOAD, 1, (uint64_t)ld->n * op->t->page_bytes, ns);
    }
    free(ld);
    op->inflight--;
    if (--op->loading == 0)
        went(op);
    maybe_free(op);
}

/* A prefill's room gets the hit pages' bytes (L2 to L1, the host-to-device copy) on the thread
 * pool, the pages pinned in L2 until it is done: the pages the decode receives are the ones
 * fetched, verified there once more. */
static void load_room(lookup_t *op, wk_job_t *job, size_t i, uint32_t l3)
{
    item_t *it = &op->items[i];
    wk_sstate_t *ss = &job->ss[i];
    uint32_t n = it->l2_pages + l3;
    if (!ss->send || n == 0)
        return;
    const uint8_t **objs = malloc(n * sizeof(*objs));
    load_t *ld = malloc(sizeof(*ld));
    if (!objs || !ld) {
        free(objs);
        free(ld);
        return; /* the room is filled from the definition instead: the same bytes */
    }
    for (uint32_t k = 0; k < n; k++)
        objs[k] =
            wk_l2_addr(op->t->l2, k < it->l2_pages ? it->l2_slots[k] : it->slots[k - it->l2_pages]);
    *ld = (load_t){op, n};
    if (wk_kv_send_load_pages(ss->send, it->l1_pages, n, objs, on_loaded, ld) == 0) {
        op->loading++;
        op->inflight++;
    } else {
        free(ld);
    }
    free(objs);
}

/* Freed once nobody waits for it and no store call can still call back. */
static void maybe_free(lookup_t *op)
{
    if (op->job || op->inflight || op->freeing)
        return;
    release_pins(op);
    op->freeing = 1;
    uv_close((uv_handle_t *)&op->timer, timer_closed);
}

/* The request goes now with what arrived. */
static void go(lookup_t *op)
{
    wk_tier_t *t = op->t;
    wk_job_t *job = op->job;
    uint32_t P = t->shape.page_tokens;
    op->went = 1; /* the job stays attached until its rooms are loaded: it may still go away */
    uv_timer_stop(&op->timer);
    for (size_t i = 0; i < op->n; i++) {
        item_t *it = &op->items[i];
        wk_item_t *wi = &job->req.items[i];
        uint32_t l3 = it->l3_n ? it->pf.done_pages : 0;
        if (it->l3_n && l3 < it->l3_n && !it->pf.finished)
            baton_counter_add(t->m_pf_timeouts, 1);
        wi->tiered = 1;
        wi->cached_l2 = it->l2_pages * P;
        baton_counter_add(t->m_fetched[1], (double)it->l2_pages * (double)t->page_bytes);
        if (it->waits && it->l2_pages > it->ready_before) /* what others copied meanwhile */
            baton_counter_add(t->m_joined, (it->l2_pages - it->ready_before) * P);
        wi->cached_l3 = l3 * P;
        wi->cached_tokens += wi->cached_l2 + wi->cached_l3;
        job->ss[i].seq.cached_tokens = wi->cached_tokens;
        load_room(op, job, i, l3);
        baton_counter_add(t->m_hit[1], wi->cached_l2);
        baton_counter_add(t->m_hit[2], wi->cached_l3);
        baton_counter_add(t->w->m_cache_miss, wi->prompt_tokens - wi->cached_tokens);
    }
    if (op->loading == 0)
        went(op);
}

/* The rooms have their hit pages: the pins go, and the request computes the rest (unless it
 * went away meanwhile). */
static void went(lookup_t *op)
{
    wk_job_t *job = op->job;
    release_pins(op);
    if (!job)
        return;
    op->job = NULL;
    job->tier_lookup = NULL;
    op->then(job);
}

static void timer_cb(uv_timer_t *h);

/* Goes when every item's exists came back and its prefetch may stop waiting; else waits for the
 * next batch or the earliest deadline. */
static void evaluate(lookup_t *op)
{
    if (!op->job || op->went || op->setting_up)
        return;
    uint64_t now = uv_now(op->t->w->loop), next = UINT64_MAX;
    int wait = 0;
    for (size_t i = 0; i < op->n; i++) {
        item_t *it = &op->items[i];
        if (it->exists_pending)
            return;
        if (it->l3_n && !wk_pf_may_go(&it->pf, now)) {
            wait = 1;
            if (it->pf.deadline_ms < next)
                next = it->pf.deadline_ms;
        }
    }
    if (!wait) {
        go(op);
        return;
    }
    if (next != UINT64_MAX) /* wait_complete has none: the last batch decides */
        uv_timer_start(&op->timer, timer_cb, next > now ? next - now : 0, 0);
}

static void timer_cb(uv_timer_t *h)
{
    evaluate(h->data);
}

/* Fetched pages [0, k) all verified: the usable prefix. */
static uint32_t done_prefix(const item_t *it)
{
    uint32_t k = 0;
    while (k < it->l3_n && it->state[k] == 1)
        k++;
    return k;
}

/*
 * Verifying pages read from L2 or L3 (megabytes each with a large shape) on the thread pool: the
 * pages are pinned (an L2 run's by the lookup) or FILLING (an L3 batch's) meanwhile, and the
 * job counts in the lookup's in-flight count, so nothing frees or reuses them under it.
 */
typedef struct {
    uv_work_t req;
    lookup_t *op;
    size_t item;
    int l3;            /* an L3 batch (pages l3_first + first...), else the L2 run (l1_pages...) */
    uint32_t first, m; /* of the item's fetched pages (L3) or its L2 run (from 0) */
    const int32_t *slots;
    uint8_t *ok;        /* in: 1 worth checking; out: 1 verified, 2 corrupt, 0 not checked */
    uint64_t ns, bytes; /* the thread's time, the bytes it checked */
} verify_t;

static void verify_work(uv_work_t *req)
{
    verify_t *v = req->data;
    wk_tier_t *t = v->op->t;
    const item_t *it = &v->op->items[v->item];
    uint32_t P = t->shape.page_tokens;
    uint64_t t0 = uv_hrtime();
    for (uint32_t j = 0; j < v->m; j++) {
        if (!v->ok[j])
            continue;
        uint32_t page = v->l3 ? it->l3_first + v->first + j : it->l1_pages + j;
        v->ok[j] = wk_tier_page_check(wk_l2_addr(t->l2, v->slots[j]), &t->shape,
                                      it->ids + (size_t)page * P, page * P) == 0
                       ? 1
                       : 2;
        v->bytes += t->page_bytes;
        if (v->ok[j] == 2 && !v->l3) { /* a bad page ends the L2 run */
            memset(v->ok + j + 1, 0, v->m - j - 1);
            break;
        }
    }
    v->ns = uv_hrtime() - t0;
}

static void l2_verified(lookup_t *op, size_t i, verify_t *v);
static void l3_verified(lookup_t *op, size_t i, verify_t *v);

static void verify_done(uv_work_t *req, int status)
{
    verify_t *v = req->data;
    lookup_t *op = v->op;
    if (status != 0) /* not run: nothing of it is trusted */
        memset(v->ok, 0, v->m);
    else
        wk__tier_page_work(op->t, WK_TIER_WORK_VERIFY, 1, v->bytes, v->ns);
    if (v->l3)
        l3_verified(op, v->item, v);
    else
        l2_verified(op, v->item, v);
    free(v->ok);
    int l3 = v->l3;
    free(v);
    if (l3) /* its pages left FILLING */
        wk__tier_wake(op->t);
    op->inflight--;
    wk__tier_sync_gauges(op->t);
    evaluate(op);
    maybe_free(op);
}

/* Queues the check of m pages in `slots` (ok[j]: worth checking, taken over); counted in the
 * lookup's in-flight count until verify_done. When the job cannot be queued, nothing is
 * trusted (the pages are computed). */
static void verify(lookup_t *op, size_t i, int l3, uint32_t first, uint32_t m, const int32_t *slots,
                   uint8_t *ok)
{
    verify_t *v = calloc(1, sizeof(*v));
    op->inflight++;
    if (!v) {
        memset(ok, 0, m);
        verify_t tmp = {.op = op, .item = i, .l3 = l3, .first = first, .m = m, .ok = ok};
        if (l3)
            l3_verified(op, i, &tmp);
        else
            l2_verified(op, i, &tmp);
        free(ok);
        op->inflight--;
        return;
    }
    *v =
        (verify_t){.op = op, .item = i, .l3 = l3, .first = first, .m = m, .slots = slots, .ok = ok};
    v->req.data = v;
    if (uv_queue_work(op->t->w->loop, &v->req, verify_work, verify_done) != 0)
        verify_done(&v->req, UV_ECANCELED); /* evaluates: the caller must not free op after */
}

/* An L3 batch's pages were checked: the good ones become READY in L2 (clean: they are in L3). */
static void l3_verified(lookup_t *op, size_t i, verify_t *v)
{
    wk_tier_t *t = op->t;
    item_t *it = &op->items[i];
    for (uint32_t j = 0; j < v->m; j++) {
        uint32_t k = v->first + j;
        int32_t slot = it->slots[k];
        if (v->ok[j] == 2) {
            baton_counter_add(t->m_corrupt, 1);
            log_warn(COMP, "tier_page_corrupt tier=l3 key=%s", it->keys[it->l3_first + k].hex);
        }
        if (v->ok[j] == 1) {
            wk_l2_commit(t->l2, slot, 0);
            if (!op->released)
                wk_l2_pin(t->l2, slot); /* kept for the room until the request goes */
            baton_counter_add(t->m_fetched[2], (double)t->page_bytes);
            it->state[k] = 1;
        } else {
            wk_l2_drop(t->l2, slot); /* FILLING: pinned by this fetch alone */
            it->state[k] = -1;
        }
    }
    if (--it->batches_left == 0)
        it->pf.finished = 1;
    it->pf.done_pages = done_prefix(it);
}

static void on_get(void *data, int status, const baton_store_result_t *res, size_t n, size_t prefix)
{
    batch_t *b = data;
    lookup_t *op = b->op;
    wk_tier_t *t = op->t;
    item_t *it = &op->items[b->item];
    (void)prefix;
    (void)n;
    if (status != 0)
        baton_counter_add(t->m_store_err, 1);
    uint8_t *ok = malloc(b->m ? b->m : 1);
    for (uint32_t j = 0; ok && j < b->m; j++)
        ok[j] = status == 0 && res[2 * j].status == 0 && res[2 * j + 1].status == 0 &&
                res[2 * j].len == t->half && res[2 * j + 1].len == t->half;
    if (!ok) { /* nothing checked, nothing used */
        for (uint32_t j = 0; j < b->m; j++) {
            wk_l2_drop(t->l2, it->slots[b->first + j]);
            it->state[b->first + j] = -1;
        }
        if (--it->batches_left == 0)
            it->pf.finished = 1;
        it->pf.done_pages = done_prefix(it);
        wk__tier_wake(t);
        op->inflight--;
        free(b);
        evaluate(op);
        maybe_free(op);
        return;
    }
    /* every page is checked before anything uses it; the get's in-flight unit becomes the
     * check's */
    size_t i = b->item;
    uint32_t first = b->first, m = b->m;
    free(b);
    op->inflight--;
    verify(op, i, 1, first, m, it->slots + first, ok);
    evaluate(op);
    maybe_free(op);
}

/* Starts the gets of the item's L3 prefix of `pages` pages into freshly allocated L2 slots. */
static void fetch(lookup_t *op, size_t i, uint32_t pages)
{
    wk_tier_t *t = op->t;
    item_t *it = &op->items[i];
    it->slots = malloc(pages * sizeof(*it->slots));
    it->state = calloc(pages, 1);
    it->objs = malloc((size_t)pages * 2 * sizeof(*it->objs));
    if (!it->slots || !it->state || !it->objs)
        return;
    uint32_t k = 0;
    for (; k < pages; k++) {
        int32_t slot = wk_l2_alloc(t->l2, &it->keys[it->l3_first + k]);
        if (slot == -1 && k == 0 && wait_item(op, i, it->l2_pages))
            return; /* another request is fetching it: its copy is waited for, then reused */
        if (slot < 0)
            break; /* no slot free, or another request is fetching it: fetch less */
        it->slots[k] = slot;
        uint8_t *a = wk_l2_addr(t->l2, slot);
        it->objs[2 * k] = (baton_store_obj_t){it->names[2 * k], a, t->half};
        it->objs[2 * k + 1] = (baton_store_obj_t){it->names[2 * k + 1], a + t->half, t->half};
    }
    it->l3_n = k;
    if (k == 0)
        return;
    wk_pf_start(&it->pf, &t->cfg.pf, t->cfg.prefetch_policy, uv_now(t->w->loop), k,
                t->shape.page_tokens);
    for (uint32_t first = 0; first < k; first += FETCH_BATCH_PAGES) {
        uint32_t m = k - first < FETCH_BATCH_PAGES ? k - first : FETCH_BATCH_PAGES;
        batch_t *b = malloc(sizeof(*b));
        int rc = b ? baton_store_get(t->sc, it->objs + 2 * first, 2 * m, on_get, b) : BATON_ENOMEM;
        if (rc != 0) {
            free(b);
            baton_counter_add(t->m_store_err, 1);
            for (uint32_t j = first; j < first + m; j++) {
                wk_l2_drop(t->l2, it->slots[j]);
                it->state[j] = -1;
            }
            wk__tier_wake(t);
            continue;
        }
        *b = (batch_t){op, i, first, m};
        op->inflight++;
        it->batches_left++;
    }
    if (it->batches_left == 0)
        it->pf.finished = 1;
}

static void on_exists(void *data, int status, const baton_store_result_t *res, size_t n,
                      size_t prefix)
{
    batch_t *b = data;
    lookup_t *op = b->op;
    wk_tier_t *t = op->t;
    size_t i = b->item;
    item_t *it = &op->items[i];
    (void)res;
    (void)n;
    free(b);
    op->inflight--;
    it->exists_pending = 0;
    if (status != 0) {
        baton_counter_add(t->m_store_err, 1);
        log_debug(COMP, "tier_exists_failed err=%s", baton_store_strerror(status));
    }
    uint32_t pages = status == 0 ? (uint32_t)(prefix / 2) : 0; /* K and V both there */
    if (op->job && !t->closing && wk_pf_worth(&t->cfg.pf, (uint64_t)pages * t->shape.page_tokens))
        fetch(op, i, pages);
    evaluate(op);
    maybe_free(op);
}

/* The item's pages past L1 and L2 (if worth it): one batch exists of their K and V objects. */
static void start_l3(lookup_t *op, size_t i)
{
    wk_tier_t *t = op->t;
    item_t *it = &op->items[i];
    uint32_t P = t->shape.page_tokens;
    it->l3_first = it->l1_pages + it->l2_pages;
    uint32_t want = it->max_pages - it->l3_first;
    if (want > BATON_STORE_BATCH_MAX / 2)
        want = BATON_STORE_BATCH_MAX / 2;
    if (!op->job || t->closing || !t->sc || want == 0 ||
        !wk_pf_worth(&t->cfg.pf, (uint64_t)want * P))
        return;
    it->name_buf = malloc((size_t)want * 2 * t->name_cap);
    it->names = malloc((size_t)want * 2 * sizeof(*it->names));
    batch_t *b = malloc(sizeof(*b));
    if (!it->name_buf || !it->names || !b ||
        wk__tier_names(t, it->keys + it->l3_first, want, it->name_buf, it->names) != 0 ||
        baton_store_exists(t->sc, it->names, (size_t)want * 2, on_exists, b) != 0) {
        free(b);
        return;
    }
    *b = (batch_t){op, i, 0, want};
    it->exists_pending = 1;
    op->inflight++;
}

/* The L2 run was checked: it ends at the first page that is not good (that one leaves L2). */
static void l2_verified(lookup_t *op, size_t i, verify_t *v)
{
    wk_tier_t *t = op->t;
    item_t *it = &op->items[i];
    uint32_t good = 0;
    while (good < v->m && v->ok[good] == 1)
        good++;
    for (uint32_t j = good; j < v->m; j++) {
        int32_t slot = it->l2_slots[j];
        wk_l2_unpin(t->l2, slot);
        if (v->ok[j] == 2) {
            baton_counter_add(t->m_corrupt, 1);
            log_warn(COMP, "tier_page_corrupt tier=l2 key=%s", it->keys[it->l1_pages + j].hex);
            if (wk_l2_pins(t->l2, slot) == 0)
                wk_l2_drop(t->l2, slot);
        }
    }
    it->l2_pages = good;
    it->exists_pending = 0;
    start_l3(op, i);
}

/* The item's L2 run past L1: the pages found by key, pinned (no fetch may evict them before the
 * room got them), then checked byte for byte on the thread pool before L3 is asked for the rest.
 * A run that ends at a page another request is copying into L2 (an L3 fetch, a fill) waits for
 * that copy first: the page is reused, not fetched or computed twice. */
static void scan_l2(lookup_t *op, size_t i)
{
    wk_tier_t *t = op->t;
    item_t *it = &op->items[i];
    uint32_t n = 0;
    while (it->l1_pages + n < it->max_pages && wk_l2_find(t->l2, &it->keys[it->l1_pages + n]) >= 0)
        n++;
    if (it->l1_pages + n < it->max_pages && wk_l2_filling(t->l2, &it->keys[it->l1_pages + n])) {
        if (wait_item(op, i, n))
            return;
    }
    free(it->l2_slots);
    it->l2_slots = n ? malloc(n * sizeof(*it->l2_slots)) : NULL;
    uint8_t *ok = n ? malloc(n) : NULL;
    if (n == 0 || !it->l2_slots || !ok) { /* none, or none can be checked: the run is empty */
        free(ok);
        it->l2_pages = 0;
        it->exists_pending = 0;
        start_l3(op, i);
        return;
    }
    for (uint32_t j = 0; j < n; j++) {
        it->l2_slots[j] = wk_l2_find(t->l2, &it->keys[it->l1_pages + j]);
        wk_l2_pin(t->l2, it->l2_slots[j]);
    }
    memset(ok, 1, n);
    it->exists_pending = 1; /* the lookup goes only after the check (and the exists) */
    verify(op, i, 0, 0, n, it->l2_slots, ok);
}

/* The item waits for a copy into L2 to end (wk__tier_wake), holding nothing: what it pinned or
 * allocated for L3 is let go, and it looks again from its L1 hit then (`ready`: its L2 run
 * now). 0 when it may not wait any more (it goes on without those pages). */
static int wait_item(lookup_t *op, size_t i, uint32_t ready)
{
    wk_tier_t *t = op->t;
    item_t *it = &op->items[i];
    if (it->waits >= MAX_WAITS || !op->job || t->closing)
        return 0;
    if (it->waits == 0)
        it->ready_before = ready; /* its L2 run before any wait: not joined */
    for (uint32_t k = 0; k < it->l2_pages; k++)
        wk_l2_unpin(t->l2, it->l2_slots[k]);
    it->l2_pages = 0;
    free(it->slots);
    free(it->state);
    free(it->objs);
    free(it->name_buf);
    free(it->names);
    it->slots = NULL;
    it->state = NULL;
    it->objs = NULL;
    it->name_buf = NULL;
    it->names = NULL;
    it->l3_n = 0;
    it->waits++;
    it->waiting = 1;
    it->exists_pending = 1; /* the request does not go meanwhile */
    if (!op->on_wait_list) {
        op->on_wait_list = 1;
        op->inflight++; /* kept alive on the list */
        baton_list_push(&t->waiters, &op->wait_link);
    }
    return 1;
}

void wk__tier_wake(wk_tier_t *t)
{
    baton_list_t list;
    baton_list_init(&list);
    while (!baton_list_empty(&t->waiters)) {
        baton_list_t *l = baton_list_first(&t->waiters);
        baton_list_remove(l);
        baton_list_push(&list, l);
    }
    while (!baton_list_empty(&list)) {
        lookup_t *op = container_of(baton_list_first(&list), lookup_t, wait_link);
        baton_list_remove(&op->wait_link);
        op->on_wait_list = 0;
        for (size_t i = 0; i < op->n; i++) {
            item_t *it = &op->items[i];
            if (!it->waiting)
                continue;
            it->waiting = 0;
            it->exists_pending = 0;
            if (op->job && !t->closing)
                scan_l2(op, i); /* may wait again */
        }
        op->inflight--;
        evaluate(op);
        maybe_free(op);
    }
}

int wk_tier_lookup(wk_tier_t *t, wk_job_t *job, void (*then)(wk_job_t *job))
{
    if (t->closing)
        return 0;
    uint32_t P = t->shape.page_tokens;
    lookup_t *op = calloc(1, sizeof(*op));
    if (op)
        op->items = calloc(job->req.n_items, sizeof(*op->items));
    if (!op || !op->items) {
        free(op);
        return 0;
    }
    op->t = t;
    op->job = job;
    op->then = then;
    op->n = job->req.n_items;
    op->setting_up = 1; /* no check or call back may let the request go before every item started */
    t->n_ops++;
    uv_timer_init(t->w->loop, &op->timer);
    op->timer.data = op;
    for (size_t i = 0; i < op->n; i++) {
        item_t *it = &op->items[i];
        wk_item_t *wi = &job->req.items[i];
        wi->cached_l1 = wi->cached_tokens;
        it->l1_pages = wi->cached_tokens / P;
        it->max_pages = wi->prompt_tokens > 0 ? (wi->prompt_tokens - 1) / P : 0;
        if (it->max_pages <= it->l1_pages)
            continue;
        const int64_t *ids;
        int64_t *tmp;
        if (wk__item_ids(wi, &ids, &tmp) != 0)
            continue;
        size_t nid = (size_t)it->max_pages * P;
        it->ids = malloc(nid * sizeof(*it->ids));
        it->keys = malloc(it->max_pages * sizeof(*it->keys));
        if (it->ids && it->keys) {
            memcpy(it->ids, ids, nid * sizeof(*ids));
            wk_tier_keys(ids, it->max_pages * P, P, it->max_pages, it->keys);
        }
        free(tmp);
        if (!it->ids || !it->keys) {
            it->max_pages = it->l1_pages;
            continue;
        }
        scan_l2(op, i);
    }
    job->tier_lookup = op;
    op->setting_up = 0;
    evaluate(op); /* everything local: then() runs now */
    maybe_free(op);
    return 1;
}

void wk_tier_detach(wk_tier_t *t, wk_job_t *job)
{
    lookup_t *op = job->tier_lookup;
    (void)t;
    if (!op)
        return;
    job->tier_lookup = NULL;
    op->job = NULL;
    uv_timer_stop(&op->timer);
    maybe_free(op);
}
