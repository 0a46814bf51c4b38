/* kv_route.c — the router's KV-event subscription thread: subscriptions per worker and DP rank
 * following the registry, history replayed before a worker's cache counts, the shared index
 * fed, hostile streams dropped and retried with back-off, and the figures /workers and /metrics
 * show. */
#include "router/control/kv_route.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "baton/error.h"
#include "common/clock.h"
#include "common/log.h"
#include "health/backoff.h"
#include "kvevents/index.h"
#include "kvevents/zsock.h"

#define COMP          "kv_route"
#define TICK_MS       50
#define RECONCILE_MS  200
#define MAX_POLL_SUBS 256

enum sub_state { ST_CONNECTING, ST_SYNCED, ST_PARTIAL, ST_BACKOFF, ST_NO_SOURCE };
static const char *const state_names[] = {"connecting", "synced", "partial", "backoff",
                                          "no_source"};

typedef struct sub_s {
    baton_kvroute_t *kr;
    baton_worker_t *w; /* a reference; NULL for a store master's subscription (L3) */
    unsigned incarnation;
    int rank, src; /* src -1: none */
    char ep[256], rep[256];
    baton_kvev_sub_t *s;
    atomic_int state;
    uint64_t retry_at_ms;
    baton_backoff_t bo;
    int bad;              /* the stream must be dropped (set in the callback) */
    int syncing;          /* its history is being replayed (the thread's own) */
    char why[160];        /* the thread's own: why it is bad */
    char last_error[160]; /* what /workers shows: written under the route's mutex */
    int seen;
    /* unmatched check: the source's match count and hit count when it first held blocks */
    int have_base, warned, ever_hit;
    uint64_t gaps_open, replays_open; /* the open subscriber's own counts, already added */
    uint64_t seen_base, hit_base;
    /* figures (atomics: read by /workers) */
    _Atomic uint64_t batches, events, stored, removed, gaps, replays, resets, errors, clears;
    _Atomic int64_t last_seq;
    _Atomic uint64_t l1, l2;
    baton_metric_child_t *m_events, *m_stored, *m_removed, *m_gaps, *m_replays, *m_resets,
        *m_errors, *m_l1, *m_l2, *m_unmatched;
    struct sub_s *next;
} sub_t;

struct baton_kvroute_s {
    baton_registry_t *reg;
    baton_kvroute_opts_t o;
    baton_kvidx_t *_Atomic idx;
    uv_thread_t tid;
    int started;
    atomic_int stop;
    uv_mutex_t mu; /* the list's shape (subs added, freed) for the readers */
    sub_t *subs;
    uint64_t gen_seen, reconcile_at;
    uint64_t src_used; /* index sources in use (bits) */
    /* the store's L3 source: shared by its masters' subscriptions; known (1) once one of them
     * has its history; the subscription that last applied a batch (the leader's) */
    int l3_src;
    atomic_int l3_known;
    sub_t *_Atomic l3_last;
    _Atomic uint64_t seen[BATON_KVIDX_MAX_SOURCES]; /* matches a source took part in */
    /* metric families */
    baton_metric_family_t *f_events, *f_blocks, *f_gaps, *f_replays, *f_resets, *f_errors, *f_index,
        *f_unmatched, *f_bytes;
    baton_metric_child_t *m_bytes;
};

/* ---- the request path ---- */

uint32_t baton_kvroute_block_size(const baton_kvroute_t *kr)
{
    baton_kvidx_t *x = kr ? atomic_load_explicit(&kr->idx, memory_order_acquire) : NULL;
    return x ? baton_kvidx_block_size(x) : 0;
}

void baton_kvroute_match(baton_kvroute_t *kr, const uint64_t *keys, uint32_t nb,
                         baton_worker_t *const *w, size_t n, uint32_t *l1, uint32_t *l2)
{
    memset(l1, 0, n * sizeof(*l1));
    memset(l2, 0, n * sizeof(*l2));
    baton_kvidx_t *x = atomic_load_explicit(&kr->idx, memory_order_acquire);
    if (!x || nb == 0)
        return;
    uint64_t stack[64], mask = 0, *srcs = n <= 64 ? stack : malloc(n * sizeof(*srcs));
    if (!srcs)
        return;
    for (size_t i = 0; i < n; i++)
        mask |= srcs[i] = atomic_load_explicit(&w[i]->kv_sources, memory_order_acquire);
    if (mask) {
        uint32_t a1[BATON_KVIDX_MAX_SOURCES], a2[BATON_KVIDX_MAX_SOURCES];
        baton_kvidx_match_keys(x, keys, nb, mask, a1, a2);
        for (uint64_t m = mask; m; m &= m - 1)
            atomic_fetch_add_explicit(&kr->seen[__builtin_ctzll(m)], 1, memory_order_relaxed);
        for (size_t i = 0; i < n; i++)
            for (uint64_t m = srcs[i]; m; m &= m - 1) {
                int s = __builtin_ctzll(m);
                /* the best rank: the most cached, L1 first */
                if (a1[s] + a2[s] > l1[i] + l2[i] ||
                    (a1[s] + a2[s] == l1[i] + l2[i] && a1[s] > l1[i])) {
                    l1[i] = a1[s];
                    l2[i] = a2[s];
                }
            }
    }
    if (srcs != stack)
        free(srcs);
}

