/* kvxfer.c — baton-worker's KV hand-off through libbaton (see kvxfer.h): page region and pool,
 * decode offers and verification, prefill matching, fills and writes, metrics. */
#include "worker/kvxfer.h"

#include <endian.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "baton/error.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/u64map.h"
#include "worker/kvpattern.h"
#include "worker/simtext.h"

#define COMP "worker"

/* An offer whose request never comes is aborted after the timeout plus this grace, so a decode
 * that is still waiting sees its own timeout (504) rather than our abort (502). */
#define ORPHAN_GRACE_MS 1000

/* DONE payload (little-endian), so the decode can tell a mismatch from corruption. */
#define DONE_MAGIC       0x564B5742u /* "BWKV" */
#define DONE_VERSION     1u
#define DONE_LEN         40
#define DONE_ST_OK       0
#define DONE_ST_MISMATCH 1

enum { S_ORPHAN = 1, S_WAITING, S_MATCHED, S_TOMB };
enum { L_NONE = 0, L_ORPHANS, L_TOMBS, L_MATCHED };
enum { F_NONE = 0, F_FILLING, F_FILLED, F_WRITTEN };

typedef struct ep_s {
    struct ep_s *next;
    char name[300];
    int state; /* baton_xfer_peer_state_t, 0 before the first event */
    uint32_t up_seq;
} ep_t;

struct wk_kv_send_s {
    wk_kv_t *kv;
    uint64_t room_id;
    int st;
    int in_map;
    int list;          /* L_*: which of kv's lists holds it */
    baton_list_t link; /* in that list */
    uint64_t expires_ms;
    baton_xfer_room_t *xroom; /* from room_cb until room_closed_cb */

    int has_req;
    void *data;
    wk_kv_matched_cb matched;
    wk_kv_sent_cb sent;
    int64_t *ids;
    uint32_t n_tokens;
    uint64_t seed;
    int want_first;
    uint32_t ppl;

    wk_kvlease_t lease;
    uint8_t *layer_st; /* F_* per layer */
    uint32_t n_written;
    uint32_t n_write_now; /* layers asked to be written as soon as filled */
    int finishing, completed, mismatch, corrupt, counted;
    int32_t first_token;
    uint64_t t_first_write_ns, t_compute_end_ns;
    char *why; /* a mismatch's reason (owned) */
};

struct wk_kv_recv_s {
    wk_kv_t *kv;
    uint64_t room_id;
    int64_t *ids;
    uint32_t n_tokens;
    uint64_t seed;
    int want_first;
    uint32_t ppl;
    wk_kvlease_t lease;
    int has_req, reported, offer_open;
    wk_kv_recv_cb cb;
    void *data;
    ep_t *ep;
    int was_up;
    uint32_t up_seq;
    uint64_t t_offer_ns;
    /* from DONE */
    int32_t first_token;
    /* from the checks (one thread-pool job per layer, queued as libbaton reports the layer in
     * place, or at DONE for any layer it did not report) */
    uint8_t *layer_queued; /* per layer: its check was queued */
    int done_ok;           /* DONE arrived and its payload fits: the verdict may be given */
    uint32_t checks_pending;
    int check_failed;
    uint64_t diff;
    uint32_t bad_layer, bad_page;
    uint64_t bad_off;
};

typedef struct work_s {
    uv_work_t req;
    wk_kv_t *kv;
    wk_kv_send_t *s; /* fill */
    wk_kv_recv_t *r; /* check */
    uint32_t l0, l1; /* layers [l0, l1) */
    /* check results (the thread writes them, the loop reads them after) */
    uint64_t diff, bad_off;
    uint32_t bad_layer, bad_page;
} work_t;

struct wk_kv_s {
    uv_loop_t *loop;
    wk_kv_cfg_t cfg;
    baton_xfer_engine_t *eng;
    baton_xfer_mem_t *mem;
    uint8_t *base;
    uint64_t token_bytes, page_bytes;
    uint32_t n_slots;
    wk_kvpool_t pool;

    uv_idle_t defer;
    uv_timer_t tick;
    int handles_ok;   /* defer and tick may be started */
    int handles_open; /* while closing them */

    baton_u64map_t rooms; /* prefill: room id -> wk_kv_send_t */
    baton_list_t orphans, tombs, matched; /* of wk_kv_send_t.link, oldest first */
    ep_t *eps; /* decode: endpoints seen in peer events or offers */
    unsigned n_eps;

    unsigned work_inflight; /* thread-pool jobs (fills, checks, pre-faults) not finished */
    unsigned prefault_left;
    uint64_t prefault_bytes, prefault_t0;
    uint64_t fault_counter;
    int closing, destroying;
    void (*close_cb)(void *arg);
    void *close_arg;

    baton_metric_family_t *f_fail;
    baton_metric_child_t *m_ok, *m_failed, *m_bytes, *m_xfer, *m_tail, *m_up, *m_down, *m_reconn,
        *m_corrupt, *m_frames_rej, *m_writes_rej, *m_free, *m_used, *m_waiting;
    baton_xfer_stats_t seen;
};

static const char *reason_of(int status)
{
    switch (status) {
    case BATON_EABORTED:
        return "aborted";
    case BATON_EPEERDOWN:
        return "peer_down";
    case WK_EUNREACHABLE:
        return "unreachable";
    case WK_EMISMATCH:
        return "mismatch";
    case BATON_EKVCORRUPT:
        return "kv_corrupted";
    case BATON_ENOTSUP:
    case BATON_ERKEY:
    case BATON_ESTALE:
    case BATON_EEXIST:
        return "refused";
    case BATON_ESHUTDOWN:
        return "shutdown";
    case BATON_ETIMEOUT:
        return "timeout";
    case BATON_ECANCELED:
        return "canceled";
    case BATON_ENOMEM:
        return "nomem";
    default:
        return "other";
    }
}

static void count_fail(wk_kv_t *kv, const char *reason)
{
    const char *lv[1] = {reason};
    baton_counter_add(kv->m_failed, 1);
    baton_counter_inc_labels(kv->f_fail, lv);
}

static void observe_since(baton_metric_child_t *h, uint64_t t0_ns)
{
    if (t0_ns)
        baton_histogram_observe(h, baton_seconds_since(t0_ns));
}

/* ---- deferred work: matched callbacks and pool waiters ------------------------------------ */

static void defer_cb(uv_idle_t *h);

static void kick(wk_kv_t *kv)
{
    if (kv->handles_ok)
        uv_idle_start(&kv->defer, defer_cb);
}

static void list_push(baton_list_t *l, int which, wk_kv_send_t *s)
{
    s->list = which;
    baton_list_push(l, &s->link);
}

static void list_remove(wk_kv_send_t *s)
{
    if (s->list == L_NONE)
        return;
    baton_list_remove(&s->link);
    s->list = L_NONE;
}

static wk_kv_send_t *list_head(const baton_list_t *l)
{
    baton_list_t *first = baton_list_first(l);
    return first ? container_of(first, wk_kv_send_t, link) : NULL;
}

/* The room failed or was given up: remembered for a timeout period, so that its late request
 * or offer is refused at once. */
static void tomb_push(wk_kv_t *kv, wk_kv_send_t *s, uint64_t now)
{
    s->st = S_TOMB;
    s->expires_ms = now + kv->cfg.timeout_ms;
    list_push(&kv->tombs, L_TOMBS, s);
}

