/* worker_health.c — per-worker health table: breakers, check counters, admission, the status
 * change function, metrics, and sync with the registry. */
#include "router/control/worker_health.h"

#include "baton/error.h"
#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/rand.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#define COMP "health"

/* ---- the counter (worker_health_types.h) ---- */

static const char *const state_names[] = {"up", "up_checking", "down_checking", "down"};

const char *baton_whealth_state_name(baton_whealth_state_t s)
{
    if ((unsigned)s < 4)
        return state_names[s];
    return "unknown";
}

void baton_hcounter_init(baton_hcounter_t *c, unsigned rise, unsigned fall)
{
    c->rise = rise ? rise : 1;
    c->fall = fall ? fall : 1;
    c->health = c->rise;
}

static unsigned hc_max(const baton_hcounter_t *c)
{
    return c->rise + c->fall - 1;
}

int baton_hcounter_update(baton_hcounter_t *c, int ok)
{
    if (ok) {
        if (c->health >= hc_max(c))
            return 0;
        if (c->health + 1 == c->rise) {
            c->health = hc_max(c);
            return 1;
        }
        c->health++;
        return 0;
    }
    if (c->health == 0)
        return 0;
    if (c->health == c->rise) {
        c->health = 0;
        return -1;
    }
    c->health--;
    return 0;
}

void baton_hcounter_force(baton_hcounter_t *c, int up)
{
    c->health = up ? hc_max(c) : 0;
}

int baton_hcounter_is_up(const baton_hcounter_t *c)
{
    return c->health >= c->rise;
}

int baton_hcounter_is_changing(const baton_hcounter_t *c)
{
    return c->health != 0 && c->health != hc_max(c);
}

baton_whealth_state_t baton_hcounter_state(const baton_hcounter_t *c)
{
    if (baton_hcounter_is_up(c))
        return c->health == hc_max(c) ? BATON_WH_UP : BATON_WH_UP_CHECKING;
    return c->health == 0 ? BATON_WH_DOWN : BATON_WH_DOWN_CHECKING;
}

void baton_whealth_config_init(baton_whealth_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->check.enabled = 1;
    cfg->check.interval_ms = 2000;
    cfg->check.fast_interval_ms = 500;
    cfg->check.down_interval_ms = 2000;
    cfg->check.timeout_ms = 1000;
    cfg->check.rise = 2;
    cfg->check.fall = 3;
    snprintf(cfg->check.path, sizeof(cfg->check.path), "/health");
    cfg->check.sync_interval_ms = 250;
    baton_breaker_config_init(&cfg->breaker);
}

/* ---- the table ---- */

enum { TO_UP = 0, TO_DOWN = 1 };

typedef struct entry_s {
    baton_worker_t *w; /* a reference */
    baton_whealth_t *wh;
    baton_breaker_t breaker; /* breaker.data = this entry */
    pthread_mutex_t lock;    /* hc and the check statistics */
    baton_hcounter_t hc;
    uint64_t checks, checks_failed, last_check_ms, transitions;
    int last_status, last_err;
    baton_metric_child_t *m_health, *m_breaker;
    baton_metric_child_t *m_health_to[2];
    baton_metric_child_t *m_breaker_to[3];
    struct entry_s *next;
} entry_t;

struct baton_whealth_s {
    baton_registry_t *reg;
    baton_whealth_config_t cfg;
    pthread_rwlock_t lock; /* the buckets; entries' own state has its own locks */
    entry_t **buckets;
    size_t nbuckets; /* power of two */
    size_t n;
    _Atomic uint64_t seen_gen; /* registry generation of the last sync */
    _Atomic uint64_t seed_ctr;
    baton_metric_family_t *f_health, *f_breaker, *f_health_tr, *f_breaker_tr;
};

static uint64_t default_clock(void *ctx)
{
    return baton_now_ms();
}

/* The configured clock (monotonic ms). */
static uint64_t whealth_now(const baton_whealth_t *wh)
{
    return wh->cfg.clock_ms(wh->cfg.clock_ctx);
}

const baton_whealth_config_t *baton_whealth_config(const baton_whealth_t *wh)
{
    return &wh->cfg;
}

baton_registry_t *baton_whealth_registry(const baton_whealth_t *wh)
{
    return wh->reg;
}

static size_t hash_ptr(const void *p, size_t nbuckets)
{
    return (size_t)(baton_hash_u64((uint64_t)(uintptr_t)p) & (nbuckets - 1));
}