uint32_t baton_kvroute_match_l3(baton_kvroute_t *kr, const uint64_t *keys, uint32_t nb)
{
    baton_kvidx_t *x = kr ? atomic_load_explicit(&kr->idx, memory_order_acquire) : NULL;
    if (!x || nb == 0 || kr->l3_src < 0 ||
        !atomic_load_explicit(&kr->l3_known, memory_order_acquire))
        return 0;
    uint32_t a1[BATON_KVIDX_MAX_SOURCES], a2[BATON_KVIDX_MAX_SOURCES];
    baton_kvidx_match_keys(x, keys, nb, 1ull << kr->l3_src, a1, a2);
    return a1[kr->l3_src] + a2[kr->l3_src];
}

/* ---- the subscription thread ---- */

static const char *sid(const sub_t *s)
{
    return s->w ? s->w->id : "@store";
}

/* The store's masters share one source: only the one that last fed it may empty it (a dead or
 * demoted master's subscription must not clear what the new leader republished). */
static int may_clear(sub_t *s)
{
    return s->w || !s->kr->l3_last || s->kr->l3_last == s;
}

static void sub_cb(void *ud, baton_kvev_sub_event_t ev, int64_t seq, const baton_kvev_batch_t *b,
                   const char *why)
{
    sub_t *s = ud;
    baton_kvroute_t *kr = s->kr;
    if (ev == BATON_KVEV_SUB_ERROR) {
        s->bad = 1;
        snprintf(s->why, sizeof(s->why), "%s", why ? why : "malformed stream");
        return;
    }
    baton_kvidx_t *x = atomic_load_explicit(&kr->idx, memory_order_acquire);
    if (ev == BATON_KVEV_SUB_RESET) {
        atomic_fetch_add(&s->resets, 1);
        baton_counter_add(s->m_resets, 1);
        if (x && may_clear(s))
            baton_kvidx_clear(x, s->src);
        s->have_base = s->ever_hit = 0;
        log_info(COMP, "kv_events_reset id=%s rank=%d reason=\"%s\"", sid(s), s->rank,
                 why ? why : "");
        return;
    }
    if (s->bad)
        return;
    uint64_t stored = 0, removed = 0;
    for (uint32_t k = 0; k < b->n_events; k++) {
        const baton_kvev_event_t *e = &b->events[k];
        if (e->type == BATON_KVEV_STORED) {
            stored += e->n_hashes;
            if (!x) {
                baton_kvidx_t *nx = baton_kvidx_create(e->block_size);
                if (!nx) {
                    s->bad = 1;
                    snprintf(s->why, sizeof(s->why), "cannot index block_size %u", e->block_size);
                    return;
                }
                atomic_store_explicit(&kr->idx, nx, memory_order_release);
                x = nx;
                log_info(COMP, "kv_index_created block_size=%u from=%s", e->block_size, sid(s));
            }
        } else if (e->type == BATON_KVEV_REMOVED) {
            removed += e->n_hashes;
        } else if (e->type == BATON_KVEV_CLEARED) {
            atomic_fetch_add(&s->clears, 1);
        }
    }
    if (!s->w)
        kr->l3_last = s;
    if (x && baton_kvidx_apply(x, s->src, b) != 0) {
        s->bad = 1;
        snprintf(s->why, sizeof(s->why), "block_size differs from the index's %u",
                 baton_kvidx_block_size(x));
    }
    atomic_store(&s->last_seq, seq);
    atomic_fetch_add(&s->batches, 1);
    atomic_fetch_add(&s->events, b->n_events);
    atomic_fetch_add(&s->stored, stored);
    atomic_fetch_add(&s->removed, removed);
    baton_counter_add(s->m_events, b->n_events);
    baton_counter_add(s->m_stored, (double)stored);
    baton_counter_add(s->m_removed, (double)removed);
    if (x && s->src >= 0) {
        baton_kvidx_source_stats_t st;
        baton_kvidx_source_stats(x, s->src, &st);
        if (st.blocks > kr->o.max_blocks_per_source) {
            s->bad = 1;
            snprintf(s->why, sizeof(s->why), "more than %llu blocks",
                     (unsigned long long)kr->o.max_blocks_per_source);
        }
    }
}