static void defer_cb(uv_idle_t *h)
{
    wk_kv_t *kv = h->data;
    wk_kv_send_t *s;
    while ((s = list_head(&kv->matched)) != NULL) {
        list_remove(s);
        if (s->has_req && s->matched)
            s->matched(s->data);
    }
    wk_kvwait_t *w;
    while ((w = wk_kvpool_next_ready(&kv->pool)) != NULL) {
        wk_kv_resv_t *r = (wk_kv_resv_t *)w;
        r->cb(r);
    }
    if (baton_list_empty(&kv->matched))
        uv_idle_stop(h);
}

/* ---- pool ------------------------------------------------------------------------------- */

uint32_t wk_kv_slots_for(const wk_kv_t *kv, uint32_t n_tokens)
{
    return wk_kvshape_pages(&kv->cfg.shape, n_tokens ? n_tokens : 1);
}

uint32_t wk_kv_pool_slots(const wk_kv_t *kv)
{
    return kv->n_slots;
}

int wk_kv_reserve(wk_kv_t *kv, wk_kv_resv_t *r, uint32_t n, uint32_t *slots, wk_kv_resv_cb cb,
                  void *data)
{
    memset(r, 0, sizeof(*r));
    r->kv = kv;
    r->cb = cb;
    r->w.n = n;
    r->w.slots = slots;
    r->w.data = data;
    int rc = wk_kvpool_take(&kv->pool, n, slots);
    if (rc == 0)
        return 0;
    if (rc != BATON_EBUSY)
        return rc;
    wk_kvpool_wait(&kv->pool, &r->w);
    return 1;
}

void wk_kv_reserve_cancel(wk_kv_t *kv, wk_kv_resv_t *r)
{
    int was_head = wk_kvpool_head(&kv->pool) == &r->w;
    wk_kvpool_cancel(&kv->pool, &r->w);
    if (was_head)
        kick(kv); /* the next one may fit now */
}

void wk_kv_unreserve(wk_kv_t *kv, const uint32_t *slots, uint32_t n)
{
    wk_kvpool_put(&kv->pool, slots, n);
    kick(kv);
}

static uint8_t *page_addr(const wk_kv_t *kv, uint32_t layer, uint32_t slot)
{
    return kv->base + ((uint64_t)layer * kv->n_slots + slot) * kv->page_bytes;
}

static uint64_t page_len(const wk_kv_t *kv, uint32_t n_tokens, uint32_t page)
{
    return (uint64_t)wk_kvshape_page_tokens_at(&kv->cfg.shape, n_tokens, page) * kv->token_bytes;
}

/* The pages of layers [l0, l1) of a room (ppl slots, n_tokens), layer after layer. */
static void room_iov(const wk_kv_t *kv, const uint32_t *slots, uint32_t ppl, uint32_t n_tokens,
                     uint32_t l0, uint32_t l1, baton_xfer_iov_t *iov)
{
    for (uint32_t l = l0; l < l1; l++)
        for (uint32_t j = 0; j < ppl; j++, iov++) {
            iov->addr = page_addr(kv, l, slots[j]);
            iov->len = page_len(kv, n_tokens, j);
        }
}

/* Drops a hold; when that returned the slots, waiters may be served. */
static void lease_drop(wk_kv_t *kv, wk_kvlease_t *l, unsigned hold)
{
    if (wk_kvlease_drop(&kv->pool, l, hold))
        kick(kv);
}

static void lease_work_done(wk_kv_t *kv, wk_kvlease_t *l)
{
    if (wk_kvlease_work_done(&kv->pool, l))
        kick(kv);
}

static int64_t *copy_ids(const wk_kv_prompt_t *pr)
{
    int64_t *ids = malloc((size_t)pr->n_tokens * sizeof(*ids));
    if (ids)
        memcpy(ids, pr->ids, (size_t)pr->n_tokens * sizeof(*ids));
    return ids;
}

/* ---- thread-pool work -------------------------------------------------------------------- */

static void maybe_destroy_engine(wk_kv_t *kv);

static void fill_work(uv_work_t *req)
{
    work_t *w = req->data;
    wk_kv_send_t *s = w->s;
    wk_kv_t *kv = w->kv;
    uint32_t P = kv->cfg.shape.page_tokens;
    for (uint32_t l = w->l0; l < w->l1; l++) {
        for (uint32_t j = 0; j < s->ppl; j++) {
            uint32_t first = j * P;
            uint32_t n = wk_kvshape_page_tokens_at(&kv->cfg.shape, s->n_tokens, j);
            wk_kv_fill(page_addr(kv, l, s->lease.slots[j]), kv->token_bytes, s->ids + first, first,
                       n, l);
        }
        if (s->corrupt && l == kv->cfg.shape.layers - 1) {
            /* test-only fault: one byte of the last layer's first page */
            uint8_t *p = page_addr(kv, l, s->lease.slots[0]);
            p[s->room_id % page_len(kv, s->n_tokens, 0)] ^= 0x5A;
        }
    }
}

static void check_work(uv_work_t *req)
{
    work_t *w = req->data;
    const wk_kv_recv_t *r = w->r;
    wk_kv_t *kv = w->kv;
    uint32_t P = kv->cfg.shape.page_tokens;
    for (uint32_t l = w->l0; l < w->l1; l++) {
        for (uint32_t j = 0; j < r->ppl; j++) {
            uint32_t first = j * P;
            uint32_t n = wk_kvshape_page_tokens_at(&kv->cfg.shape, r->n_tokens, j);
            uint64_t off = 0;
            uint64_t d = wk_kv_check(page_addr(kv, l, r->lease.slots[j]), kv->token_bytes,
                                     r->ids + first, first, n, l, &off);
            if (d != 0 && w->diff == 0) {
                w->bad_layer = l;
                w->bad_page = j;
                w->bad_off = off;
            }
            w->diff |= d;
        }
    }
}

static int queue_work(wk_kv_t *kv, wk_kv_send_t *s, wk_kv_recv_t *r, uint32_t l0, uint32_t l1,
                      uv_after_work_cb after)
{
    work_t *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return BATON_ENOMEM;
    w->kv = kv;
    w->s = s;
    w->r = r;
    w->l0 = l0;
    w->l1 = l1;
    w->req.data = w;
    int rc = uv_queue_work(kv->loop, &w->req, s ? fill_work : check_work, after);
    if (rc != 0) {
        free(w);
        return rc;
    }
    kv->work_inflight++;
    wk_kvlease_work_start(s ? &s->lease : &r->lease);
    return 0;
}

/* ---- decode: pre-faulting the page region ----------------------------------------------- */

/*
 * The decode's region is a fresh memfd: every page's first write (by the transport, whichever
 * process makes it) takes a page fault and a zeroed page, measured at about 1.5 GB/s against
 * about 20 GB/s into touched memory. So the decode touches the whole region once at start, on
 * the thread pool in chunks (the loop never waits; a room that arrives meanwhile is only
 * slower). MADV_POPULATE_WRITE (Linux 5.14) faults pages in writable without changing a byte;
 * where it is missing, an atomic add of 0 per page does the same. Neither writes data, so a
 * transfer into pages being touched at the same moment is safe.
 */
#define PREFAULT_CHUNK (64ull << 20)
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

typedef struct {
    uv_work_t req;
    wk_kv_t *kv;
    uint8_t *addr;
    size_t len;
} prefault_t;

static void prefault_work(uv_work_t *req)
{
    prefault_t *p = req->data;
    if (madvise(p->addr, p->len, MADV_POPULATE_WRITE) == 0)
        return;
    for (size_t off = 0; off < p->len; off += 4096)
        __atomic_fetch_add(p->addr + off, 0, __ATOMIC_RELAXED);
}

static void prefault_done(uv_work_t *req, int status)
{
    prefault_t *p = req->data;
    wk_kv_t *kv = p->kv;
    (void)status;
    kv->work_inflight--;
    if (--kv->prefault_left == 0)
        log_info(COMP, "kv_prefault_done bytes=%" PRIu64 " ms=%.1f", kv->prefault_bytes,
                 (double)(uv_hrtime() - kv->prefault_t0) / 1e6);
    free(p);
    maybe_destroy_engine(kv);
}

