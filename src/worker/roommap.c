/* roommap.c — linear probing with backward-shift deletion (no tombstones). */
#include "worker/roommap.h"

#include <stdlib.h>

#include "baton/error.h"

static size_t hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (size_t)k;
}

static wk_roommap_slot_t *find(const wk_roommap_t *m, uint64_t key)
{
    if (m->cap == 0)
        return NULL;
    size_t mask = m->cap - 1;
    for (size_t i = hash(key) & mask;; i = (i + 1) & mask) {
        wk_roommap_slot_t *s = &m->slots[i];
        if (s->val == NULL)
            return NULL;
        if (s->key == key)
            return s;
    }
}

void *wk_roommap_get(const wk_roommap_t *m, uint64_t key)
{
    wk_roommap_slot_t *s = find(m, key);
    return s ? s->val : NULL;
}

static void insert(wk_roommap_slot_t *slots, size_t cap, uint64_t key, void *val)
{
    size_t mask = cap - 1;
    size_t i = hash(key) & mask;
    while (slots[i].val != NULL)
        i = (i + 1) & mask;
    slots[i].key = key;
    slots[i].val = val;
}

static int grow(wk_roommap_t *m)
{
    size_t cap = m->cap ? m->cap * 2 : 16;
    if (cap < m->cap)
        return BATON_ENOMEM;
    wk_roommap_slot_t *slots = calloc(cap, sizeof(*slots));
    if (slots == NULL)
        return BATON_ENOMEM;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].val != NULL)
            insert(slots, cap, m->slots[i].key, m->slots[i].val);
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return 0;
}

int wk_roommap_put(wk_roommap_t *m, uint64_t key, void *val)
{
    if (val == NULL)
        return BATON_EINVAL;
    if (find(m, key) != NULL)
        return BATON_EEXIST;
    if ((m->n + 1) * 4 > m->cap * 3) { /* keep the load under 3/4 */
        int rc = grow(m);
        if (rc != 0)
            return rc;
    }
    insert(m->slots, m->cap, key, val);
    m->n++;
    return 0;
}

void *wk_roommap_del(wk_roommap_t *m, uint64_t key)
{
    wk_roommap_slot_t *s = find(m, key);
    if (s == NULL)
        return NULL;
    void *val = s->val;
    size_t mask = m->cap - 1;
    size_t i = (size_t)(s - m->slots);
    /* Shift later members of the probe run back so lookups never stop at a hole too early. */
    for (size_t j = (i + 1) & mask; m->slots[j].val != NULL; j = (j + 1) & mask) {
        size_t home = hash(m->slots[j].key) & mask;
        /* move j to i when its home is not in the cyclic interval (i, j] */
        int in_range = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!in_range) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i].val = NULL;
    m->slots[i].key = 0;
    m->n--;
    return val;
}

void wk_roommap_free(wk_roommap_t *m)
{
    free(m->slots);
    m->slots = NULL;
    m->cap = 0;
    m->n = 0;
}