static void set_known(sub_t *s, int known)
{
    if (s->src < 0)
        return;
    if (!s->w) {
        if (known)
            atomic_store_explicit(&s->kr->l3_known, 1, memory_order_release);
        return; /* stays known while another master's history counts */
    }
    uint64_t bit = 1ull << s->src;
    if (known)
        atomic_fetch_or_explicit(&s->w->kv_sources, bit, memory_order_release);
    else
        atomic_fetch_and_explicit(&s->w->kv_sources, ~bit, memory_order_release);
}

/* Forgets what the subscription taught: the worker stops reading the source, then it empties. */
static void sub_forget(sub_t *s)
{
    set_known(s, 0);
    baton_kvidx_t *x = atomic_load_explicit(&s->kr->idx, memory_order_acquire);
    if (x && s->src >= 0 && may_clear(s))
        baton_kvidx_clear(x, s->src);
    if (!s->w && s->kr->l3_last == s)
        s->kr->l3_last = NULL;
    atomic_store(&s->l1, 0);
    atomic_store(&s->l2, 0);
    baton_gauge_set(s->m_l1, 0);
    baton_gauge_set(s->m_l2, 0);
    s->have_base = s->ever_hit = 0;
}

/* Adds what the open subscriber counted since the last look. */
static void take_stats(sub_t *s)
{
    if (!s->s)
        return;
    baton_kvev_sub_stats_t ss;
    baton_kvev_sub_stats(s->s, &ss);
    if (ss.gaps > s->gaps_open) {
        atomic_fetch_add(&s->gaps, ss.gaps - s->gaps_open);
        baton_counter_add(s->m_gaps, (double)(ss.gaps - s->gaps_open));
        s->gaps_open = ss.gaps;
    }
    if (ss.replays > s->replays_open) {
        atomic_fetch_add(&s->replays, ss.replays - s->replays_open);
        baton_counter_add(s->m_replays, (double)(ss.replays - s->replays_open));
        s->replays_open = ss.replays;
    }
}

static void sub_close(sub_t *s)
{
    s->syncing = 0;
    take_stats(s);
    sub_forget(s);
    baton_kvev_sub_close(s->s);
    s->s = NULL;
}

/* Opens the subscription and replays the publisher's history; the source counts from then. */
static void sub_open(sub_t *s)
{
    char err[256] = "";
    baton_kvev_sub_opts_t o = {.endpoint = s->ep,
                               .replay_endpoint = s->rep[0] ? s->rep : NULL,
                               .replay_timeout_ms = s->kr->o.replay_timeout_ms};
    s->bad = 0;
    s->why[0] = '\0';
    s->gaps_open = s->replays_open = 0;
    atomic_store(&s->state, ST_CONNECTING);
    s->s = baton_kvev_sub_open(&o, sub_cb, s, err, sizeof(err));
    if (!s->s) {
        s->bad = 1;
        snprintf(s->why, sizeof(s->why), "%s", err);
        return;
    }
    s->syncing = 1;
    if (s->rep[0])
        baton_kvev_sub_sync_start(s->s); /* goes on in the poll loop: see sync_done */
}

/* The history's replay ended (whole 1: from 0, 0: later, -1: none): the source counts. */
static void sync_done(sub_t *s, int whole)
{
    s->syncing = 0;
    take_stats(s);
    if (s->bad)
        return;
    atomic_store(&s->state, whole == 1 ? ST_SYNCED : ST_PARTIAL);
    set_known(s, 1);
    log_info(COMP, "kv_events_subscribed id=%s rank=%d endpoint=%s history=%s", sid(s), s->rank,
             s->ep,
             whole == 1   ? "whole"
             : whole == 0 ? "partial"
                          : "none");
}

static void sub_drop(sub_t *s, uint64_t now)
{
    atomic_fetch_add(&s->errors, 1);
    baton_counter_add(s->m_errors, 1);
    sub_close(s);
    uint32_t d = baton_backoff_next(&s->bo);
    s->retry_at_ms = now + d;
    uv_mutex_lock(&s->kr->mu);
    memcpy(s->last_error, s->why, sizeof(s->last_error));
    uv_mutex_unlock(&s->kr->mu);
    atomic_store(&s->state, ST_BACKOFF);
    log_warn_limited(COMP, "kv_events_dropped",
                     "kv_events_dropped id=%s rank=%d reason=\"%s\" retry_ms=%u", sid(s), s->rank,
                     s->why, d);
}