/* Queues the touch of [base, base+len); a chunk that cannot be queued is simply left cold. */
static void prefault_start(wk_kv_t *kv, uint8_t *base, uint64_t len)
{
    kv->prefault_t0 = uv_hrtime();
    kv->prefault_bytes = len;
    for (uint64_t off = 0; off < len; off += PREFAULT_CHUNK) {
        prefault_t *p = calloc(1, sizeof(*p));
        if (p == NULL)
            return;
        p->kv = kv;
        p->addr = base + off;
        p->len = (size_t)(len - off < PREFAULT_CHUNK ? len - off : PREFAULT_CHUNK);
        p->req.data = p;
        if (uv_queue_work(kv->loop, &p->req, prefault_work, prefault_done) != 0) {
            free(p);
            return;
        }
        kv->work_inflight++;
        kv->prefault_left++;
    }
}

/* ---- prefill ---------------------------------------------------------------------------- */

static void send_free(wk_kv_send_t *s)
{
    free(s->ids);
    free(s->layer_st);
    free(s->lease.slots);
    free(s->why);
    free(s);
}

/* Frees s once nothing refers to it anymore. */
static void send_maybe_free(wk_kv_send_t *s)
{
    if (s->has_req || s->xroom != NULL || s->lease.work > 0 || s->in_map || s->list != L_NONE)
        return;
    send_free(s);
}

static void map_remove(wk_kv_t *kv, wk_kv_send_t *s)
{
    if (s->in_map) {
        baton_u64map_del(&kv->rooms, s->room_id);
        s->in_map = 0;
    }
}

static void done_payload(const wk_kv_t *kv, const wk_kv_send_t *s, uint8_t out[DONE_LEN])
{
    uint32_t u32;
    uint64_t u64;
    memset(out, 0, DONE_LEN);
    u32 = htole32(DONE_MAGIC);
    memcpy(out + 0, &u32, 4);
    u32 = htole32(DONE_VERSION);
    memcpy(out + 4, &u32, 4);
    u32 = htole32(s->n_tokens);
    memcpy(out + 8, &u32, 4);
    u32 = htole32(kv->cfg.shape.layers);
    memcpy(out + 12, &u32, 4);
    u64 = htole64(kv->token_bytes);
    memcpy(out + 16, &u64, 8);
    u32 = htole32(kv->cfg.shape.page_tokens);
    memcpy(out + 24, &u32, 4);
    u64 = htole64(s->seed);
    memcpy(out + 32, &u64, 8);
}

static void send_complete(wk_kv_send_t *s, int32_t status)
{
    wk_kv_t *kv = s->kv;
    uint8_t payload[DONE_LEN];
    done_payload(kv, s, payload);
    baton_xfer_done_t done = {status, status == DONE_ST_OK ? s->first_token : -1, payload,
                              sizeof(payload)};
    s->completed = 1;
    int rc = baton_xfer_room_complete(s->xroom, &done);
    if (rc != 0 && rc != BATON_ECANCELED && rc != BATON_ESHUTDOWN) {
        log_warn(COMP, "kv_complete_failed room=%" PRIu64 " err=%s", s->room_id,
                 baton_err_name(rc));
        baton_xfer_room_abort(s->xroom, rc);
    }
}

static void on_write(baton_xfer_room_t *room, uint32_t layer, int status, void *data)
{
    (void)room;
    (void)data;
    if (status != 0)
        log_debug(COMP, "kv_write_failed layer=%" PRIu32 " err=%s", layer, baton_err_name(status));
}

/* Writes every filled layer that may go now; completes the room when all are out. */
static void send_pump(wk_kv_send_t *s)
{
    wk_kv_t *kv = s->kv;
    if (s->xroom == NULL || s->completed || s->st != S_MATCHED || !s->has_req || kv->closing ||
        !wk_kvlease_live(&s->lease))
        return;
    uint32_t L = kv->cfg.shape.layers;
    uint32_t filled = 0;
    for (uint32_t l = 0; l < L; l++)
        if (s->layer_st[l] >= F_FILLED)
            filled++;
    baton_xfer_iov_t *iov = malloc((size_t)L * s->ppl * sizeof(*iov));
    if (iov == NULL) {
        baton_xfer_room_abort(s->xroom, BATON_ENOMEM);
        s->completed = 1;
        return;
    }
    int rc = 0;
    if (s->n_write_now == 0) {
        /* not layer-wise: one write for the whole room once all of it is computed and filled */
        if (!s->finishing || filled < L) {
            free(iov);
            return;
        }
        room_iov(kv, s->lease.slots, s->ppl, s->n_tokens, 0, L, iov);
        if (s->t_first_write_ns == 0)
            s->t_first_write_ns = uv_hrtime();
        rc = baton_xfer_write_room(s->xroom, iov, (size_t)L * s->ppl, on_write, s);
        log_debug(COMP, "kv_write room=%" PRIu64 " layers=0-%" PRIu32 " err=%s", s->room_id, L - 1,
                  rc ? baton_err_name(rc) : "-");
        if (rc == 0) {
            for (uint32_t l = 0; l < L; l++)
                s->layer_st[l] = F_WRITTEN;
            s->n_written = L;
        }
    } else {
        for (uint32_t l = 0; l < L && rc == 0; l++) {
            if (s->layer_st[l] != F_FILLED || s->n_write_now == 0)
                continue;
            room_iov(kv, s->lease.slots, s->ppl, s->n_tokens, l, l + 1, iov);
            if (s->t_first_write_ns == 0)
                s->t_first_write_ns = uv_hrtime();
            rc = baton_xfer_write_layer(s->xroom, l, iov, s->ppl, on_write, s);
            log_debug(COMP, "kv_write room=%" PRIu64 " layers=%" PRIu32 "-%" PRIu32 " err=%s",
                      s->room_id, l, l, rc ? baton_err_name(rc) : "-");
            if (rc == 0) {
                s->layer_st[l] = F_WRITTEN;
                s->n_written++;
            }
        }
    }
    free(iov);
    if (rc != 0) {
        if (rc != BATON_ECANCELED && rc != BATON_ESHUTDOWN) {
            log_warn(COMP, "kv_write_refused room=%" PRIu64 " err=%s", s->room_id,
                     baton_err_name(rc));
            baton_xfer_room_abort(s->xroom, rc);
        }
        s->completed = 1; /* the room's close reports what happened */
        return;
    }
    if (s->finishing && s->n_written == L)
        send_complete(s, DONE_ST_OK);
}

static void fill_done(uv_work_t *req, int status)
{
    work_t *w = req->data;
    wk_kv_t *kv = w->kv;
    wk_kv_send_t *s = w->s;
    kv->work_inflight--;
    for (uint32_t l = w->l0; l < w->l1; l++)
        s->layer_st[l] = status == 0 ? F_FILLED : F_NONE;
    free(w);
    lease_work_done(kv, &s->lease);
    if (status != 0 && s->xroom != NULL && !s->completed) {
        baton_xfer_room_abort(s->xroom, BATON_ECANCELED);
        s->completed = 1;
    }
    send_pump(s);
    send_maybe_free(s);
    maybe_destroy_engine(kv);
}