/* Read or write lock held. */
static entry_t *find(baton_whealth_t *wh, const baton_worker_t *w)
{
    for (entry_t *e = wh->buckets[hash_ptr(w, wh->nbuckets)]; e != NULL; e = e->next)
        if (e->w == w)
            return e;
    return NULL;
}

int baton_whealth_create(baton_whealth_t **wh_p, baton_registry_t *reg,
                         const baton_whealth_config_t *cfg)
{
    if (wh_p == NULL || reg == NULL)
        return BATON_EINVAL;
    baton_whealth_t *wh = calloc(1, sizeof(*wh));
    if (wh == NULL)
        return BATON_ENOMEM;
    wh->nbuckets = 64;
    wh->buckets = calloc(wh->nbuckets, sizeof(*wh->buckets));
    if (wh->buckets == NULL || pthread_rwlock_init(&wh->lock, NULL) != 0) {
        free(wh->buckets);
        free(wh);
        return BATON_ENOMEM;
    }
    wh->reg = reg;
    if (cfg != NULL)
        wh->cfg = *cfg;
    else
        baton_whealth_config_init(&wh->cfg);
    wh->cfg.check.path[sizeof(wh->cfg.check.path) - 1] = '\0';
    if (wh->cfg.check.rise == 0)
        wh->cfg.check.rise = 1;
    if (wh->cfg.check.fall == 0)
        wh->cfg.check.fall = 1;
    if (wh->cfg.clock_ms == NULL)
        wh->cfg.clock_ms = default_clock;
    if (wh->cfg.seed == 0)
        wh->cfg.seed = uv_hrtime() ^ (uint64_t)(uintptr_t)wh;
    atomic_init(&wh->seen_gen, 0);
    atomic_init(&wh->seed_ctr, 0);
    *wh_p = wh;
    return 0;
}

static void metrics_drop(baton_whealth_t *wh, entry_t *gone);

static void entry_free(entry_t *e)
{
    baton_breaker_destroy(&e->breaker);
    pthread_mutex_destroy(&e->lock);
    baton_worker_unref(e->w);
    free(e);
}

void baton_whealth_destroy(baton_whealth_t *wh)
{
    if (wh == NULL)
        return;
    for (size_t i = 0; i < wh->nbuckets; i++) {
        entry_t *e = wh->buckets[i];
        while (e != NULL) {
            entry_t *next = e->next;
            entry_free(e);
            e = next;
        }
    }
    free(wh->buckets);
    pthread_rwlock_destroy(&wh->lock);
    free(wh);
}

size_t baton_whealth_size(baton_whealth_t *wh)
{
    pthread_rwlock_rdlock(&wh->lock);
    size_t n = wh->n;
    pthread_rwlock_unlock(&wh->lock);
    return n;
}

/* ---- metrics ---- */

static const char *const breaker_to_names[] = {"closed", "open", "half_open"};

/* Write lock held (or no concurrency yet). */
static void metrics_attach(baton_whealth_t *wh, entry_t *e)
{
    if (wh->f_health == NULL)
        return;
    const char *wr[2] = {e->w->id, baton_worker_role_name(e->w->role)};
    e->m_health = baton_metric_child(wh->f_health, wr);
    e->m_breaker = baton_metric_child(wh->f_breaker, wr);
    const char *hu[2] = {e->w->id, "up"};
    const char *hd[2] = {e->w->id, "down"};
    e->m_health_to[TO_UP] = baton_metric_child(wh->f_health_tr, hu);
    e->m_health_to[TO_DOWN] = baton_metric_child(wh->f_health_tr, hd);
    for (int i = 0; i < 3; i++) {
        const char *bl[2] = {e->w->id, breaker_to_names[i]};
        e->m_breaker_to[i] = baton_metric_child(wh->f_breaker_tr, bl);
    }
    baton_gauge_set(e->m_health, baton_worker_health(e->w) == BATON_HEALTH_HEALTHY ? 1 : 0);
    baton_gauge_set(e->m_breaker, (double)baton_breaker_state(&e->breaker));
}

/* Write lock held, `gone` already unlinked: removes its series unless a live entry (the same
 * URL registered again) still uses the same labels. */