/* vLLM's DP rule: rank r on the TCP port + r; other endpoints: rank 0 only. */
static int rank_endpoint(const char *ep, int rank, char *out, size_t len)
{
    if (!ep || !ep[0]) {
        out[0] = '\0';
        return 0;
    }
    if (rank == 0) {
        snprintf(out, len, "%s", ep);
        return 0;
    }
    const char *colon = strrchr(ep, ':');
    if (strncmp(ep, "tcp://", 6) != 0 || !colon)
        return -1;
    long port = strtol(colon + 1, NULL, 10);
    if (port <= 0 || port + rank > 65535)
        return -1;
    snprintf(out, len, "%.*s:%ld", (int)(colon - ep), ep, port + rank);
    return 0;
}

static baton_metric_child_t *child(baton_metric_family_t *f, const char *id, const char *second)
{
    const char *labels[2] = {id, second};
    return baton_metric_child(f, labels);
}

static void sub_new(baton_kvroute_t *kr, baton_worker_t *w, int rank)
{
    sub_t *s = calloc(1, sizeof(*s));
    if (!s)
        return; /* out of memory: the worker is indexed without this rank */
    s->seen = 1;
    s->kr = kr;
    baton_worker_ref(w);
    s->w = w;
    s->incarnation = atomic_load(&w->incarnation);
    s->rank = rank;
    s->src = -1;
    atomic_store(&s->last_seq, -1);
    baton_backoff_init(&s->bo, 200, 30000, (uint64_t)(uintptr_t)s ^ baton_now_ms());
    s->m_events = child(kr->f_events, w->id, NULL);
    s->m_stored = child(kr->f_blocks, w->id, "stored");
    s->m_removed = child(kr->f_blocks, w->id, "removed");
    s->m_gaps = child(kr->f_gaps, w->id, NULL);
    s->m_replays = child(kr->f_replays, w->id, NULL);
    s->m_resets = child(kr->f_resets, w->id, NULL);
    s->m_errors = child(kr->f_errors, w->id, NULL);
    s->m_l1 = child(kr->f_index, w->id, "L1");
    s->m_l2 = child(kr->f_index, w->id, "L2");
    s->m_unmatched = child(kr->f_unmatched, w->id, NULL);
    baton_gauge_set(s->m_unmatched, 0);
    if (rank_endpoint(w->kv_events_endpoint, rank, s->ep, sizeof(s->ep)) != 0 ||
        rank_endpoint(w->kv_events_replay_endpoint, rank, s->rep, sizeof(s->rep)) != 0) {
        snprintf(s->why, sizeof(s->why), "rank %d: no endpoint (not a tcp:// port)", rank);
        atomic_store(&s->state, ST_NO_SOURCE);
    } else if (kr->src_used == ~0ull) {
        snprintf(s->why, sizeof(s->why), "every index source is in use");
        atomic_store(&s->state, ST_NO_SOURCE);
        log_warn(COMP, "kv_events_not_indexed id=%s rank=%d reason=\"%d sources in use\"", w->id,
                 rank, BATON_KVIDX_MAX_SOURCES);
    } else {
        s->src = __builtin_ctzll(~kr->src_used);
        kr->src_used |= 1ull << s->src;
        atomic_store(&kr->seen[s->src], 0);
        sub_open(s);
    }
    uv_mutex_lock(&kr->mu);
    memcpy(s->last_error, s->why, sizeof(s->last_error));
    s->next = kr->subs;
    kr->subs = s;
    uv_mutex_unlock(&kr->mu);
}

/* A removed worker's series go (its ranks share them: removed with rank 0's subscription). */
static void forget_series(baton_kvroute_t *kr, const char *id)
{
    const char *one[] = {id}, *stored[] = {id, "stored"}, *removed[] = {id, "removed"},
               *l1[] = {id, "L1"}, *l2[] = {id, "L2"};
    baton_metric_family_t *by_worker[] = {kr->f_events, kr->f_gaps,   kr->f_replays,
                                          kr->f_resets, kr->f_errors, kr->f_unmatched};
    for (size_t i = 0; i < sizeof(by_worker) / sizeof(by_worker[0]); i++)
        if (by_worker[i])
            baton_metric_child_remove(by_worker[i], one);
    if (kr->f_blocks) {
        baton_metric_child_remove(kr->f_blocks, stored);
        baton_metric_child_remove(kr->f_blocks, removed);
    }
    if (kr->f_index) {
        baton_metric_child_remove(kr->f_index, l1);
        baton_metric_child_remove(kr->f_index, l2);
    }
}

static void sub_free(baton_kvroute_t *kr, sub_t *s, int forget)
{
    sub_close(s);
    if (!s->w) { /* a store master's: its source is the route's */
        free(s);
        return;
    }
    if (forget && s->rank == 0)
        forget_series(kr, s->w->id);
    if (s->src >= 0)
        kr->src_used &= ~(1ull << s->src);
    baton_worker_unref(s->w);
    free(s);
}

