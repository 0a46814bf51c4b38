/* offload.c — decode-side KV offload to L2 on its own thread, with the per-request in-flight
 * count that keeps a request's pages out of the pool while copies read them (offload.h). */
#include "worker/offload.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "baton/error.h"
#include "common/list.h"
#include "common/u64map.h"
#include "worker/kvpattern.h"

/* The test builds' switches (offload.h); 0 in baton-worker. */
#ifdef WK_OFFLOAD_FAULTS
#define FAULT(o, n)       ((o)->fault == (n))
#define FAULT_DELAY_US(o) ((o)->delay_us)
#else
#define FAULT(o, n)       0
#define FAULT_DELAY_US(o) 0
#endif

typedef struct job_s {
    baton_list_t link;
    wk_offload_req_t *req; /* fault 3 looks it up by rid instead */
    uint64_t rid;
    int32_t slot;     /* the L2 slot being filled */
    uint32_t page;    /* page index in the request */
    int from_l1;      /* copy of the L1 pages (else the definition) */
    uint32_t l1_slot; /* the page's pool slot, read at copy time */
    int64_t *ids;     /* page_tokens ids */
    int bad;          /* thread: the copy differs from the definition */
} job_t;

struct wk_offload_req_s {
    wk_offload_t *o;
    wk_kvlease_t *lease;
    uint32_t n_prompt;
    uint32_t pages_queued;
    unsigned inflight;  /* copies queued and not yet completed on the loop */
    int ended;          /* the request let go */
    int work_held;      /* one unit of work on the lease, held while the object lives */
    int released_early; /* fault 1 */
    int freed;          /* fault 3: let go but kept */
    uint64_t rid;
    int32_t *held; /* L2 slots of the request's pages found there: pinned while it lives */
    uint32_t n_held, cap_held;
};

struct wk_offload_s {
    wk_offload_cfg_t cfg;
    uv_loop_t *loop;
    uv_async_t async;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    baton_list_t todo, done; /* of job_t, under mu */
    int stop;
    unsigned live; /* request objects */
    int closing;
    void (*close_cb)(void *arg);
    void *close_arg;
    unsigned fault, delay_us; /* test builds only */
    baton_u64map_t by_rid;    /* fault 3 only */
    wk_offload_stats_t st;
};

/* ---- the thread ---- */

static void copy_page(const wk_offload_t *o, job_t *j, uint8_t *dst)
{
    const wk_kvshape_t *s = &o->cfg.shape;
    uint32_t P = s->page_tokens;
    uint32_t first = j->page * P;
    if (!j->from_l1) {
        wk_tier_page_fill(dst, s, j->ids, first);
        return;
    }
    uint64_t tb = wk_kvshape_token_bytes(s), half = tb / 2, page_bytes = (uint64_t)P * tb;
    uint64_t half_obj = wk_tier_page_bytes(s) / 2;
    for (uint32_t l = 0; l < s->layers; l++) {
        const uint8_t *src =
            o->cfg.l1_base + ((uint64_t)l * o->cfg.l1_slots + j->l1_slot) * page_bytes;
        for (uint32_t t = 0; t < P; t++) {
            uint64_t at = ((uint64_t)l * P + t) * half;
            memcpy(dst + at, src + t * tb, half);
            memcpy(dst + half_obj + at, src + t * tb + half, tb - half);
        }
    }
}

