/* u64map.c — linear-probing u64 -> pointer map with tombstones (see u64map.h). */
#include "common/u64map.h"

#include <stdlib.h>

#include "baton/error.h"
#include "common/hash.h"

static char tomb_;
#define TOMB ((void *)&tomb_)

static size_t slot(uint64_t k, size_t cap)
{
    return (size_t)baton_hash_u64(k) & (cap - 1);
}

void baton_u64map_init(baton_u64map_t *m)
{
    m->keys = NULL;
    m->vals = NULL;
    m->cap = m->count = m->used = 0;
}

void baton_u64map_free(baton_u64map_t *m)
{
    free(m->keys);
    free(m->vals);
    baton_u64map_init(m);
}

/* The slot holding key, or -1. */
static long find(const baton_u64map_t *m, uint64_t key)
{
    if (m->cap == 0)
        return -1;
    for (size_t i = slot(key, m->cap), n = 0; n < m->cap; i = (i + 1) & (m->cap - 1), n++) {
        void *v = m->vals[i];
        if (v == NULL)
            return -1;
        if (v != TOMB && m->keys[i] == key)
            return (long)i;
    }
    return -1;
}

void *baton_u64map_get(const baton_u64map_t *m, uint64_t key)
{
    long i = find(m, key);
    return i < 0 ? NULL : m->vals[i];
}

static int grow(baton_u64map_t *m, size_t cap)
{
    uint64_t *keys = malloc(cap * sizeof(*keys));
    void **vals = calloc(cap, sizeof(*vals));
    if (keys == NULL || vals == NULL) {
        free(keys);
        free(vals);
        return BATON_ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++) {
        void *v = m->vals[i];
        if (v == NULL || v == TOMB)
            continue;
        size_t j = slot(m->keys[i], cap);
        while (vals[j] != NULL)
            j = (j + 1) & (cap - 1);
        keys[j] = m->keys[i];
        vals[j] = v;
    }
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->cap = cap;
    m->used = m->count;
    return 0;
}

int baton_u64map_put(baton_u64map_t *m, uint64_t key, void *val)
{
    if (baton_u64map_get(m, key) != NULL)
        return BATON_EEXIST;
    if ((m->used + 1) * 4 >= m->cap * 3) {
        size_t cap = m->cap ? m->cap : 16;
        while ((m->count + 1) * 2 >= cap)
            cap *= 2;
        if (grow(m, cap) != 0)
            return BATON_ENOMEM;
    }
    size_t i = slot(key, m->cap);
    while (m->vals[i] != NULL && m->vals[i] != TOMB)
        i = (i + 1) & (m->cap - 1);
    if (m->vals[i] == NULL)
        m->used++;
    m->keys[i] = key;
    m->vals[i] = val;
    m->count++;
    return 0;
}

void *baton_u64map_del(baton_u64map_t *m, uint64_t key)
{
    long i = find(m, key);
    if (i < 0)
        return NULL;
    void *v = m->vals[i];
    m->vals[i] = TOMB;
    m->count--;
    return v;
}

void *baton_u64map_next(const baton_u64map_t *m, size_t *it, uint64_t *key_p)
{
    while (*it < m->cap) {
        size_t i = (*it)++;
        void *v = m->vals[i];
        if (v != NULL && v != TOMB) {
            if (key_p)
                *key_p = m->keys[i];
            return v;
        }
    }
    return NULL;
}