/* Follows the registry: new workers, removed ones, new incarnations. */
static void reconcile(baton_kvroute_t *kr)
{
    baton_worker_t *stack[64], **ws;
    size_t n = baton_registry_snapshot_all(kr->reg, BATON_ROLE_ANY, BATON_SNAP_ALL, stack, 64, &ws);
    for (sub_t *s = kr->subs; s; s = s->next)
        s->seen = s->w == NULL; /* the store's stay */
    for (size_t i = 0; i < n; i++) {
        baton_worker_t *w = ws[i];
        if (!w->kv_events_endpoint || !w->kv_events_endpoint[0])
            continue;
        int ranks = w->dp_size > 1 ? w->dp_size : 1, found = 0;
        unsigned inc = atomic_load(&w->incarnation);
        for (sub_t *s = kr->subs; s; s = s->next) {
            if (s->w != w)
                continue;
            s->seen = found = 1;
            if (s->incarnation != inc && s->src >= 0) {
                /* back up after a failure or a restart: what it held is not trusted; its
                 * publisher's history (if it kept running) is replayed again */
                s->incarnation = inc;
                log_info(COMP, "kv_events_incarnation id=%s rank=%d", w->id, s->rank);
                sub_close(s);
                baton_backoff_reset(&s->bo);
                sub_open(s);
            }
        }
        for (int r = 0; !found && r < ranks; r++)
            sub_new(kr, w, r);
    }
    baton_workers_release(ws, n, stack);
    uv_mutex_lock(&kr->mu);
    sub_t **pp = &kr->subs, *gone = NULL;
    while (*pp) {
        sub_t *s = *pp;
        if (!s->seen) {
            *pp = s->next;
            s->next = gone;
            gone = s;
        } else {
            pp = &s->next;
        }
    }
    uv_mutex_unlock(&kr->mu);
    while (gone) {
        sub_t *s = gone;
        gone = s->next;
        log_info(COMP, "kv_events_unsubscribed id=%s rank=%d", sid(s), s->rank);
        sub_free(kr, s, 1);
    }
}

/* The index's figures per subscription, and the silent-zero-hits check. */
static void refresh(baton_kvroute_t *kr)
{
    baton_kvidx_t *x = atomic_load_explicit(&kr->idx, memory_order_acquire);
    if (!x)
        return;
    for (sub_t *s = kr->subs; s; s = s->next) {
        if (s->src < 0)
            continue;
        baton_kvidx_source_stats_t st;
        baton_kvidx_source_stats(x, s->src, &st);
        atomic_store(&s->l1, st.blocks_l1);
        atomic_store(&s->l2, st.blocks_l2);
        baton_gauge_set(s->m_l1, (double)st.blocks_l1);
        baton_gauge_set(s->m_l2, (double)st.blocks_l2);
        take_stats(s);
        uint64_t seen = atomic_load(&kr->seen[s->src]);
        if (st.blocks == 0) {
            s->have_base = s->ever_hit = 0;
            continue;
        }
        if (!s->have_base) {
            s->have_base = 1;
            s->seen_base = seen;
            s->hit_base = st.requests_hit;
            continue;
        }
        if (st.requests_hit != s->hit_base) {
            /* one match is enough: the keys agree (a workload without reuse stays quiet) */
            s->ever_hit = 1;
            baton_gauge_set(s->m_unmatched, 0);
        } else if (!s->ever_hit && seen - s->seen_base >= kr->o.unmatched_after) {
            baton_gauge_set(s->m_unmatched, 1);
            if (!s->warned) {
                s->warned = 1;
                log_warn(COMP,
                         "kv_events_unmatched id=%s rank=%d requests=%llu blocks=%llu "
                         "reason=\"its blocks matched none of the requests routed: do its "
                         "events carry the token ids and block size the router keys requests "
                         "with?\"",
                         sid(s), s->rank, (unsigned long long)(seen - s->seen_base),
                         (unsigned long long)st.blocks);
            }
        }
    }
    size_t bytes;
    uint64_t blocks;
    baton_kvidx_size(x, &blocks, &bytes);
    baton_gauge_set(kr->m_bytes, (double)bytes);
}