/* Starts filling layers [l0, l1) that are not filled yet. */
static void send_fill(wk_kv_send_t *s, uint32_t l0, uint32_t l1)
{
    wk_kv_t *kv = s->kv;
    if (!wk_kvlease_live(&s->lease) || kv->closing)
        return;
    /* one job per layer: a whole room filled at once spreads over every thread of the pool */
    for (uint32_t l = l0; l < l1; l++) {
        if (s->layer_st[l] != F_NONE)
            continue;
        int rc = queue_work(kv, s, NULL, l, l + 1, fill_done);
        if (rc != 0) {
            log_warn(COMP, "kv_fill_failed room=%" PRIu64 " err=%s", s->room_id,
                     baton_err_name(rc));
            if (s->xroom != NULL && !s->completed) {
                baton_xfer_room_abort(s->xroom, rc);
                s->completed = 1;
            }
            return;
        }
        s->layer_st[l] = F_FILLING;
    }
}

/* Compares the offer with the request's own shape; 0 when they agree. */
static int shape_check(const wk_kv_t *kv, const wk_kv_send_t *s, char *why, size_t cap)
{
    baton_xfer_room_t *x = s->xroom;
    uint32_t L = kv->cfg.shape.layers;
    uint32_t ppl = wk_kv_slots_for(kv, s->n_tokens);
    if (baton_xfer_room_layers(x) != L || baton_xfer_room_pages_per_layer(x) != ppl) {
        snprintf(why, cap, "offer has %u layers x %u pages, prefill needs %u x %u",
                 baton_xfer_room_layers(x), baton_xfer_room_pages_per_layer(x), L, ppl);
        return -1;
    }
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t j = 0; j < ppl; j++)
            if (baton_xfer_room_page_len(x, l, j) != page_len(kv, s->n_tokens, j)) {
                snprintf(why, cap,
                         "offer page %u of layer %u has %" PRIu64 " bytes, prefill has %" PRIu64, j,
                         l, baton_xfer_room_page_len(x, l, j), page_len(kv, s->n_tokens, j));
                return -1;
            }
    return 0;
}

/* Both sides of the room are here. */
static void send_match(wk_kv_send_t *s)
{
    wk_kv_t *kv = s->kv;
    s->st = S_MATCHED;
    char why[160];
    if (shape_check(kv, s, why, sizeof(why)) != 0) {
        log_warn(COMP, "kv_room_mismatch room=%" PRIu64 " reason=\"%s\"", s->room_id, why);
        s->mismatch = 1;
        free(s->why);
        s->why = strdup(why);
        send_complete(s, DONE_ST_MISMATCH); /* the decode learns why; nothing is written */
        return;
    }
    if (kv->cfg.fault_corrupt_every > 0 && ++kv->fault_counter % kv->cfg.fault_corrupt_every == 0) {
        s->corrupt = 1;
        log_warn(COMP, "fault_injected kind=corrupt_kv room=%" PRIu64, s->room_id);
    }
    list_push(&kv->matched, L_MATCHED, s);
    kick(kv);
}

static void on_room(baton_xfer_engine_t *eng, baton_xfer_room_t *room, void *data)
{
    wk_kv_t *kv = data;
    uint64_t id = baton_xfer_room_id(room);
    if (kv->closing) {
        baton_xfer_room_abort(room, BATON_ESHUTDOWN);
        return;
    }
    wk_kv_send_t *s = baton_u64map_get(&kv->rooms, id);
    if (s == NULL) {
        s = calloc(1, sizeof(*s));
        if (s == NULL || baton_u64map_put(&kv->rooms, id, s) != 0) {
            free(s);
            baton_xfer_room_abort(room, BATON_ENOMEM);
            return;
        }
        s->kv = kv;
        s->room_id = id;
        s->in_map = 1;
        s->st = S_ORPHAN;
        s->xroom = room;
        s->expires_ms = baton_now_ms() + kv->cfg.timeout_ms + ORPHAN_GRACE_MS;
        list_push(&kv->orphans, L_ORPHANS, s);
        baton_xfer_room_set_data(room, s);
        log_debug(COMP, "kv_offer_waiting room=%" PRIu64 " peer=%s", id,
                  baton_xfer_room_peer_id(room));
        return;
    }
    if (s->st == S_WAITING) {
        s->xroom = room;
        baton_xfer_room_set_data(room, s);
        send_match(s);
        return;
    }
    /* A tombstone (its request failed or left), or a second offer for a room already open. */
    log_info(COMP, "kv_offer_refused room=%" PRIu64 " peer=%s reason=%s", id,
             baton_xfer_room_peer_id(room), s->st == S_TOMB ? "request_gone" : "room_in_use");
    count_fail(kv, s->st == S_TOMB ? "aborted" : "refused");
    baton_xfer_room_abort(room, s->st == S_TOMB ? BATON_ECANCELED : BATON_EEXIST);
}

static void on_room_closed(baton_xfer_engine_t *eng, baton_xfer_room_t *room, int status,
                           void *data)
{
    wk_kv_t *kv = data;
    wk_kv_send_t *s = baton_xfer_room_get_data(room);
    if (s == NULL)
        return; /* refused at once */
    s->xroom = NULL;
    if (s->st == S_ORPHAN) {
        /* its decode gave up (or went away) before the request came: remember the room for a
         * timeout period so a late request fails at once instead of waiting for its deadline */
        list_remove(s);
        if (!s->counted) {
            s->counted = 1;
            count_fail(kv, reason_of(status ? status : BATON_EABORTED));
        }
        tomb_push(kv, s, baton_now_ms());
        send_maybe_free(s);
        return;
    }
    if (s->st == S_TOMB) {
        send_maybe_free(s); /* an expired offer: its tombstone lives on until it expires */
        return;
    }
    map_remove(kv, s);
    list_remove(s); /* a matched callback not delivered yet */
    lease_drop(kv, &s->lease, WK_KV_HOLD_XFER);
    int rep = status;
    if (status == 0 && s->mismatch)
        rep = WK_EMISMATCH;
    if (!s->counted) {
        s->counted = 1;
        if (rep == 0) {
            baton_counter_add(kv->m_ok, 1);
            observe_since(kv->m_xfer, s->t_first_write_ns);
            observe_since(kv->m_tail, s->t_compute_end_ns);
        } else {
            count_fail(kv, reason_of(rep));
        }
    }
    if (s->has_req) {
        s->has_req = 0;
        lease_drop(kv, &s->lease, WK_KV_HOLD_USER);
        char detail[200];
        snprintf(detail, sizeof(detail), "%s", rep == WK_EMISMATCH && s->why ? s->why : "");
        s->sent(s->data, rep, detail);
    }
    send_maybe_free(s);
}

int wk_kv_send_open(wk_kv_t *kv, uint64_t room, const wk_kv_prompt_t *pr, wk_kv_matched_cb matched,
                    wk_kv_sent_cb sent, void *data, wk_kv_send_t **s_p)
{
    if (kv->closing)
        return BATON_ESHUTDOWN;
    if (pr->n_tokens == 0)
        return BATON_EINVAL;
    wk_kv_send_t *s = baton_u64map_get(&kv->rooms, room);
    if (s != NULL && s->st == S_TOMB)
        return BATON_EABORTED;
    if (s != NULL && s->st != S_ORPHAN)
        return BATON_EEXIST;
    int64_t *ids = copy_ids(pr);
    uint8_t *layer_st = calloc(kv->cfg.shape.layers, 1);
    wk_kv_send_t *fresh = s == NULL ? calloc(1, sizeof(*fresh)) : NULL;
    if (ids == NULL || layer_st == NULL || (s == NULL && fresh == NULL) ||
        (fresh != NULL && baton_u64map_put(&kv->rooms, room, fresh) != 0)) {
        free(ids);
        free(layer_st);
        free(fresh);
        return BATON_ENOMEM;
    }
    if (fresh != NULL) {
        s = fresh;
        s->kv = kv;
        s->room_id = room;
        s->in_map = 1;
        s->st = S_WAITING;
    }
    s->has_req = 1;
    s->data = data;
    s->matched = matched;
    s->sent = sent;
    s->ids = ids;
    s->layer_st = layer_st;
    s->n_tokens = pr->n_tokens;
    s->seed = pr->seed;
    s->want_first = pr->want_first;
    s->ppl = wk_kv_slots_for(kv, pr->n_tokens);
    s->first_token = -1;
    if (s->st == S_ORPHAN) {
        list_remove(s);
        send_match(s); /* reports through the deferred list, never inside this call */
    }
    *s_p = s;
    return 0;
}

