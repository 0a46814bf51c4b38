/* admission.c — the router-wide concurrency cap, per-class queue accounting and cross-loop
 * wake-ups. */
#include "router/dataplane/admission.h"

#include <pthread.h>
#include <stdlib.h>

#include "baton/error.h"

struct baton_admission_s {
    unsigned max_active; /* 0 = unlimited */
    unsigned queue_size;
    unsigned reserve_pct; /* interactive's slots beyond max_active, % (system: twice) */
    atomic_uint active;
    atomic_uint queued;                       /* all classes */
    atomic_uint queued_cls[BATON_PRIO_COUNT]; /* per class */
    atomic_uint evicting; /* sheddings asked of a loop and not yet settled (preempt) */
    pthread_mutex_t lock; /* the waker list */
    baton_admission_waker_t *wakers;
};

int baton_admission_create(baton_admission_t **a_p, unsigned max_active, unsigned queue_size)
{
    baton_admission_t *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return BATON_ENOMEM;
    if (pthread_mutex_init(&a->lock, NULL) != 0) {
        free(a);
        return BATON_ENOMEM;
    }
    a->max_active = max_active;
    a->queue_size = queue_size;
    a->reserve_pct = BATON_PRIO_RESERVE_PCT;
    atomic_init(&a->active, 0);
    atomic_init(&a->queued, 0);
    atomic_init(&a->evicting, 0);
    for (int i = 0; i < BATON_PRIO_COUNT; i++)
        atomic_init(&a->queued_cls[i], 0);
    *a_p = a;
    return 0;
}

void baton_admission_destroy(baton_admission_t *a)
{
    if (a == NULL)
        return;
    pthread_mutex_destroy(&a->lock);
    free(a);
}

/* Requests of class cls or above (from = cls) or strictly above (from = cls + 1) waiting. */
static int waiting_from(baton_admission_t *a, int from)
{
    for (int i = from; i < BATON_PRIO_COUNT; i++)
        if (atomic_load(&a->queued_cls[i]) > 0)
            return 1;
    return 0;
}

void baton_admission_set_reserve(baton_admission_t *a, unsigned pct)
{
    a->reserve_pct = pct;
}

int baton_admission_try_acquire(baton_admission_t *a, baton_prio_t cls, int fair)
{
    if (atomic_load(&a->queued) > 0 && waiting_from(a, (int)cls + (fair ? 0 : 1)))
        return 0;
    unsigned limit = baton_prio_slot_limit(cls, a->max_active, a->reserve_pct);
    unsigned cur = atomic_load(&a->active);
    do {
        if (limit && cur >= limit)
            return 0;
    } while (!atomic_compare_exchange_weak(&a->active, &cur, cur + 1));
    return 1;
}

void baton_admission_kick(baton_admission_t *a)
{
    if (atomic_load(&a->queued) == 0)
        return;
    pthread_mutex_lock(&a->lock);
    for (baton_admission_waker_t *w = a->wakers; w != NULL; w = w->next_)
        if (atomic_load(&w->waiting) > 0)
            w->wake(w->ctx);
    pthread_mutex_unlock(&a->lock);
}

void baton_admission_release_quiet(baton_admission_t *a)
{
    atomic_fetch_sub(&a->active, 1);
}

void baton_admission_release(baton_admission_t *a)
{
    atomic_fetch_sub(&a->active, 1);
    baton_admission_kick(a);
}

int baton_admission_enqueue(baton_admission_t *a, baton_admission_waker_t *wk, baton_prio_t cls)
{
    unsigned limit = baton_prio_queue_limit(cls, a->queue_size);
    unsigned cur = atomic_load(&a->queued);
    do {
        if (cur >= limit)
            return BATON_EBUSY;
    } while (!atomic_compare_exchange_weak(&a->queued, &cur, cur + 1));
    atomic_fetch_add(&a->queued_cls[cls], 1);
    atomic_fetch_add(&wk->waiting_cls_[cls], 1);
    atomic_fetch_add(&wk->waiting, 1);
    return 0;
}