static void thread_main(void *arg)
{
    baton_kvroute_t *kr = arg;
    struct pollfd pf[2 * MAX_POLL_SUBS];
    sub_t *ps[MAX_POLL_SUBS];
    while (!atomic_load(&kr->stop)) {
        uint64_t now = baton_now_ms();
        uint64_t gen = baton_registry_generation(kr->reg);
        if (gen != kr->gen_seen || now >= kr->reconcile_at) {
            kr->gen_seen = gen;
            kr->reconcile_at = now + RECONCILE_MS;
            reconcile(kr);
            refresh(kr);
        }
        int n = 0, nf = 0;
        for (sub_t *s = kr->subs; s; s = s->next) {
            if (!s->s && atomic_load(&s->state) == ST_BACKOFF && now >= s->retry_at_ms)
                sub_open(s);
            int st = atomic_load(&s->state);
            if (s->bad && st != ST_BACKOFF && st != ST_NO_SOURCE)
                sub_drop(s, now);
            if (s->s && n < MAX_POLL_SUBS) {
                int fd = baton_kvev_sub_fd(s->s), rfd = baton_kvev_sub_replay_fd(s->s);
                if (fd >= 0)
                    pf[nf++] = (struct pollfd){.fd = fd, .events = POLLIN};
                if (rfd >= 0) /* a replay in progress: its replies wake the loop too */
                    pf[nf++] = (struct pollfd){.fd = rfd, .events = POLLIN};
                ps[n++] = s;
            }
        }
        /* ZMQ's descriptors are edge-triggered: every socket is drained after any wake-up, and
         * the timeout bounds what a missed edge could delay (and how late a replay's deadline
         * is noticed). A replay never blocks the loop: a publisher whose replay socket does not
         * answer delays no other subscription. */
        poll(pf, (nfds_t)nf, TICK_MS);
        for (int i = 0; i < n; i++) {
            sub_t *s = ps[i];
            if (baton_kvev_sub_poll(s->s) < 0 || s->bad) {
                sub_drop(s, baton_now_ms());
                continue;
            }
            if (s->syncing) {
                int whole = s->rep[0] ? baton_kvev_sub_synced(s->s) : -1;
                if (whole != -2)
                    sync_done(s, whole);
            }
        }
    }
    uv_mutex_lock(&kr->mu);
    sub_t *s = kr->subs;
    kr->subs = NULL;
    uv_mutex_unlock(&kr->mu);
    while (s) {
        sub_t *next = s->next;
        sub_free(kr, s, 0);
        s = next;
    }
}

/* The n-th item of a comma-separated list into out ("" past its end). */
static void list_item(const char *list, int n, char *out, size_t len)
{
    out[0] = '\0';
    for (const char *p = list; p && *p; n--) {
        const char *e = strchr(p, ',');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (n == 0) {
            snprintf(out, len, "%.*s", (int)l, p);
            return;
        }
        p = e ? e + 1 : NULL;
    }
}

/* One subscription per store master, sharing the L3 source; opened by the thread. */
static int store_subs_new(baton_kvroute_t *kr)
{
    kr->l3_src = -1;
    if (!kr->o.store_endpoint || !kr->o.store_endpoint[0])
        return 0;
    kr->l3_src = 0;
    kr->src_used |= 1ull;
    baton_metric_child_t *m_l3 = child(kr->f_index, "@store", "L3");
    for (int i = 0;; i++) {
        char ep[256];
        list_item(kr->o.store_endpoint, i, ep, sizeof(ep));
        if (!ep[0])
            break;
        sub_t *s = calloc(1, sizeof(*s));
        if (!s)
            return BATON_ENOMEM;
        s->kr = kr;
        s->seen = 1;
        s->src = kr->l3_src;
        snprintf(s->ep, sizeof(s->ep), "%s", ep);
        list_item(kr->o.store_replay_endpoint, i, s->rep, sizeof(s->rep));
        atomic_store(&s->last_seq, -1);
        atomic_store(&s->state, ST_BACKOFF); /* retry_at 0: opened at the thread's first turn */
        baton_backoff_init(&s->bo, 200, 30000, (uint64_t)(uintptr_t)s ^ baton_now_ms());
        s->m_events = child(kr->f_events, "@store", NULL);
        s->m_stored = child(kr->f_blocks, "@store", "stored");
        s->m_removed = child(kr->f_blocks, "@store", "removed");
        s->m_gaps = child(kr->f_gaps, "@store", NULL);
        s->m_replays = child(kr->f_replays, "@store", NULL);
        s->m_resets = child(kr->f_resets, "@store", NULL);
        s->m_errors = child(kr->f_errors, "@store", NULL);
        s->m_l2 = m_l3;
        s->next = kr->subs;
        kr->subs = s;
    }
    return 0;
}