int wk_kv_send_slots(wk_kv_send_t *s, const uint32_t *slots)
{
    unsigned holds = WK_KV_HOLD_USER | (s->xroom != NULL ? WK_KV_HOLD_XFER : 0);
    return wk_kvlease_init(&s->lease, slots, s->ppl, holds);
}

void wk_kv_send_layer(wk_kv_send_t *s, uint32_t layer, int write_now)
{
    if (layer >= s->kv->cfg.shape.layers || s->completed)
        return;
    if (write_now)
        s->n_write_now++;
    if (s->layer_st[layer] == F_FILLED)
        send_pump(s);
    else
        send_fill(s, layer, layer + 1);
}

void wk_kv_send_finish(wk_kv_send_t *s, int32_t first_token)
{
    if (s->completed || s->finishing)
        return;
    s->finishing = 1;
    s->first_token = s->want_first ? first_token : -1;
    s->t_compute_end_ns = uv_hrtime();
    send_fill(s, 0, s->kv->cfg.shape.layers);
    send_pump(s);
}

void wk_kv_send_drop(wk_kv_send_t *s, const char *reason)
{
    wk_kv_t *kv = s->kv;
    if (!s->has_req)
        return;
    s->has_req = 0;
    list_remove(s); /* a pending matched callback */
    if (!s->counted) {
        s->counted = 1;
        count_fail(kv, reason);
    }
    if (wk_kvlease_live(&s->lease))
        lease_drop(kv, &s->lease, WK_KV_HOLD_USER);
    if (s->st == S_WAITING) {
        /* its offer has not come: remember the room so a late one is refused at once */
        tomb_push(kv, s, baton_now_ms());
        free(s->ids);
        s->ids = NULL;
        return;
    }
    if (s->xroom != NULL && !s->completed) {
        s->completed = 1;
        int rc = baton_xfer_room_abort(s->xroom, BATON_ECANCELED);
        if (rc != 0 && rc != BATON_ECANCELED)
            log_debug(COMP, "kv_abort_failed room=%" PRIu64 " err=%s", s->room_id,
                      baton_err_name(rc));
    }
    send_maybe_free(s);
}

void wk_kv_send_refuse(wk_kv_t *kv, uint64_t room)
{
    if (kv->closing)
        return;
    wk_kv_send_t *s = baton_u64map_get(&kv->rooms, room);
    if (s == NULL) {
        s = calloc(1, sizeof(*s));
        if (s == NULL || baton_u64map_put(&kv->rooms, room, s) != 0) {
            free(s);
            return; /* only the fast failure is lost: the decode still times out */
        }
        s->kv = kv;
        s->room_id = room;
        s->in_map = 1;
        s->counted = 1; /* no room was opened here: the decode side counts it */
    } else if (s->st == S_ORPHAN) {
        list_remove(s);
        if (s->xroom != NULL)
            baton_xfer_room_abort(s->xroom, BATON_ECANCELED);
        s->counted = 1;
        count_fail(kv, "canceled");
    } else {
        return;
    }
    tomb_push(kv, s, baton_now_ms());
}

static void tick_cb(uv_timer_t *t)
{
    wk_kv_t *kv = t->data;
    uint64_t now = baton_now_ms();
    wk_kv_send_t *s;
    while ((s = list_head(&kv->tombs)) != NULL && s->expires_ms <= now) {
        list_remove(s);
        map_remove(kv, s);
        send_maybe_free(s);
    }
    while ((s = list_head(&kv->orphans)) != NULL && s->expires_ms <= now) {
        list_remove(s);
        log_warn(COMP, "kv_offer_expired room=%" PRIu64 " waited_ms=%" PRIu64, s->room_id,
                 kv->cfg.timeout_ms + ORPHAN_GRACE_MS);
        s->counted = 1;
        count_fail(kv, "timeout");
        /* stays in the map until the room closes, so a late request is refused */
        s->st = S_TOMB;
        if (s->xroom != NULL)
            baton_xfer_room_abort(s->xroom, BATON_ETIMEOUT);
        tomb_push(kv, s, now);
    }
}

/* ---- decode ----------------------------------------------------------------------------- */

static ep_t *ep_get(wk_kv_t *kv, const char *name)
{
    for (ep_t *e = kv->eps; e; e = e->next)
        if (strcmp(e->name, name) == 0)
            return e;
    if (kv->n_eps >= 4096)
        return NULL; /* bogus bootstrap ports must not grow this forever; only precision is lost */
    ep_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return NULL;
    kv->n_eps++;
    snprintf(e->name, sizeof(e->name), "%s", name);
    e->next = kv->eps;
    kv->eps = e;
    return e;
}

static void on_peer(baton_xfer_engine_t *eng, const baton_xfer_peer_info_t *info, void *data)
{
    wk_kv_t *kv = data;
    static const char *names[] = {"?", "connecting", "up", "down", "gone"};
    log_debug(COMP, "kv_peer endpoint=%s id=%s state=%s transport=%s reason=%s", info->endpoint,
              info->engine_id[0] ? info->engine_id : "-", names[info->state <= 4 ? info->state : 0],
              baton_xfer_transport_name(info->transport),
              info->reason ? baton_err_name(info->reason) : "-");
    if (kv->cfg.prefill)
        return;
    ep_t *e = ep_get(kv, info->endpoint);
    if (e == NULL)
        return;
    e->state = info->state;
    if (info->state == BATON_XFER_PEER_UP)
        e->up_seq++;
}

static void recv_maybe_free(wk_kv_recv_t *r)
{
    if (r->has_req || r->offer_open || r->lease.work > 0)
        return;
    free(r->ids);
    free(r->layer_queued);
    free(r->lease.slots); /* NULL once returned to the pool */
    free(r);
}

/* Reports a failure to the request (the handle is gone afterwards). */
static void recv_fail(wk_kv_recv_t *r, int status, const char *detail)
{
    wk_kv_t *kv = r->kv;
    r->reported = 1;
    count_fail(kv, reason_of(status));
    if (r->has_req) {
        r->has_req = 0;
        lease_drop(kv, &r->lease, WK_KV_HOLD_USER);
        r->cb(r->data, status, NULL, detail);
    }
}

static void check_finish(wk_kv_recv_t *r);

static void check_done(uv_work_t *req, int status)
{
    work_t *w = req->data;
    wk_kv_t *kv = w->kv;
    wk_kv_recv_t *r = w->r;
    kv->work_inflight--;
    if (status != 0)
        r->check_failed = 1;
    /* the first bad byte of the lowest bad layer, whatever order the jobs end in */
    if (w->diff != 0 && (r->diff == 0 || w->bad_layer < r->bad_layer)) {
        r->bad_layer = w->bad_layer;
        r->bad_page = w->bad_page;
        r->bad_off = w->bad_off;
    }
    r->diff |= w->diff;
    free(w);
    lease_work_done(kv, &r->lease);
    if (--r->checks_pending > 0)
        return;
    if (r->done_ok) {
        check_finish(r);
        return;
    }
    /* A layer checked early, before DONE (or the room failed meanwhile: then this may be the
     * last thing that held r). */
    recv_maybe_free(r);
    maybe_destroy_engine(kv);
}

