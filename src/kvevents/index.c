/* kvevents/index.c — the exact block index: one open-addressing table of keys to holder bit sets
 * (per tier), and per source a map of engine hash to key. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/rand.h"
#include "common/u64map.h"
#include "kvevents/index.h"

enum { EMPTY = 0, TOMB = 1 };

typedef struct {
    uint64_t key; /* EMPTY, TOMB or a key (>= 2) */
    uint64_t l1, l2;
} slot_t;

typedef struct {
    baton_u64map_t by_engine; /* engine hash -> key (as a pointer; keys are never 0) */
    baton_kvidx_source_stats_t st;
} source_t;

struct baton_kvidx {
    pthread_rwlock_t lock;
    unsigned slice; /* blocks written since the lock was taken (the writer's own) */
    uint32_t block_size;
    slot_t *t;
    size_t cap, count, used;
    source_t src[BATON_KVIDX_MAX_SOURCES];
};

uint64_t baton_kvidx_key(uint64_t parent_key, uint32_t block_size, const uint32_t *ids)
{
    uint64_t h = baton_mix64(parent_key ^ ((uint64_t)block_size << 32));
    for (uint32_t i = 0; i < block_size; i++)
        h = baton_mix64(h ^ ids[i]);
    return h < 2 ? h + 2 : h;
}

/* The engine's hash as a map key: the integer itself, or FNV-1a of the digest's bytes. */
static uint64_t engine_key(const baton_kvev_hash_t *h)
{
    uint64_t k = h->len ? baton_fnv1a64_add(BATON_FNV1A64_INIT, h->b, h->len) : (uint64_t)h->i;
    return k;
}

baton_kvidx_t *baton_kvidx_create(uint32_t block_size)
{
    if (block_size == 0)
        return NULL;
    baton_kvidx_t *x = calloc(1, sizeof(*x));
    if (!x)
        return NULL;
    pthread_rwlock_init(&x->lock, NULL);
    x->block_size = block_size;
    for (int s = 0; s < BATON_KVIDX_MAX_SOURCES; s++)
        baton_u64map_init(&x->src[s].by_engine);
    return x;
}

void baton_kvidx_destroy(baton_kvidx_t *x)
{
    if (!x)
        return;
    for (int s = 0; s < BATON_KVIDX_MAX_SOURCES; s++)
        baton_u64map_free(&x->src[s].by_engine);
    free(x->t);
    pthread_rwlock_destroy(&x->lock);
    free(x);
}

static slot_t *lookup(const baton_kvidx_t *x, uint64_t key)
{
    if (!x->cap)
        return NULL;
    for (size_t i = baton_mix64(key) & (x->cap - 1);; i = (i + 1) & (x->cap - 1)) {
        slot_t *s = &x->t[i];
        if (s->key == key)
            return s;
        if (s->key == EMPTY)
            return NULL;
    }
}

static int rehash(baton_kvidx_t *x, size_t cap)
{
    slot_t *t = calloc(cap, sizeof(*t));
    if (!t)
        return -1;
    for (size_t i = 0; i < x->cap; i++) {
        if (x->t[i].key < 2)
            continue;
        size_t j = baton_mix64(x->t[i].key) & (cap - 1);
        while (t[j].key != EMPTY)
            j = (j + 1) & (cap - 1);
        t[j] = x->t[i];
    }
    free(x->t);
    x->t = t;
    x->cap = cap;
    x->used = x->count;
    return 0;
}

/* The slot of key, inserted empty when absent (one probe sequence: the first tombstone on the
 * way is reused); NULL when out of memory. */
static slot_t *upsert(baton_kvidx_t *x, uint64_t key)
{
    if ((x->used + 1) * 4 > x->cap * 3) {
        size_t cap = x->cap ? x->cap : 1024;
        while ((x->count + 1) * 2 > cap)
            cap *= 2;
        if (rehash(x, cap) < 0)
            return NULL;
    }
    slot_t *tomb = NULL;
    for (size_t i = baton_mix64(key) & (x->cap - 1);; i = (i + 1) & (x->cap - 1)) {
        slot_t *s = &x->t[i];
        if (s->key == key)
            return s;
        if (s->key == TOMB && !tomb)
            tomb = s;
        if (s->key == EMPTY) {
            if (tomb)
                s = tomb;
            else
                x->used++;
            *s = (slot_t){.key = key};
            x->count++;
            return s;
        }
    }
}