static void *thread_main(void *arg)
{
    wk_offload_t *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (baton_list_empty(&o->todo) && !o->stop)
            pthread_cond_wait(&o->cv, &o->mu);
        if (baton_list_empty(&o->todo))
            break;
        job_t *j = container_of(baton_list_first(&o->todo), job_t, link);
        baton_list_remove(&j->link);
        pthread_mutex_unlock(&o->mu);
        if (FAULT_DELAY_US(o)) /* test builds: a slow device-to-host copy widens the windows */
            usleep(FAULT_DELAY_US(o));
        uint8_t *dst = wk_l2_addr(o->cfg.l2, j->slot); /* pinned FILLING: only this job writes */
        copy_page(o, j, dst);
        j->bad = wk_tier_page_check(dst, &o->cfg.shape, j->ids, j->page * o->cfg.shape.page_tokens);
        pthread_mutex_lock(&o->mu);
        baton_list_push(&o->done, &j->link);
        uv_async_send(&o->async);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

/* ---- the loop ---- */

static void maybe_closed(wk_offload_t *o);

/* The L2 pages the request found there belong to the cache (other requests' lookups may hold
 * them too): the request's pins go back through the pool's count, never the slots themselves. */
static void release_held(wk_offload_req_t *r)
{
    wk_l2_t *l2 = r->o->cfg.l2;
    for (uint32_t i = 0; i < r->n_held; i++) {
        int32_t slot = r->held[i];
        if (FAULT(r->o, 4)) {
            /* the bug: the offload frees a page the cache owns as if it were its own, under
             * whoever else holds it (READY entries only, so the pool's lists stay whole) */
            wk_tier_key_t key = *wk_l2_key(l2, slot);
            if (wk_l2_find(l2, &key) == slot)
                wk_l2_drop(l2, slot);
            continue;
        }
        wk_l2_unpin(l2, slot);
    }
    free(r->held);
    r->held = NULL;
    r->n_held = r->cap_held = 0;
}

static void req_maybe_free(wk_offload_req_t *r)
{
    if (!r->ended || r->inflight || r->freed)
        return;
    wk_offload_t *o = r->o;
    if (r->work_held) /* the last copy is done and the request let go: the pages may return */
        o->cfg.lease_drop(o->cfg.ud, r->lease, 0);
    r->work_held = 0;
    release_held(r);
    if (FAULT(o, 3)) {
        /* state by id: an object another completion may still name is kept (the process that
         * re-enables this race ends without freeing it) */
        r->freed = 1;
        return;
    }
    free(r);
    o->live--;
    maybe_closed(o);
}

static void complete(wk_offload_t *o, job_t *j)
{
    wk_offload_req_t *r = j->req;
    if (FAULT(o, 3)) {
        /* the bug: the completion finds "its" request by id, which a new request may own now */
        wk_offload_req_t *by = baton_u64map_get(&o->by_rid, j->rid);
        if (by)
            r = by;
    }
    if (j->bad)
        o->st.bad_copies++;
    wk_l2_commit(o->cfg.l2, j->slot, 0);
    o->st.pages++;
    o->st.bytes += wk_tier_page_bytes(&o->cfg.shape);
    if (o->cfg.page_cb) {
        wk_l2_pin(o->cfg.l2, j->slot);
        o->cfg.page_cb(o->cfg.ud, j->slot);
    }
    if (FAULT(o, 1) && !r->released_early && r->work_held) {
        /* the bug: the request's pages go back at its first offload while it still decodes */
        r->released_early = 1;
        r->work_held = 0;
        o->cfg.lease_drop(o->cfg.ud, r->lease, 0);
        o->cfg.lease_drop(o->cfg.ud, r->lease, WK_KV_HOLD_USER);
    }
    free(j->ids);
    free(j);
    if (r->inflight)
        r->inflight--;
    req_maybe_free(r);
}

static void on_async(uv_async_t *h)
{
    wk_offload_t *o = h->data;
    baton_list_t done;
    baton_list_init(&done);
    pthread_mutex_lock(&o->mu);
    while (!baton_list_empty(&o->done)) {
        baton_list_t *l = baton_list_first(&o->done);
        baton_list_remove(l);
        baton_list_push(&done, l);
    }
    pthread_mutex_unlock(&o->mu);
    while (!baton_list_empty(&done)) {
        job_t *j = container_of(baton_list_first(&done), job_t, link);
        baton_list_remove(&j->link);
        complete(o, j);
    }
}

/* The page is in L2 already (another request's, or an earlier turn's): nothing to copy, but the
 * request holds it, a pin taken through the pool, until its own copies are done (the chain its
 * new pages hang on stays whole; an evicted early page would orphan every later one). */
static void hold_existing(wk_offload_req_t *r, const wk_tier_key_t *key)
{
    wk_l2_t *l2 = r->o->cfg.l2;
    int32_t slot = wk_l2_find(l2, key); /* READY only (a filling page is someone's copy) */
    if (slot < 0)
        return;
    if (r->n_held == r->cap_held) {
        uint32_t cap = r->cap_held ? 2 * r->cap_held : 8;
        int32_t *h = realloc(r->held, cap * sizeof(*h));
        if (!h)
            return; /* not held: it stays the cache's alone */
        r->held = h;
        r->cap_held = cap;
    }
    wk_l2_pin(l2, slot);
    r->held[r->n_held++] = slot;
}

/* Queues page p of the request (ids: the request's ids from its start; key: the page's). */
static void queue_page(wk_offload_req_t *r, const int64_t *ids, uint32_t p,
                       const wk_tier_key_t *key)
{
    wk_offload_t *o = r->o;
    uint32_t P = o->cfg.shape.page_tokens;
    job_t *j = calloc(1, sizeof(*j));
    int64_t *pid = malloc(P * sizeof(*pid));
    if (!j || !pid)
        goto skip;
    j->slot = wk_l2_alloc(o->cfg.l2, key);
    if (j->slot == -1)
        hold_existing(r, key);
    if (j->slot < 0)
        goto skip; /* there already, or no slot free: not offloaded */
    memcpy(pid, ids + (size_t)p * P, P * sizeof(*pid));
    j->ids = pid;
    j->req = r;
    j->rid = r->rid;
    j->page = p;
    j->from_l1 = (p + 1) * P <= r->n_prompt && r->lease->slots != NULL;
    j->l1_slot = j->from_l1 ? r->lease->slots[p] : 0;
    r->inflight++;
    pthread_mutex_lock(&o->mu);
    baton_list_push(&o->todo, &j->link);
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
    return;
skip:
    o->st.skipped++;
    free(j);
    free(pid);
}

wk_offload_req_t *wk_offload_begin(wk_offload_t *o, wk_kvlease_t *lease, const int64_t *ids,
                                   uint32_t n_prompt, uint64_t rid)
{
    if (o->closing)
        return NULL;
    wk_offload_req_t *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->o = o;
    r->lease = lease;
    r->n_prompt = n_prompt;
    r->rid = rid;
    o->live++;
    /* the fix: the request's pages stay out of the pool until its last copy completed */
    if (!FAULT(o, 2)) {
        wk_kvlease_work_start(lease);
        r->work_held = 1;
    }
    if (FAULT(o, 3)) {
        baton_u64map_del(&o->by_rid, rid);
        baton_u64map_put(&o->by_rid, rid, r);
    }
    wk_offload_tokens(r, ids, n_prompt);
    return r;
}

void wk_offload_tokens(wk_offload_req_t *r, const int64_t *ids, uint32_t n)
{
    uint32_t P = r->o->cfg.shape.page_tokens, pages = n / P;
    if (r->ended || pages <= r->pages_queued)
        return;
    /* the chain from the first page (one pass: keys depend on every page before) */
    wk_tier_key_t *keys = malloc(pages * sizeof(*keys));
    if (!keys)
        return;
    wk_tier_keys(ids, pages * P, P, pages, keys);
    for (; r->pages_queued < pages; r->pages_queued++)
        queue_page(r, ids, r->pages_queued, &keys[r->pages_queued]);
    free(keys);
}

void wk_offload_end(wk_offload_req_t *r)
{
    r->ended = 1;
    req_maybe_free(r);
}

void wk_offload_stats(const wk_offload_t *o, wk_offload_stats_t *st)
{
    *st = o->st;
}

int wk_offload_create(wk_offload_t **o_p, uv_loop_t *loop, const wk_offload_cfg_t *cfg)
{
    wk_offload_t *o = calloc(1, sizeof(*o));
    if (!o)
        return BATON_ENOMEM;
    o->cfg = *cfg;
    o->loop = loop;
    baton_list_init(&o->todo);
    baton_list_init(&o->done);
    baton_u64map_init(&o->by_rid);
#ifdef WK_OFFLOAD_FAULTS
    const char *f = getenv("BATON_OFFLOAD_FAULT");
    o->fault = f ? (unsigned)atoi(f) : 0;
    const char *d = getenv("BATON_OFFLOAD_DELAY_US");
    o->delay_us = d ? (unsigned)atoi(d) : 0;
#endif
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->cv, NULL);
    uv_async_init(loop, &o->async, on_async);
    o->async.data = o;
    if (pthread_create(&o->thread, NULL, thread_main, o) != 0) {
        uv_close((uv_handle_t *)&o->async, NULL);
        return BATON_ENOMEM; /* the loop frees nothing of o's: the caller's start failed */
    }
    *o_p = o;
    return 0;
}

static void async_closed(uv_handle_t *h)
{
    wk_offload_t *o = h->data;
    void (*cb)(void *) = o->close_cb;
    void *arg = o->close_arg;
    pthread_mutex_destroy(&o->mu);
    pthread_cond_destroy(&o->cv);
    baton_u64map_free(&o->by_rid);
    free(o);
    if (cb)
        cb(arg);
}

static void maybe_closed(wk_offload_t *o)
{
    if (!o->closing || o->live)
        return;
    o->closing = 2; /* once */
    pthread_mutex_lock(&o->mu);
    o->stop = 1;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
    pthread_join(o->thread, NULL);
    uv_close((uv_handle_t *)&o->async, async_closed);
}

void wk_offload_close(wk_offload_t *o, void (*cb)(void *arg), void *arg)
{
    o->closing = 1;
    o->close_cb = cb;
    o->close_arg = arg;
    maybe_closed(o);
}