int baton_admission_preempt(baton_admission_t *a, baton_admission_waker_t *self, baton_prio_t cls,
                            baton_prio_t victim)
{
    unsigned limit = baton_prio_queue_limit(cls, a->queue_size);
    int rc = BATON_EBUSY;
    pthread_mutex_lock(&a->lock);
    /* Sheddings already asked for count as gone: one more must bring the queue below cls's
     * limit. */
    unsigned q = atomic_load(&a->queued), ev = atomic_load(&a->evicting);
    if (limit == 0 || (q > ev && q - ev > limit))
        goto out;
    if (victim >= cls)
        goto out;
    for (baton_admission_waker_t *w = a->wakers; w != NULL; w = w->next_) {
        if (w == self)
            continue;
        int avail =
            (int)atomic_load(&w->waiting_cls_[victim]) - (int)atomic_load(&w->evict_[victim]);
        if (avail <= 0)
            continue;
        atomic_fetch_add(&w->evict_[victim], 1);
        atomic_fetch_add(&a->evicting, 1);
        atomic_fetch_add(&a->queued, 1);
        atomic_fetch_add(&a->queued_cls[cls], 1);
        atomic_fetch_add(&self->waiting_cls_[cls], 1);
        atomic_fetch_add(&self->waiting, 1);
        w->wake(w->ctx);
        rc = 0;
        break;
    }
out:
    pthread_mutex_unlock(&a->lock);
    return rc;
}

void baton_admission_take_evictions(baton_admission_waker_t *wk, unsigned n_p[BATON_PRIO_COUNT])
{
    for (int c = 0; c < BATON_PRIO_COUNT; c++)
        n_p[c] = atomic_exchange(&wk->evict_[c], 0);
}

void baton_admission_evicted(baton_admission_t *a, unsigned n)
{
    if (n)
        atomic_fetch_sub(&a->evicting, n);
}

void baton_admission_dequeue(baton_admission_t *a, baton_admission_waker_t *wk, baton_prio_t cls)
{
    atomic_fetch_sub(&wk->waiting, 1);
    atomic_fetch_sub(&wk->waiting_cls_[cls], 1);
    atomic_fetch_sub(&a->queued_cls[cls], 1);
    atomic_fetch_sub(&a->queued, 1);
}

void baton_admission_register(baton_admission_t *a, baton_admission_waker_t *wk)
{
    pthread_mutex_lock(&a->lock);
    wk->next_ = a->wakers;
    a->wakers = wk;
    pthread_mutex_unlock(&a->lock);
}

void baton_admission_unregister(baton_admission_t *a, baton_admission_waker_t *wk)
{
    pthread_mutex_lock(&a->lock);
    for (baton_admission_waker_t **pp = &a->wakers; *pp != NULL; pp = &(*pp)->next_) {
        if (*pp == wk) {
            *pp = wk->next_;
            break;
        }
    }
    wk->next_ = NULL;
    /* Sheddings asked of a loop that leaves are settled: nobody will shed them. */
    unsigned n[BATON_PRIO_COUNT], total = 0;
    baton_admission_take_evictions(wk, n);
    for (int c = 0; c < BATON_PRIO_COUNT; c++)
        total += n[c];
    baton_admission_evicted(a, total);
    pthread_mutex_unlock(&a->lock);
}

unsigned baton_admission_active(baton_admission_t *a)
{
    return atomic_load(&a->active);
}

unsigned baton_admission_queued(baton_admission_t *a)
{
    return atomic_load(&a->queued);
}

unsigned baton_admission_queued_class(baton_admission_t *a, baton_prio_t cls)
{
    return atomic_load(&a->queued_cls[cls]);
}

unsigned baton_admission_max_active(const baton_admission_t *a)
{
    return a->max_active;
}

unsigned baton_admission_queue_size(const baton_admission_t *a)
{
    return a->queue_size;
}