int baton_kvroute_create(baton_kvroute_t **out, baton_registry_t *reg, baton_metrics_t *metrics,
                         const baton_kvroute_opts_t *opts)
{
    if (!reg)
        return BATON_EINVAL;
    baton_kvroute_t *kr = calloc(1, sizeof(*kr));
    if (!kr)
        return BATON_ENOMEM;
    kr->reg = reg;
    if (opts)
        kr->o = *opts;
    if (!kr->o.max_blocks_per_source)
        kr->o.max_blocks_per_source = 4u << 20;
    if (!kr->o.unmatched_after)
        kr->o.unmatched_after = 100;
    if (uv_mutex_init(&kr->mu) != 0) {
        free(kr);
        return BATON_ENOMEM;
    }
    if (metrics) {
        const char *w[] = {"worker"}, *wo[] = {"worker", "op"}, *wt[] = {"worker", "tier"};
        kr->f_events = baton_metrics_counter(metrics, "baton_kv_events_total",
                                             "KV events applied to the router's index", 1, w);
        kr->f_blocks = baton_metrics_counter(metrics, "baton_kv_event_blocks_total",
                                             "blocks stored / removed by KV events", 2, wo);
        kr->f_gaps = baton_metrics_counter(metrics, "baton_kv_event_gaps_total",
                                           "sequence gaps seen in KV event streams", 1, w);
        kr->f_replays = baton_metrics_counter(metrics, "baton_kv_event_replays_total",
                                              "replays asked of a worker's replay socket", 1, w);
        kr->f_resets = baton_metrics_counter(
            metrics, "baton_kv_event_resets_total",
            "histories lost (publisher restarted, gap past its buffer): the worker cleared", 1, w);
        kr->f_errors = baton_metrics_counter(
            metrics, "baton_kv_event_errors_total",
            "KV event subscriptions dropped (malformed or hostile stream) and retried", 1, w);
        kr->f_index =
            baton_metrics_gauge(metrics, "baton_kv_index_blocks",
                                "blocks the router's index holds per worker and tier", 2, wt);
        kr->f_unmatched = baton_metrics_gauge(
            metrics, "baton_kv_events_unmatched",
            "1 while a worker's indexed blocks have matched none of the requests routed since it "
            "subscribed",
            1, w);
        kr->f_bytes = baton_metrics_gauge(metrics, "baton_kv_index_bytes",
                                          "memory of the router's KV block index", 0, NULL);
        kr->m_bytes = baton_metric_child(kr->f_bytes, NULL);
    }
    if (store_subs_new(kr) != 0) {
        baton_kvroute_destroy(kr);
        return BATON_ENOMEM;
    }
    *out = kr;
    return 0;
}

int baton_kvroute_start(baton_kvroute_t *kr)
{
    int rc = uv_thread_create(&kr->tid, thread_main, kr);
    if (rc == 0)
        kr->started = 1;
    return rc;
}

void baton_kvroute_destroy(baton_kvroute_t *kr)
{
    if (!kr)
        return;
    if (kr->started) {
        atomic_store(&kr->stop, 1);
        uv_thread_join(&kr->tid);
    }
    while (kr->subs) { /* never started: the store's subscriptions, not opened */
        sub_t *s = kr->subs;
        kr->subs = s->next;
        sub_free(kr, s, 0);
    }
    baton_kvidx_destroy(atomic_load(&kr->idx));
    uv_mutex_destroy(&kr->mu);
    free(kr);
}

/* Applies a decoded batch to the index as source `src`, creating the index at the first
 * stored block (its block size is the index's). */
static int inject(baton_kvroute_t *kr, int src, const baton_kvev_batch_t *b)
{
    baton_kvidx_t *x = atomic_load(&kr->idx);
    for (uint32_t k = 0; !x && k < b->n_events; k++)
        if (b->events[k].type == BATON_KVEV_STORED) {
            x = baton_kvidx_create(b->events[k].block_size);
            atomic_store(&kr->idx, x);
        }
    return x && baton_kvidx_apply(x, src, b) == 0 ? 0 : -1;
}

int baton__kvroute_inject(baton_kvroute_t *kr, baton_worker_t *w, int src, const void *batch)
{
    if (inject(kr, src, batch) != 0)
        return -1;
    atomic_fetch_or(&w->kv_sources, 1ull << src);
    return 0;
}

int baton__kvroute_inject_l3(baton_kvroute_t *kr, int src, const void *batch)
{
    if (inject(kr, src, batch) != 0)
        return -1;
    kr->l3_src = src;
    atomic_store(&kr->l3_known, 1);
    return 0;
}

/* ---- control plane ---- */