/* Every layer was checked: the verdict. */
static void check_finish(wk_kv_recv_t *r)
{
    wk_kv_t *kv = r->kv;
    if (r->has_req) {
        char detail[200];
        if (r->check_failed) {
            recv_fail(r, BATON_ENOMEM, "the check could not run");
        } else if (r->diff != 0) {
            baton_counter_add(kv->m_corrupt, 1);
            log_error(COMP,
                      "kv_corrupted room=%" PRIu64 " layer=%" PRIu32 " page=%" PRIu32
                      " offset=%" PRIu64,
                      r->room_id, r->bad_layer, r->bad_page, r->bad_off);
            snprintf(detail, sizeof(detail),
                     "received KV differs from the prefill's at layer %u, page %u, byte %" PRIu64,
                     r->bad_layer, r->bad_page, r->bad_off);
            recv_fail(r, BATON_EKVCORRUPT, detail);
        } else {
            /* The generator's seed comes out of the received bytes: any difference left in them
             * would change every token (the check above already refused it). */
            wk_kv_got_t got = {r->n_tokens, r->first_token, r->seed ^ r->diff};
            if (r->want_first && wk_sim_token(got.seed, 0) != r->first_token) {
                baton_counter_add(kv->m_corrupt, 1);
                snprintf(detail, sizeof(detail),
                         "first token %d does not follow from the received KV (expected %d)",
                         r->first_token, wk_sim_token(got.seed, 0));
                log_error(COMP, "kv_corrupted room=%" PRIu64 " reason=\"%s\"", r->room_id, detail);
                recv_fail(r, BATON_EKVCORRUPT, detail);
            } else {
                r->reported = 1;
                baton_counter_add(kv->m_ok, 1);
                /* the request may drop (and so free) r inside the callback: hands off after */
                r->cb(r->data, 0, &got, "");
                maybe_destroy_engine(kv);
                return;
            }
        }
    }
    recv_maybe_free(r);
    maybe_destroy_engine(kv);
}

/* DONE arrived: is it the room this request expects? 0, or a mismatch with its reason. */
static int payload_check(const wk_kv_t *kv, const wk_kv_recv_t *r, const baton_xfer_done_t *d,
                         char *why, size_t cap)
{
    uint32_t magic = 0, ver = 0, tokens = 0, layers = 0, ptok = 0;
    uint64_t tbytes = 0, seed = 0;
    if (d->payload_len >= DONE_LEN) {
        memcpy(&magic, d->payload, 4);
        memcpy(&ver, d->payload + 4, 4);
        memcpy(&tokens, d->payload + 8, 4);
        memcpy(&layers, d->payload + 12, 4);
        memcpy(&tbytes, d->payload + 16, 8);
        memcpy(&ptok, d->payload + 24, 4);
        memcpy(&seed, d->payload + 32, 8);
    }
    if (le32toh(magic) != DONE_MAGIC || le32toh(ver) != DONE_VERSION) {
        snprintf(why, cap, "the prefill's DONE is not a baton-worker KV hand-off");
        return -1;
    }
    tokens = le32toh(tokens);
    layers = le32toh(layers);
    tbytes = le64toh(tbytes);
    ptok = le32toh(ptok);
    seed = le64toh(seed);
    if (layers != kv->cfg.shape.layers || tbytes != kv->token_bytes ||
        ptok != kv->cfg.shape.page_tokens) {
        snprintf(
            why, cap,
            "model shape differs: prefill has %u layers, %" PRIu64 " bytes per token, %u-token "
            "pages; decode has %u, %" PRIu64 ", %u",
            layers, tbytes, ptok, kv->cfg.shape.layers, kv->token_bytes, kv->cfg.shape.page_tokens);
        return -1;
    }
    if (tokens != r->n_tokens || seed != r->seed) {
        snprintf(why, cap,
                 "prefill computed %u prompt tokens (seed %016" PRIx64 "), decode expected %u "
                 "(seed %016" PRIx64 ")",
                 tokens, seed, r->n_tokens, r->seed);
        return -1;
    }
    if (d->status == DONE_ST_MISMATCH) {
        snprintf(why, cap, "the prefill refused the offered pages for this prompt");
        return -1;
    }
    if (d->status != DONE_ST_OK) {
        snprintf(why, cap, "the prefill reported status %d", (int)d->status);
        return -1;
    }
    if ((d->first_token >= 0) != (r->want_first != 0) || d->first_token >= WK_SIM_VOCAB_SIZE) {
        snprintf(why, cap, "first token %" PRId64 " does not fit the request", d->first_token);
        return -1;
    }
    return 0;
}

static void on_offer_done(void *data, uint64_t room_id, int status, const baton_xfer_done_t *done)
{
    wk_kv_recv_t *r = data;
    wk_kv_t *kv = r->kv;
    r->offer_open = 0;
    /* the engine's last word on the room: nothing can land in its pages anymore */
    lease_drop(kv, &r->lease, WK_KV_HOLD_XFER);
    if (!r->has_req) {
        recv_maybe_free(r);
        maybe_destroy_engine(kv);
        return;
    }
    if (status != 0) {
        if (status == BATON_EPEERDOWN && r->ep != NULL && !r->was_up && r->ep->up_seq == r->up_seq)
            status = WK_EUNREACHABLE; /* it never answered since we asked */
        char detail[160];
        snprintf(detail, sizeof(detail), "%s",
                 baton_strerror(status == WK_EUNREACHABLE ? BATON_EPEERDOWN : status));
        recv_fail(r, status, detail);
        recv_maybe_free(r);
        return;
    }
    observe_since(kv->m_xfer, r->t_offer_ns);
    char why[256];
    if (payload_check(kv, r, done, why, sizeof(why)) != 0) {
        log_warn(COMP, "kv_room_mismatch room=%" PRIu64 " reason=\"%s\"", room_id, why);
        recv_fail(r, WK_EMISMATCH, why);
        recv_maybe_free(r);
        return;
    }
    r->first_token = (int32_t)done->first_token;
    r->done_ok = 1;
    /* Most layers were queued by on_layer as they landed; here only those libbaton did not
     * report (an older prefill engine, a failed queue). One job per layer: big rooms are
     * checked by every thread of the pool. */
    for (uint32_t l = 0; l < kv->cfg.shape.layers && !r->check_failed; l++) {
        if (r->layer_queued[l])
            continue;
        if (queue_work(kv, NULL, r, l, l + 1, check_done) != 0) {
            r->check_failed = 1;
            break;
        }
        r->layer_queued[l] = 1;
        r->checks_pending++;
    }
    if (r->checks_pending == 0)
        check_finish(r);
}

/* libbaton: every byte of `layer` is in place (before DONE). Checking it now overlaps the
 * check with the rest of the transfer, so at DONE little or nothing is left to verify. The
 * pages stay leased (HOLD_XFER until on_offer_done, and the job's own work count). */
static void on_layer(void *data, uint64_t room_id, uint32_t layer)
{
    wk_kv_recv_t *r = data;
    wk_kv_t *kv = r->kv;
    (void)room_id;
    if (!r->has_req || r->reported || r->check_failed || layer >= kv->cfg.shape.layers ||
        r->layer_queued[layer])
        return;
    if (queue_work(kv, NULL, r, layer, layer + 1, check_done) != 0)
        return; /* on_offer_done queues it again */
    r->layer_queued[layer] = 1;
    r->checks_pending++;
}