static void metrics_drop(baton_whealth_t *wh, entry_t *gone)
{
    if (wh->f_health == NULL)
        return;
    int same_id = 0, same_role = 0;
    for (size_t i = 0; i < wh->nbuckets; i++) {
        for (entry_t *e = wh->buckets[i]; e != NULL; e = e->next) {
            if (strcmp(e->w->id, gone->w->id) != 0)
                continue;
            same_id = 1;
            if (e->w->role == gone->w->role)
                same_role = 1;
        }
    }
    if (!same_role) {
        const char *wr[2] = {gone->w->id, baton_worker_role_name(gone->w->role)};
        baton_metric_child_remove(wh->f_health, wr);
        baton_metric_child_remove(wh->f_breaker, wr);
    }
    if (!same_id) {
        const char *hu[2] = {gone->w->id, "up"};
        const char *hd[2] = {gone->w->id, "down"};
        baton_metric_child_remove(wh->f_health_tr, hu);
        baton_metric_child_remove(wh->f_health_tr, hd);
        for (int i = 0; i < 3; i++) {
            const char *bl[2] = {gone->w->id, breaker_to_names[i]};
            baton_metric_child_remove(wh->f_breaker_tr, bl);
        }
    }
}

int baton_whealth_metrics_init(baton_whealth_t *wh, baton_metrics_t *metrics)
{
    if (wh == NULL || metrics == NULL)
        return BATON_EINVAL;
    if (wh->f_health != NULL)
        return BATON_EEXIST;
    static const char *const wr[2] = {"worker", "role"};
    static const char *const wt[2] = {"worker", "to"};
    baton_metric_family_t *fh = baton_metrics_gauge(
        metrics, "baton_worker_health", "Worker health from active checks: 1 up, 0 down", 2, wr);
    baton_metric_family_t *fb =
        baton_metrics_gauge(metrics, "baton_worker_breaker_state",
                            "Worker circuit breaker: 0 closed, 1 open, 2 half-open", 2, wr);
    baton_metric_family_t *fht =
        baton_metrics_counter(metrics, "baton_worker_health_transitions_total",
                              "Worker health changes by new state (up, down)", 2, wt);
    baton_metric_family_t *fbt = baton_metrics_counter(
        metrics, "baton_worker_breaker_transitions_total",
        "Worker circuit breaker changes by new state (closed, open, half_open)", 2, wt);
    if (fh == NULL || fb == NULL || fht == NULL || fbt == NULL)
        return BATON_EEXIST; /* families cannot be unregistered; a second call fails the same */
    pthread_rwlock_wrlock(&wh->lock);
    wh->f_health = fh;
    wh->f_breaker = fb;
    wh->f_health_tr = fht;
    wh->f_breaker_tr = fbt;
    for (size_t i = 0; i < wh->nbuckets; i++)
        for (entry_t *e = wh->buckets[i]; e != NULL; e = e->next)
            metrics_attach(wh, e);
    pthread_rwlock_unlock(&wh->lock);
    return 0;
}

/* ---- breaker transitions (breaker mutex held) ---- */

static void on_breaker_change(baton_breaker_t *b, baton_breaker_state_t from,
                              baton_breaker_state_t to, const char *reason, void *ctx)
{
    entry_t *e = b->data;
    baton_whealth_t *wh = ctx;
    baton_registry_set_breaker(wh->reg, e->w, to);
    baton_gauge_set(e->m_breaker, (double)to);
    if ((unsigned)to < 3)
        baton_counter_add(e->m_breaker_to[to], 1);
    log_info(COMP, "worker_breaker_changed id=%s url=%s role=%s from=%s to=%s reason=%s", e->w->id,
             e->w->url, baton_worker_role_name(e->w->role), baton_breaker_state_name(from),
             baton_breaker_state_name(to), reason);
}

/* ---- entries ---- */