json_t *baton_kvroute_store_json(baton_kvroute_t *kr)
{
    if (!kr || kr->l3_src < 0 || !kr->o.store_endpoint)
        return NULL;
    json_t *masters = json_array();
    uint64_t blocks = 0, events = 0, resets = 0, errors = 0, clears = 0;
    int64_t last = -1;
    uv_mutex_lock(&kr->mu);
    for (sub_t *s = kr->subs; s; s = s->next) {
        if (s->w)
            continue;
        int64_t ls = atomic_load(&s->last_seq);
        json_array_append_new(masters, json_pack("{s:s,s:s,s:I,s:I,s:b,s:s?}", "endpoint", s->ep,
                                                 "state", state_names[atomic_load(&s->state)],
                                                 "last_seq", (json_int_t)ls, "clears",
                                                 (json_int_t)atomic_load(&s->clears), "leading",
                                                 s == kr->l3_last, "last_error",
                                                 s->last_error[0] ? s->last_error : NULL));
        blocks = atomic_load(&s->l1) + atomic_load(&s->l2) > blocks
                     ? atomic_load(&s->l1) + atomic_load(&s->l2)
                     : blocks;
        events += atomic_load(&s->events);
        resets += atomic_load(&s->resets);
        errors += atomic_load(&s->errors);
        clears += atomic_load(&s->clears);
        if (ls > last)
            last = ls;
    }
    uv_mutex_unlock(&kr->mu);
    return json_pack("{s:b,s:I,s:I,s:I,s:I,s:I,s:I,s:o}", "known", atomic_load(&kr->l3_known) != 0,
                     "blocks_L3", (json_int_t)blocks, "last_seq", (json_int_t)last, "events",
                     (json_int_t)events, "clears", (json_int_t)clears, "resets", (json_int_t)resets,
                     "errors", (json_int_t)errors, "masters", masters);
}

json_t *baton_kvroute_worker_json(baton_kvroute_t *kr, const baton_worker_t *w)
{
    if (!kr)
        return NULL;
    json_t *o = NULL, *ranks = NULL;
    uint64_t l1 = 0, l2 = 0, events = 0, gaps = 0, replays = 0, resets = 0, errors = 0;
    int64_t last = -1;
    uv_mutex_lock(&kr->mu);
    for (sub_t *s = kr->subs; s; s = s->next) {
        if (s->w != w)
            continue;
        if (!o) {
            o = json_object();
            ranks = json_array();
        }
        int st = atomic_load(&s->state);
        int64_t ls = atomic_load(&s->last_seq);
        json_array_append_new(ranks, json_pack("{s:i,s:s,s:s,s:I,s:s?}", "rank", s->rank, "state",
                                               state_names[st], "endpoint", s->ep, "last_seq",
                                               (json_int_t)ls, "last_error",
                                               s->last_error[0] ? s->last_error : NULL));
        l1 += atomic_load(&s->l1);
        l2 += atomic_load(&s->l2);
        events += atomic_load(&s->events);
        gaps += atomic_load(&s->gaps);
        replays += atomic_load(&s->replays);
        resets += atomic_load(&s->resets);
        errors += atomic_load(&s->errors);
        if (ls > last)
            last = ls;
    }
    uv_mutex_unlock(&kr->mu);
    if (!o)
        return NULL;
    json_object_set_new(o, "blocks",
                        json_pack("{s:I,s:I}", "L1", (json_int_t)l1, "L2", (json_int_t)l2));
    json_object_set_new(o, "last_seq", json_integer(last));
    json_object_set_new(o, "events", json_integer((json_int_t)events));
    json_object_set_new(o, "gaps", json_integer((json_int_t)gaps));
    json_object_set_new(o, "replays", json_integer((json_int_t)replays));
    json_object_set_new(o, "resets", json_integer((json_int_t)resets));
    json_object_set_new(o, "errors", json_integer((json_int_t)errors));
    json_object_set_new(o, "known",
                        json_boolean(atomic_load(&((baton_worker_t *)w)->kv_sources) != 0));
    json_object_set_new(o, "ranks", ranks);
    return o;
}

void baton_kvroute_stats(baton_kvroute_t *kr, baton_kvroute_stats_t *st)
{
    memset(st, 0, sizeof(*st));
    uv_mutex_lock(&kr->mu);
    for (sub_t *s = kr->subs; s; s = s->next) {
        st->subscriptions++;
        st->synced += atomic_load(&s->state) == ST_SYNCED;
        st->batches += atomic_load(&s->batches);
        st->events += atomic_load(&s->events);
        st->blocks_stored += atomic_load(&s->stored);
        st->blocks_removed += atomic_load(&s->removed);
        st->gaps += atomic_load(&s->gaps);
        st->replays += atomic_load(&s->replays);
        st->resets += atomic_load(&s->resets);
        st->errors += atomic_load(&s->errors);
    }
    uv_mutex_unlock(&kr->mu);
    baton_kvidx_t *x = atomic_load(&kr->idx);
    if (x)
        baton_kvidx_size(x, &st->index_blocks, &st->index_bytes);
}