int wk_kv_recv_start(wk_kv_t *kv, const char *host, int port, uint64_t room,
                     const wk_kv_prompt_t *pr, const uint32_t *slots, wk_kv_recv_cb cb, void *data,
                     wk_kv_recv_t **r_p)
{
    if (kv->closing)
        return BATON_ESHUTDOWN;
    if (host == NULL || host[0] == '\0' || strlen(host) > 255 || port <= 0 || port > 65535 ||
        pr->n_tokens == 0)
        return BATON_EINVAL;
    uint32_t L = kv->cfg.shape.layers;
    uint32_t ppl = wk_kv_slots_for(kv, pr->n_tokens);
    wk_kv_recv_t *r = calloc(1, sizeof(*r));
    baton_xfer_iov_t *iov = malloc((size_t)L * ppl * sizeof(*iov));
    int64_t *ids = copy_ids(pr);
    uint8_t *lq = calloc(L, 1);
    if (r == NULL || iov == NULL || ids == NULL || lq == NULL ||
        wk_kvlease_init(&r->lease, slots, ppl, WK_KV_HOLD_USER | WK_KV_HOLD_XFER) != 0) {
        free(r);
        free(iov);
        free(ids);
        free(lq);
        return BATON_ENOMEM;
    }
    r->layer_queued = lq;
    room_iov(kv, slots, ppl, pr->n_tokens, 0, L, iov);
    char name[300];
    if (strchr(host, ':') != NULL)
        snprintf(name, sizeof(name), "[%s]:%d", host, port);
    else
        snprintf(name, sizeof(name), "%s:%d", host, port);
    r->kv = kv;
    r->room_id = room;
    r->ids = ids;
    r->n_tokens = pr->n_tokens;
    r->seed = pr->seed;
    r->want_first = pr->want_first;
    r->ppl = ppl;
    r->cb = cb;
    r->data = data;
    r->first_token = -1;
    r->ep = ep_get(kv, name);
    r->was_up = r->ep && r->ep->state == BATON_XFER_PEER_UP;
    r->up_seq = r->ep ? r->ep->up_seq : 0;
    r->t_offer_ns = uv_hrtime();
    baton_xfer_offer_t off = {room, L, ppl, iov, on_layer};
    int rc = baton_xfer_offer(kv->eng, host, port, &off, on_offer_done, r);
    free(iov);
    if (rc != 0) {
        free(r->lease.slots);
        free(ids);
        free(lq);
        free(r);
        return rc;
    }
    r->has_req = 1;
    r->offer_open = 1;
    *r_p = r;
    return 0;
}

void wk_kv_recv_drop(wk_kv_recv_t *r, const char *reason)
{
    wk_kv_t *kv = r->kv;
    if (!r->has_req)
        return;
    r->has_req = 0;
    if (!r->reported) {
        r->reported = 1;
        count_fail(kv, reason);
        if (r->offer_open) {
            int rc = baton_xfer_abort(kv->eng, r->room_id);
            if (rc != 0 && rc != BATON_ENOTFOUND)
                log_debug(COMP, "kv_abort_failed room=%" PRIu64 " err=%s", r->room_id,
                          baton_err_name(rc));
        }
    }
    lease_drop(kv, &r->lease, WK_KV_HOLD_USER);
    recv_maybe_free(r);
}

/* ---- create / metrics / close ------------------------------------------------------------ */

static void metrics_init(wk_kv_t *kv, baton_metrics_t *m)
{
    if (m == NULL)
        return;
    static const char *const res[] = {"result"}, *const reason[] = {"reason"},
                             *const dir[] = {"direction"}, *const state[] = {"state"};
    baton_metric_family_t *f;
    f = baton_metrics_counter(m, "baton_kv_rooms_total",
                              "KV hand-offs (rooms) finished, by result.", 1, res);
    if (f) {
        static const char *const ok[] = {"ok"}, *const failed[] = {"failed"};
        kv->m_ok = baton_metric_child(f, ok);
        kv->m_failed = baton_metric_child(f, failed);
    }
    kv->f_fail = baton_metrics_counter(m, "baton_kv_room_failures_total",
                                       "Failed KV hand-offs (rooms), by reason.", 1, reason);
    f = baton_metrics_counter(m, "baton_kv_bytes_total",
                              "KV bytes moved: sent (prefill, acknowledged in place) or received "
                              "(decode, rooms completed).",
                              1, dir);
    if (f) {
        const char *lv[1] = {kv->cfg.prefill ? "sent" : "received"};
        kv->m_bytes = baton_metric_child(f, lv);
    }
    f = baton_metrics_histogram(m, "baton_kv_transfer_seconds",
                                kv->cfg.prefill
                                    ? "Prefill: time from a room's first write to its DONE."
                                    : "Decode: time from the offer of a room to its DONE.",
                                0, NULL, baton_latency_buckets, baton_latency_buckets_n);
    kv->m_xfer = baton_metric_child(f, NULL);
    if (kv->cfg.prefill) {
        f = baton_metrics_histogram(m, "baton_kv_transfer_tail_seconds",
                                    "Prefill: time from the end of a room's compute to its DONE "
                                    "(the transfer not hidden behind compute).",
                                    0, NULL, baton_latency_buckets, baton_latency_buckets_n);
        kv->m_tail = baton_metric_child(f, NULL);
    }
    f = baton_metrics_gauge(m, "baton_kv_peers", "Transfer-engine peers by state.", 1, state);
    if (f) {
        static const char *const up[] = {"up"}, *const down[] = {"down"};
        kv->m_up = baton_metric_child(f, up);
        kv->m_down = baton_metric_child(f, down);
    }
    f = baton_metrics_counter(m, "baton_kv_reconnects_total",
                              "Successful re-handshakes with a peer after a failure.", 0, NULL);
    kv->m_reconn = baton_metric_child(f, NULL);
    f = baton_metrics_counter(m, "baton_kv_corrupted_total",
                              "Rooms whose received KV failed verification (kv_corrupted).", 0,
                              NULL);
    kv->m_corrupt = baton_metric_child(f, NULL);
    f = baton_metrics_counter(m, "baton_kv_frames_rejected_total",
                              "Control-channel frames refused (malformed, oversized, out of "
                              "order); each closed its connection.",
                              0, NULL);
    kv->m_frames_rej = baton_metric_child(f, NULL);
    f = baton_metrics_counter(m, "baton_kv_writes_rejected_total",
                              "Writes refused by the receiver's bounds / key checks.", 0, NULL);
    kv->m_writes_rej = baton_metric_child(f, NULL);
    f = baton_metrics_gauge(m, "baton_kv_pool_slots",
                            "KV page slots (one page in every layer), by state.", 1, state);
    if (f) {
        static const char *const fr[] = {"free"}, *const us[] = {"used"};
        kv->m_free = baton_metric_child(f, fr);
        kv->m_used = baton_metric_child(f, us);
    }
    f = baton_metrics_gauge(m, "baton_kv_pool_waiting", "Requests waiting for KV page slots.", 0,
                            NULL);
    kv->m_waiting = baton_metric_child(f, NULL);
}

static void add_delta(baton_metric_child_t *c, uint64_t now, uint64_t *seen)
{
    if (now > *seen) {
        baton_counter_add(c, (double)(now - *seen));
        *seen = now;
    }
}