/* Write lock held. NULL on ENOMEM. */
static entry_t *entry_create_locked(baton_whealth_t *wh, baton_worker_t *w)
{
    if (wh->n + 1 > wh->nbuckets) {
        size_t nb = wh->nbuckets * 2;
        entry_t **nbk = calloc(nb, sizeof(*nbk));
        if (nbk != NULL) {
            for (size_t i = 0; i < wh->nbuckets; i++) {
                entry_t *e = wh->buckets[i];
                while (e != NULL) {
                    entry_t *next = e->next;
                    size_t h = hash_ptr(e->w, nb);
                    e->next = nbk[h];
                    nbk[h] = e;
                    e = next;
                }
            }
            free(wh->buckets);
            wh->buckets = nbk;
            wh->nbuckets = nb;
        } /* else: keep the longer chains */
    }
    entry_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return NULL;
    if (pthread_mutex_init(&e->lock, NULL) != 0) {
        free(e);
        return NULL;
    }
    e->breaker.data = e;
    uint64_t seed = wh->cfg.seed + BATON_GOLDEN_GAMMA * (atomic_fetch_add(&wh->seed_ctr, 1) + 1);
    if (baton_breaker_init(&e->breaker, &wh->cfg.breaker, on_breaker_change, wh, seed) != 0) {
        pthread_mutex_destroy(&e->lock);
        free(e);
        return NULL;
    }
    baton_worker_ref(w);
    e->w = w;
    e->wh = wh;
    baton_hcounter_init(&e->hc, wh->cfg.check.rise, wh->cfg.check.fall);
    if (baton_worker_health(w) != BATON_HEALTH_HEALTHY)
        baton_hcounter_force(&e->hc, 0);
    else if (!wh->cfg.check.enabled)
        baton_hcounter_force(&e->hc, 1); /* nothing will ever confirm it */
    /* A fresh breaker is CLOSED; say so if an earlier entry for this worker left another state. */
    baton_registry_set_breaker(wh->reg, w, BATON_BREAKER_CLOSED);
    size_t h = hash_ptr(w, wh->nbuckets);
    e->next = wh->buckets[h];
    wh->buckets[h] = e;
    wh->n++;
    metrics_attach(wh, e);
    return e;
}

/* Returns the entry with the READ lock held (the caller unlocks), creating it if needed; NULL
 * (no lock held) when w is removed or on ENOMEM. */
static entry_t *acquire(baton_whealth_t *wh, baton_worker_t *w)
{
    pthread_rwlock_rdlock(&wh->lock);
    entry_t *e = find(wh, w);
    if (e != NULL)
        return e;
    pthread_rwlock_unlock(&wh->lock);
    if (baton_worker_is_removed(w))
        return NULL;
    pthread_rwlock_wrlock(&wh->lock);
    e = find(wh, w);
    if (e == NULL && !baton_worker_is_removed(w))
        e = entry_create_locked(wh, w);
    pthread_rwlock_unlock(&wh->lock);
    if (e == NULL)
        return NULL;
    /* Entries are only freed under the write lock by sync, for removed workers; re-find under
     * the read lock so the pointer we hand out is protected. */
    pthread_rwlock_rdlock(&wh->lock);
    e = find(wh, w);
    if (e == NULL)
        pthread_rwlock_unlock(&wh->lock);
    return e;
}

static void release(baton_whealth_t *wh)
{
    pthread_rwlock_unlock(&wh->lock);
}

/* ---- the request path ---- */

static int worker_serving(const baton_worker_t *w)
{
    return !baton_worker_is_removed(w) && !baton_worker_is_draining(w) &&
           baton_worker_health(w) == BATON_HEALTH_HEALTHY;
}

int baton_whealth_admit(baton_whealth_t *wh, baton_worker_t *w, baton_whealth_ticket_t *ticket_p)
{
    *ticket_p = 0;
    if (!worker_serving(w))
        return 0;
    entry_t *e = acquire(wh, w);
    if (e == NULL)
        return 0;
    baton_breaker_ticket_t t = baton_breaker_allow(&e->breaker, whealth_now(wh));
    release(wh);
    *ticket_p = t;
    return t != 0;
}

/* Could admit() succeed now? Takes nothing. */
static int could_admit(baton_whealth_t *wh, baton_worker_t *w, uint64_t now)
{
    if (!worker_serving(w))
        return 0;
    if (baton_worker_breaker(w) == BATON_BREAKER_CLOSED)
        return 1; /* admit() re-checks the breaker itself */
    pthread_rwlock_rdlock(&wh->lock);
    entry_t *e = find(wh, w);
    int ok = e == NULL || baton_breaker_would_allow(&e->breaker, now);
    pthread_rwlock_unlock(&wh->lock);
    return ok;
}

#define PICK_STACK 64

