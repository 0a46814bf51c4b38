/* kvpool.c — page-slot pool, FIFO waiters and fenced leases (see kvpool.h). */
#include "worker/kvpool.h"

#include <stdlib.h>
#include <string.h>

#include "baton/error.h"

int wk_kvpool_init(wk_kvpool_t *p, uint32_t n_slots)
{
    memset(p, 0, sizeof(*p));
    baton_list_init(&p->waiters);
    if (n_slots == 0)
        return BATON_EINVAL;
    p->free = malloc((size_t)n_slots * sizeof(*p->free));
    if (p->free == NULL)
        return BATON_ENOMEM;
    p->n_slots = n_slots;
    /* Popped from the top: slot 0 first, so a fresh pool hands out low addresses. */
    for (uint32_t i = 0; i < n_slots; i++)
        p->free[i] = n_slots - 1 - i;
    p->n_free = n_slots;
    return 0;
}

void wk_kvpool_free(wk_kvpool_t *p)
{
    free(p->free);
    memset(p, 0, sizeof(*p));
}

static void pop_n(wk_kvpool_t *p, uint32_t n, uint32_t *out)
{
    for (uint32_t i = 0; i < n; i++)
        out[i] = p->free[--p->n_free];
}

int wk_kvpool_take(wk_kvpool_t *p, uint32_t n, uint32_t *out)
{
    if (n == 0)
        return BATON_EINVAL;
    if (n > p->n_slots)
        return BATON_ETOOBIG;
    if (!baton_list_empty(&p->waiters) || n > p->n_free)
        return BATON_EBUSY;
    pop_n(p, n, out);
    return 0;
}

void wk_kvpool_put(wk_kvpool_t *p, const uint32_t *slots, uint32_t n)
{
    for (uint32_t i = 0; i < n && p->n_free < p->n_slots; i++)
        p->free[p->n_free++] = slots[i];
}

void wk_kvpool_wait(wk_kvpool_t *p, wk_kvwait_t *w)
{
    baton_list_push(&p->waiters, &w->link);
    w->queued = 1;
    p->n_waiting++;
    p->slots_wanted += w->n;
}

void wk_kvpool_cancel(wk_kvpool_t *p, wk_kvwait_t *w)
{
    if (!w->queued)
        return;
    baton_list_remove(&w->link);
    w->queued = 0;
    p->n_waiting--;
    p->slots_wanted -= w->n;
}

wk_kvwait_t *wk_kvpool_head(const wk_kvpool_t *p)
{
    baton_list_t *first = baton_list_first(&p->waiters);
    return first ? container_of(first, wk_kvwait_t, link) : NULL;
}

wk_kvwait_t *wk_kvpool_next_ready(wk_kvpool_t *p)
{
    wk_kvwait_t *w = wk_kvpool_head(p);
    if (w == NULL || w->n > p->n_free)
        return NULL;
    wk_kvpool_cancel(p, w);
    pop_n(p, w->n, w->slots);
    return w;
}

/* ---- leases ---- */

int wk_kvlease_init(wk_kvlease_t *l, const uint32_t *slots, uint32_t n, unsigned holds)
{
    memset(l, 0, sizeof(*l));
    l->slots = malloc((size_t)(n ? n : 1) * sizeof(*l->slots));
    if (l->slots == NULL)
        return BATON_ENOMEM;
    memcpy(l->slots, slots, (size_t)n * sizeof(*slots));
    l->n = n;
    l->holds = holds;
    return 0;
}

void wk_kvlease_hold(wk_kvlease_t *l, unsigned hold)
{
    if (l->slots != NULL)
        l->holds |= hold;
}

static int maybe_release(wk_kvpool_t *p, wk_kvlease_t *l)
{
    if (l->slots == NULL || l->holds != 0 || l->work != 0)
        return 0;
    wk_kvpool_put(p, l->slots, l->n);
    free(l->slots);
    l->slots = NULL;
    return 1;
}

int wk_kvlease_drop(wk_kvpool_t *p, wk_kvlease_t *l, unsigned hold)
{
    if (!(l->holds & hold))
        return 0;
    l->holds &= ~hold;
    return maybe_release(p, l);
}

void wk_kvlease_work_start(wk_kvlease_t *l)
{
    l->work++;
}

int wk_kvlease_work_done(wk_kvpool_t *p, wk_kvlease_t *l)
{
    if (l->work == 0)
        return 0;
    l->work--;
    return maybe_release(p, l);
}

int wk_kvlease_live(const wk_kvlease_t *l)
{
    return l->slots != NULL;
}