void wk_kv_metrics_sync(wk_kv_t *kv)
{
    if (kv->eng == NULL)
        return;
    baton_xfer_stats_t st;
    baton_xfer_engine_stats(kv->eng, &st);
    add_delta(kv->m_bytes, kv->cfg.prefill ? st.bytes_written : st.bytes_received,
              kv->cfg.prefill ? &kv->seen.bytes_written : &kv->seen.bytes_received);
    add_delta(kv->m_reconn, st.reconnects, &kv->seen.reconnects);
    add_delta(kv->m_frames_rej, st.frames_rejected, &kv->seen.frames_rejected);
    add_delta(kv->m_writes_rej, st.writes_rejected, &kv->seen.writes_rejected);
    baton_gauge_set(kv->m_up, (double)st.peers_up);
    baton_gauge_set(kv->m_down, (double)st.peers_down);
    baton_gauge_set(kv->m_free, kv->pool.n_free);
    baton_gauge_set(kv->m_used, kv->pool.n_slots - kv->pool.n_free);
    baton_gauge_set(kv->m_waiting, kv->pool.n_waiting);
}

void wk_kv_transport_list(const baton_xfer_transport_t *t, int n, char *out, size_t cap)
{
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < n && len < cap; i++)
        len += (size_t)snprintf(out + len, cap - len, "%s%s", i ? "," : "",
                                baton_xfer_transport_name(t[i]));
}

int wk_kv_create(wk_kv_t **kv_p, uv_loop_t *loop, const wk_kv_cfg_t *cfg, baton_metrics_t *metrics)
{
    const char *why = NULL;
    if (wk_kvshape_check(&cfg->shape, &why) != 0) {
        log_error(COMP, "kv_start_failed reason=\"%s\"", why);
        return BATON_EINVAL;
    }
    wk_kv_t *kv = calloc(1, sizeof(*kv));
    if (kv == NULL)
        return BATON_ENOMEM;
    kv->loop = loop;
    baton_list_init(&kv->orphans);
    baton_list_init(&kv->tombs);
    baton_list_init(&kv->matched);
    kv->cfg = *cfg;
    kv->token_bytes = wk_kvshape_token_bytes(&cfg->shape);
    kv->page_bytes = wk_kvshape_page_bytes(&cfg->shape);
    uint64_t slots = cfg->pool_tokens / cfg->shape.page_tokens;
    uint64_t region = slots * cfg->shape.layers * kv->page_bytes;
    if (slots == 0 || slots > UINT32_MAX || region / cfg->shape.layers / kv->page_bytes != slots) {
        log_error(COMP, "kv_start_failed reason=\"pool of %" PRIu64 " tokens does not fit\"",
                  cfg->pool_tokens);
        free(kv);
        return BATON_EINVAL;
    }
    kv->n_slots = (uint32_t)slots;
    int rc = wk_kvpool_init(&kv->pool, kv->n_slots);
    if (rc != 0) {
        free(kv);
        return rc;
    }
    baton_xfer_config_t xc;
    baton_xfer_config_init(&xc);
    for (int i = 0; i < cfg->n_transports && i < BATON_XFER_MAX_TRANSPORTS; i++)
        xc.transports[i] = cfg->transports[i];
    xc.n_transports = cfg->n_transports;
    if (cfg->prefill) {
        xc.listen_host = cfg->listen_host;
        xc.listen_port = cfg->listen_port;
    }
    baton_xfer_callbacks_t cbs = {on_room, on_room_closed, on_peer, kv};
    rc = baton_xfer_engine_create(loop, &xc, &cbs, &kv->eng);
    if (rc != 0) {
        log_error(COMP, "kv_start_failed what=engine err=%s", baton_err_name(rc));
        wk_kvpool_free(&kv->pool);
        free(kv);
        return rc;
    }
    rc = baton_xfer_mem_alloc(kv->eng, region, &kv->mem);
    if (rc != 0) {
        log_error(COMP, "kv_start_failed what=page_region bytes=%" PRIu64 " err=%s", region,
                  baton_err_name(rc));
        /* the engine frees itself on its own loop; the caller exits */
        baton_xfer_engine_destroy(kv->eng, NULL, NULL);
        wk_kvpool_free(&kv->pool);
        free(kv);
        return rc;
    }
    kv->base = baton_xfer_mem_addr(kv->mem);
    if (!cfg->prefill)
        prefault_start(kv, kv->base, region);
    uv_idle_init(loop, &kv->defer);
    kv->defer.data = kv;
    uv_timer_init(loop, &kv->tick);
    kv->tick.data = kv;
    kv->handles_ok = 1;
    if (cfg->prefill) {
        uint64_t every = cfg->timeout_ms / 10;
        every = every < 10 ? 10 : every > 100 ? 100 : every;
        uv_timer_start(&kv->tick, tick_cb, every, every);
    }
    metrics_init(kv, metrics);
    char tps[64];
    baton_xfer_transport_t got[BATON_XFER_MAX_TRANSPORTS];
    int n = baton_xfer_engine_transports(kv->eng, got, BATON_XFER_MAX_TRANSPORTS);
    wk_kv_transport_list(got, n, tps, sizeof(tps));
    log_info(COMP,
             "kv_ready role=%s transports=%s layers=%u kv_heads=%u head_dim=%u dtype_bytes=%u "
             "page_tokens=%u token_bytes=%" PRIu64 " pool_tokens=%" PRIu64 " pool_bytes=%" PRIu64,
             cfg->prefill ? "prefill" : "decode", tps, cfg->shape.layers, cfg->shape.kv_heads,
             cfg->shape.head_dim, cfg->shape.dtype_bytes, cfg->shape.page_tokens, kv->token_bytes,
             slots * cfg->shape.page_tokens, region);
    *kv_p = kv;
    return 0;
}

int wk_kv_listen_port(const wk_kv_t *kv)
{
    return kv->eng ? baton_xfer_engine_listen_port(kv->eng) : 0;
}

static void handle_closed(uv_handle_t *h)
{
    wk_kv_t *kv = h->data;
    if (--kv->handles_open > 0)
        return;
    baton_u64map_free(&kv->rooms);
    wk_kvpool_free(&kv->pool);
    while (kv->eps) {
        ep_t *e = kv->eps;
        kv->eps = e->next;
        free(e);
    }
    void (*cb)(void *) = kv->close_cb;
    void *arg = kv->close_arg;
    free(kv);
    if (cb)
        cb(arg);
}

static void on_engine_closed(baton_xfer_engine_t *eng, void *data)
{
    wk_kv_t *kv = data;
    kv->eng = NULL;
    /* every room callback has run: whatever is left is a tombstone or an orphan */
    baton_list_t *left[] = {&kv->tombs, &kv->orphans};
    for (int i = 0; i < 2; i++) {
        wk_kv_send_t *s;
        while ((s = list_head(left[i])) != NULL) {
            list_remove(s);
            map_remove(kv, s);
            s->xroom = NULL;
            send_maybe_free(s);
        }
    }
    kv->handles_ok = 0;
    kv->handles_open = 2;
    uv_close((uv_handle_t *)&kv->defer, handle_closed);
    uv_close((uv_handle_t *)&kv->tick, handle_closed);
}

static void maybe_destroy_engine(wk_kv_t *kv)
{
    if (!kv->closing || kv->destroying || kv->work_inflight > 0)
        return;
    kv->destroying = 1;
    /* pages are unmapped with the engine: no thread-pool job may touch them past this point */
    baton_xfer_engine_destroy(kv->eng, on_engine_closed, kv);
}

void wk_kv_close(wk_kv_t *kv, void (*cb)(void *arg), void *arg)
{
    if (kv->closing)
        return;
    kv->closing = 1;
    kv->close_cb = cb;
    kv->close_arg = arg;
    uv_idle_stop(&kv->defer);
    uv_timer_stop(&kv->tick);
    for (baton_list_t *it = kv->orphans.next; it != &kv->orphans; it = it->next) {
        wk_kv_send_t *s = container_of(it, wk_kv_send_t, link);
        if (s->xroom != NULL)
            baton_xfer_room_abort(s->xroom, BATON_ESHUTDOWN);
    }
    maybe_destroy_engine(kv);
}