baton_worker_t *baton_whealth_pick(baton_whealth_t *wh, baton_policy_t *policy,
                                   baton_worker_role_t role, baton_whealth_ticket_t *ticket_p)
{
    *ticket_p = 0;
    baton_worker_t *stack[PICK_STACK], **cands;
    size_t n =
        baton_registry_snapshot_all(wh->reg, role, BATON_SNAP_ALL, stack, PICK_STACK, &cands);
    uint64_t now = whealth_now(wh);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (could_admit(wh, cands[i], now))
            cands[k++] = cands[i];
        else
            baton_worker_unref(cands[i]);
    }
    baton_worker_t *chosen = NULL;
    while (k > 0) {
        baton_worker_t *c = baton_policy_select(policy, cands, k);
        if (c == NULL)
            break;
        if (baton_whealth_admit(wh, c, ticket_p)) {
            chosen = c;
            baton_worker_ref(chosen);
            break;
        }
        /* Lost a race (the probe slot went to another request): choose among the others. */
        for (size_t i = 0; i < k; i++) {
            if (cands[i] == c) {
                baton_worker_unref(c);
                cands[i] = cands[--k];
                break;
            }
        }
    }
    baton_workers_release(cands, k, stack);
    return chosen;
}

void baton_whealth_done(baton_whealth_t *wh, baton_worker_t *w, baton_whealth_ticket_t ticket,
                        baton_breaker_outcome_t outcome)
{
    if (ticket == 0 || w == NULL)
        return;
    pthread_rwlock_rdlock(&wh->lock);
    entry_t *e = find(wh, w); /* gone: the worker was removed, nothing left to decide */
    if (e != NULL)
        baton_breaker_record(&e->breaker, whealth_now(wh), ticket, outcome);
    pthread_rwlock_unlock(&wh->lock);
}

/* ---- status ---- */

/* Read lock and e->lock held; the side changed to `up`. */
static void publish_health(baton_whealth_t *wh, entry_t *e, int up, const char *reason)
{
    e->transitions++;
    baton_registry_set_health(wh->reg, e->w, up ? BATON_HEALTH_HEALTHY : BATON_HEALTH_UNHEALTHY);
    baton_gauge_set(e->m_health, up ? 1 : 0);
    baton_counter_add(e->m_health_to[up ? TO_UP : TO_DOWN], 1);
    log_info(COMP, "worker_health_changed id=%s url=%s role=%s from=%s to=%s reason=\"%s\"",
             e->w->id, e->w->url, baton_worker_role_name(e->w->role), up ? "down" : "up",
             up ? "up" : "down", reason != NULL ? reason : "");
    if (up)
        baton_breaker_expire(&e->breaker, whealth_now(wh));
}

int baton_whealth_set_health(baton_whealth_t *wh, baton_worker_t *w, int up, const char *reason)
{
    entry_t *e = acquire(wh, w);
    if (e == NULL)
        return BATON_ENOTFOUND;
    pthread_mutex_lock(&e->lock);
    int was_up = baton_hcounter_is_up(&e->hc);
    baton_hcounter_force(&e->hc, up);
    /* Compare with the registry too: it is what routing reads. */
    int reg_up = baton_worker_health(w) == BATON_HEALTH_HEALTHY;
    if (was_up != !!up || reg_up != !!up)
        publish_health(wh, e, !!up, reason);
    pthread_mutex_unlock(&e->lock);
    release(wh);
    return 0;
}

static void check_reason(char *buf, size_t len, int ok, int status, int err,
                         const baton_hcounter_t *hc)
{
    if (err != 0)
        snprintf(buf, len, "check failed: %s (%s), health %u/%u", baton_err_name(err),
                 baton_strerror(err), hc->health, hc->rise + hc->fall - 1);
    else
        snprintf(buf, len, "check %s: status %d, health %u/%u", ok ? "passed" : "failed", status,
                 hc->health, hc->rise + hc->fall - 1);
}

int baton_whealth_check_result(baton_whealth_t *wh, baton_worker_t *w, int ok, int status, int err)
{
    entry_t *e = acquire(wh, w);
    if (e == NULL)
        return BATON_ENOTFOUND;
    pthread_mutex_lock(&e->lock);
    e->checks++;
    if (!ok)
        e->checks_failed++;
    e->last_check_ms = whealth_now(wh);
    e->last_status = status;
    e->last_err = err;
    int crossed = baton_hcounter_update(&e->hc, ok);
    if (crossed != 0) {
        char reason[192];
        check_reason(reason, sizeof(reason), ok, status, err, &e->hc);
        publish_health(wh, e, crossed > 0, reason);
    } else if (!ok || baton_hcounter_is_changing(&e->hc)) {
        char reason[192];
        check_reason(reason, sizeof(reason), ok, status, err, &e->hc);
        log_debug(COMP, "worker_check id=%s state=%s detail=\"%s\"", w->id,
                  baton_whealth_state_name(baton_hcounter_state(&e->hc)), reason);
    }
    int state = (int)baton_hcounter_state(&e->hc);
    pthread_mutex_unlock(&e->lock);
    release(wh);
    return state;
}