static void drop_holder(baton_kvidx_t *x, int src, uint64_t key)
{
    slot_t *s = lookup(x, key);
    if (!s)
        return;
    uint64_t bit = 1ull << src;
    baton_kvidx_source_stats_t *st = &x->src[src].st;
    if (s->l1 & bit)
        st->blocks_l1--;
    else if (s->l2 & bit)
        st->blocks_l2--;
    s->l1 &= ~bit;
    s->l2 &= ~bit;
    if (!s->l1 && !s->l2) {
        s->key = TOMB;
        x->count--;
    }
}

static int is_l1(const char *medium)
{
    return medium[0] == '\0' || strcmp(medium, "GPU") == 0;
}

/* The writer lets readers in every BATON_KVIDX_WRITE_SLICE blocks (index.h). */
static void yield_slice(baton_kvidx_t *x)
{
    if (++x->slice < BATON_KVIDX_WRITE_SLICE)
        return;
    x->slice = 0;
    pthread_rwlock_unlock(&x->lock);
    pthread_rwlock_wrlock(&x->lock);
}

static int apply_stored(baton_kvidx_t *x, int src, const baton_kvev_event_t *e)
{
    source_t *so = &x->src[src];
    if (e->block_size != x->block_size)
        return -1;
    uint64_t parent = BATON_KVIDX_ROOT;
    if (e->has_parent) {
        void *p = baton_u64map_get(&so->by_engine, engine_key(&e->parent));
        if (!p) {
            so->st.orphaned += e->n_hashes;
            return 0;
        }
        parent = (uint64_t)(uintptr_t)p;
    }
    uint64_t bit = 1ull << src;
    for (uint32_t k = 0; k < e->n_hashes; k++) {
        uint64_t key = baton_kvidx_key(parent, x->block_size, e->token_ids + (size_t)k * x->block_size);
        uint64_t ek = engine_key(&e->hashes[k]);
        void *old = baton_u64map_get(&so->by_engine, ek);
        if (!old) {
            if (baton_u64map_put(&so->by_engine, ek, (void *)(uintptr_t)key) != 0)
                return 0; /* out of memory: the rest is not indexed */
            so->st.blocks++;
        } else if ((uint64_t)(uintptr_t)old != key) {
            drop_holder(x, src, (uint64_t)(uintptr_t)old);
            baton_u64map_del(&so->by_engine, ek);
            baton_u64map_put(&so->by_engine, ek, (void *)(uintptr_t)key);
        }
        slot_t *s = upsert(x, key);
        if (!s)
            return 0;
        int had1 = (s->l1 & bit) != 0, had2 = (s->l2 & bit) != 0;
        if (is_l1(e->medium)) {
            s->l1 |= bit;
            s->l2 &= ~bit;
        } else if (!(s->l1 & bit)) {
            s->l2 |= bit;
        }
        so->st.blocks_l1 += (uint64_t)((s->l1 & bit) != 0) - (uint64_t)had1;
        so->st.blocks_l2 += (uint64_t)((s->l2 & bit) != 0) - (uint64_t)had2;
        parent = key;
        yield_slice(x);
    }
    return 0;
}

static void apply_removed(baton_kvidx_t *x, int src, const baton_kvev_event_t *e)
{
    source_t *so = &x->src[src];
    for (uint32_t k = 0; k < e->n_hashes; k++) {
        void *p = baton_u64map_del(&so->by_engine, engine_key(&e->hashes[k]));
        if (!p) {
            so->st.unknown_removes++;
            continue;
        }
        drop_holder(x, src, (uint64_t)(uintptr_t)p);
        so->st.blocks--;
        yield_slice(x);
    }
}

static void clear_locked(baton_kvidx_t *x, int src)
{
    source_t *so = &x->src[src];
    size_t it = 0;
    uint64_t ek;
    void *p;
    while ((p = baton_u64map_next(&so->by_engine, &it, &ek)))
        drop_holder(x, src, (uint64_t)(uintptr_t)p);
    baton_u64map_free(&so->by_engine);
    baton_u64map_init(&so->by_engine);
    so->st.blocks = 0;
    so->st.blocks_l1 = so->st.blocks_l2 = 0;
}

int baton_kvidx_apply(baton_kvidx_t *x, int src, const baton_kvev_batch_t *b)
{
    if (src < 0 || src >= BATON_KVIDX_MAX_SOURCES)
        return -1;
    int rc = 0;
    pthread_rwlock_wrlock(&x->lock);
    x->slice = 0;
    for (uint32_t k = 0; k < b->n_events && rc == 0; k++) {
        const baton_kvev_event_t *e = &b->events[k];
        if (e->type == BATON_KVEV_STORED)
            rc = apply_stored(x, src, e);
        else if (e->type == BATON_KVEV_REMOVED)
            apply_removed(x, src, e);
        else
            clear_locked(x, src);
    }
    pthread_rwlock_unlock(&x->lock);
    return rc;
}

