/* store/meta_evict.c — eviction: LRU order over committed objects, never a leased or uncommitted
 * one, soft-pinned ones last, optionally within one namespace (quotas), and the watermark rule. */
#include "store/meta_int.h"

/* Walks one LRU list from its cold end, freeing eligible objects until `goal` bytes are freed.
 * pinned_pass: 0 = objects not pinned now, 1 = pinned ones too. */
static uint64_t evict_list(baton__meta_t *m, baton__olist_t *l, uint64_t goal, uint32_t ns,
                           int pinned_pass, uint64_t now_ms, uint64_t freed)
{
    baton__mobj_t *o = l->head;
    while (o && freed < goal) {
        baton__mobj_t *next = o->next;
        int pinned = now_ms < o->pin_until;
        if ((ns == UINT32_MAX || o->ns == ns) && !baton__meta_leased(o, now_ms) &&
            (pinned_pass || !pinned)) {
            freed += o->held_bytes;
            m->st.evictions++;
            m->st.evicted_bytes += o->held_bytes;
            baton__meta_obj_set_state(m, o, BATON__OBJ_FREED, now_ms);
        }
        o = next;
    }
    return freed;
}

/* A soft pin that lapsed makes its object ordinary cache for good (a later read does not pin it
 * again): it moves to the ordinary LRU list, at the place its last access gives it. */
static void lapse_pins(baton__meta_t *m, uint64_t now_ms)
{
    baton__mobj_t *o = m->lru_pin.head;
    while (o) {
        baton__mobj_t *next = o->next;
        if (now_ms >= o->pin_until) {
            baton__olist_remove(&m->lru_pin, o);
            o->soft_pin = 0;
            baton__mobj_t *at = m->lru.tail; /* usually the new ones are the most recent */
            while (at && at->atime_ms > o->atime_ms)
                at = at->prev;
            baton__olist_t *l = &m->lru;
            o->prev = at;
            o->next = at ? at->next : l->head;
            if (o->next)
                o->next->prev = o;
            else
                l->tail = o;
            if (at)
                at->next = o;
            else
                l->head = o;
            o->list = l;
            l->n++;
        }
        o = next;
    }
}

uint64_t baton__meta_evict(baton__meta_t *m, uint64_t goal, uint32_t ns, uint64_t now_ms)
{
    lapse_pins(m, now_ms);
    uint64_t freed = evict_list(m, &m->lru, goal, ns, 0, now_ms, 0);
    return evict_list(m, &m->lru_pin, goal, ns, 1, now_ms, freed); /* soft pins, last */
}

size_t baton__meta_evict_watermark(baton__meta_t *m, uint64_t now_ms)
{
    if (m->capacity == 0 || (double)m->used < m->cfg.high_watermark * (double)m->capacity)
        return 0;
    uint64_t before = m->st.evictions;
    baton__meta_evict(m, (uint64_t)(m->cfg.evict_ratio * (double)m->capacity), UINT32_MAX, now_ms);
    return (size_t)(m->st.evictions - before);
}