int baton_whealth_breaker_reset(baton_whealth_t *wh, baton_worker_t *w)
{
    entry_t *e = acquire(wh, w);
    if (e == NULL)
        return BATON_ENOTFOUND;
    baton_breaker_reset(&e->breaker, whealth_now(wh));
    release(wh);
    return 0;
}

int baton_whealth_info(baton_whealth_t *wh, baton_worker_t *w, baton_whealth_info_t *info)
{
    pthread_rwlock_rdlock(&wh->lock);
    entry_t *e = find(wh, w);
    if (e == NULL) {
        pthread_rwlock_unlock(&wh->lock);
        return BATON_ENOTFOUND;
    }
    pthread_mutex_lock(&e->lock);
    memset(info, 0, sizeof(*info));
    info->state = baton_hcounter_state(&e->hc);
    info->counter = e->hc.health;
    info->rise = e->hc.rise;
    info->fall = e->hc.fall;
    info->checks = e->checks;
    info->checks_failed = e->checks_failed;
    info->last_check_ms = e->last_check_ms;
    info->last_check_status = e->last_status;
    info->last_check_err = e->last_err;
    info->transitions = e->transitions;
    pthread_mutex_unlock(&e->lock);
    baton_breaker_get_info(&e->breaker, &info->breaker);
    pthread_rwlock_unlock(&wh->lock);
    return 0;
}

/* ---- sync ---- */

void baton_whealth_sync(baton_whealth_t *wh)
{
    uint64_t gen = baton_registry_generation(wh->reg);
    if (gen != atomic_load(&wh->seen_gen)) {
        baton_worker_t *stack[PICK_STACK];
        baton_worker_t **ws = stack;
        size_t cap = PICK_STACK;
        size_t total = baton_registry_snapshot(wh->reg, BATON_ROLE_ANY, BATON_SNAP_ALL, ws, cap);
        int complete = 1;
        if (total > cap) {
            baton_workers_unref(ws, cap);
            cap = total + 16;
            ws = malloc(cap * sizeof(*ws));
            if (ws == NULL) {
                ws = stack;
                cap = 0;
                total = 0;
                complete = 0; /* retry on the next sync */
            } else {
                total = baton_registry_snapshot(wh->reg, BATON_ROLE_ANY, BATON_SNAP_ALL, ws, cap);
            }
        }
        size_t n = total < cap ? total : cap;
        entry_t *dead = NULL;
        pthread_rwlock_wrlock(&wh->lock);
        for (size_t i = 0; i < wh->nbuckets; i++) {
            entry_t **pp = &wh->buckets[i];
            while (*pp != NULL) {
                entry_t *e = *pp;
                if (baton_worker_is_removed(e->w)) {
                    *pp = e->next;
                    e->next = dead;
                    dead = e;
                    wh->n--;
                } else {
                    pp = &e->next;
                }
            }
        }
        for (entry_t *e = dead; e != NULL; e = e->next)
            metrics_drop(wh, e);
        for (size_t i = 0; i < n; i++) {
            if (!baton_worker_is_removed(ws[i]) && find(wh, ws[i]) == NULL &&
                entry_create_locked(wh, ws[i]) == NULL)
                complete = 0;
        }
        pthread_rwlock_unlock(&wh->lock);
        while (dead != NULL) {
            entry_t *next = dead->next;
            entry_free(dead);
            dead = next;
        }
        baton_workers_unref(ws, n);
        if (ws != stack)
            free(ws);
        if (complete && total <= cap)
            atomic_store(&wh->seen_gen, gen);
    }

    uint64_t now = whealth_now(wh);
    pthread_rwlock_rdlock(&wh->lock);
    for (size_t i = 0; i < wh->nbuckets; i++)
        for (entry_t *e = wh->buckets[i]; e != NULL; e = e->next)
            baton_breaker_poll(&e->breaker, now);
    pthread_rwlock_unlock(&wh->lock);
}