void baton_kvidx_clear(baton_kvidx_t *x, int src)
{
    if (src < 0 || src >= BATON_KVIDX_MAX_SOURCES)
        return;
    pthread_rwlock_wrlock(&x->lock);
    clear_locked(x, src);
    pthread_rwlock_unlock(&x->lock);
}

uint32_t baton_kvidx_block_size(const baton_kvidx_t *x)
{
    return x->block_size;
}

uint32_t baton_kvidx_chain(uint32_t block_size, const uint32_t *ids, uint32_t n, uint64_t *keys)
{
    uint32_t nb = block_size ? n / block_size : 0;
    uint64_t key = BATON_KVIDX_ROOT;
    for (uint32_t b = 0; b < nb; b++)
        keys[b] = key = baton_kvidx_key(key, block_size, ids + (size_t)b * block_size);
    return nb;
}

void baton_kvidx_match_keys(baton_kvidx_t *x, const uint64_t *keys, uint32_t nb, uint64_t sources,
                            uint32_t *l1, uint32_t *l2)
{
    memset(l1, 0, BATON_KVIDX_MAX_SOURCES * sizeof(*l1));
    memset(l2, 0, BATON_KVIDX_MAX_SOURCES * sizeof(*l2));
    uint64_t alive = sources, in_l2 = 0;
    pthread_rwlock_rdlock(&x->lock);
    for (uint32_t b = 0; b < nb && alive; b++) {
        const slot_t *s = lookup(x, keys[b]);
        uint64_t a1 = s ? s->l1 : 0, a2 = s ? s->l2 : 0;
        /* L1 counts while the prefix is all L1; once a source's prefix continues in L2 only,
         * the rest of it counts as L2. */
        uint64_t still = alive & (a1 | a2);
        for (uint64_t m = still; m; m &= m - 1) {
            int s_ = __builtin_ctzll(m);
            if ((a1 >> s_ & 1) && !(in_l2 >> s_ & 1))
                l1[s_]++;
            else {
                l2[s_]++;
                in_l2 |= 1ull << s_;
            }
        }
        if (b == 0)
            for (uint64_t m = still; m; m &= m - 1)
                __atomic_fetch_add(&x->src[__builtin_ctzll(m)].st.requests_hit, 1, __ATOMIC_RELAXED);
        alive = still;
    }
    pthread_rwlock_unlock(&x->lock);
}

uint32_t baton_kvidx_match(baton_kvidx_t *x, const uint32_t *ids, uint32_t n, int n_sources,
                           uint32_t *l1, uint32_t *l2)
{
    uint32_t nb = n / x->block_size;
    if (n_sources > BATON_KVIDX_MAX_SOURCES)
        n_sources = BATON_KVIDX_MAX_SOURCES;
    uint64_t *keys = nb ? malloc((size_t)nb * sizeof(*keys)) : NULL;
    uint32_t a1[BATON_KVIDX_MAX_SOURCES], a2[BATON_KVIDX_MAX_SOURCES];
    memset(l1, 0, (size_t)n_sources * sizeof(*l1));
    memset(l2, 0, (size_t)n_sources * sizeof(*l2));
    if (nb && !keys)
        return nb; /* out of memory: nothing matched, still correct */
    baton_kvidx_chain(x->block_size, ids, n, keys);
    uint64_t srcs = n_sources == 64 ? ~0ull : (1ull << n_sources) - 1;
    baton_kvidx_match_keys(x, keys, nb, srcs, a1, a2);
    memcpy(l1, a1, (size_t)n_sources * sizeof(*l1));
    memcpy(l2, a2, (size_t)n_sources * sizeof(*l2));
    free(keys);
    return nb;
}

void baton_kvidx_source_stats(baton_kvidx_t *x, int src, baton_kvidx_source_stats_t *out)
{
    pthread_rwlock_rdlock(&x->lock);
    *out = x->src[src].st;
    pthread_rwlock_unlock(&x->lock);
}

void baton_kvidx_size(baton_kvidx_t *x, uint64_t *blocks, size_t *bytes)
{
    pthread_rwlock_rdlock(&x->lock);
    *blocks = x->count;
    size_t b = sizeof(*x) + x->cap * sizeof(slot_t);
    for (int s = 0; s < BATON_KVIDX_MAX_SOURCES; s++)
        b += x->src[s].by_engine.cap * (sizeof(uint64_t) + sizeof(void *));
    *bytes = b;
    pthread_rwlock_unlock(&x->lock);
}
