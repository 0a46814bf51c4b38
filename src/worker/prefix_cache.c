/* prefix_cache.c — the worker's page-granular radix cache: match, insert, LRU eviction of
 * unheld leaves, holds. */
#include "worker/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/list.h"
#include "common/rand.h"

typedef struct wk_pcache_node_s {
    struct wk_pcache_node_s *parent; /* NULL: a child of the root */
    struct wk_pcache_node_s *hnext;  /* hash chain */
    baton_list_t lru;                /* in pc->lru, least recently used first */
    uint64_t hash;
    uint64_t ev_hash; /* the block's published hash: a chain over the pages from the root */
    uint32_t children;
    uint32_t refs;
    int64_t ids[]; /* page_tokens ids */
} node_t;

struct wk_pcache_s {
    uint64_t capacity_pages;
    uint32_t page_tokens;
    node_t **table;
    size_t n_buckets; /* a power of two */
    baton_list_t lru;
    wk_pcache_stats_t st;
    wk_pcache_observer_t obs;
    void *obs_ud;
};

void wk_pcache_observe(wk_pcache_t *pc, wk_pcache_observer_t cb, void *ud)
{
    pc->obs = cb;
    pc->obs_ud = ud;
}

static void notify(wk_pcache_t *pc, int stored, const node_t *v)
{
    if (!pc->obs)
        return;
    wk_pcache_block_t b = {.hash = v->ev_hash, .has_parent = v->parent != NULL,
                           .parent_hash = v->parent ? v->parent->ev_hash : 0, .ids = v->ids,
                           .n = pc->page_tokens};
    pc->obs(pc->obs_ud, stored, &b);
}

static uint64_t page_hash(const node_t *parent, const int64_t *ids, uint32_t n)
{
    uint64_t h = baton_mix64((uint64_t)(uintptr_t)parent ^ BATON_GOLDEN_GAMMA);
    for (uint32_t i = 0; i < n; i++)
        h = baton_mix64(h ^ (uint64_t)ids[i]);
    return h;
}

int wk_pcache_create(wk_pcache_t **pc_p, uint64_t capacity_tokens, uint32_t page_tokens)
{
    if (page_tokens == 0)
        return BATON_EINVAL;
    wk_pcache_t *pc = calloc(1, sizeof(*pc));
    if (!pc)
        return BATON_ENOMEM;
    pc->page_tokens = page_tokens;
    pc->capacity_pages = capacity_tokens / page_tokens;
    pc->n_buckets = 64;
    pc->table = calloc(pc->n_buckets, sizeof(*pc->table));
    if (!pc->table) {
        free(pc);
        return BATON_ENOMEM;
    }
    baton_list_init(&pc->lru);
    pc->st.capacity_tokens = pc->capacity_pages * page_tokens;
    *pc_p = pc;
    return 0;
}

static void free_all(wk_pcache_t *pc)
{
    for (size_t b = 0; b < pc->n_buckets; b++) {
        node_t *n = pc->table[b];
        while (n) {
            node_t *next = n->hnext;
            free(n);
            n = next;
        }
        pc->table[b] = NULL;
    }
    baton_list_init(&pc->lru);
}

void wk_pcache_destroy(wk_pcache_t *pc)
{
    if (!pc)
        return;
    free_all(pc);
    free(pc->table);
    free(pc);
}

static node_t *find(const wk_pcache_t *pc, const node_t *parent, const int64_t *ids)
{
    uint64_t h = page_hash(parent, ids, pc->page_tokens);
    for (node_t *n = pc->table[h & (pc->n_buckets - 1)]; n; n = n->hnext)
        if (n->hash == h && n->parent == parent &&
            memcmp(n->ids, ids, pc->page_tokens * sizeof(*ids)) == 0)
            return n;
    return NULL;
}

static void touch(wk_pcache_t *pc, node_t *n)
{
    baton_list_remove(&n->lru);
    baton_list_push(&pc->lru, &n->lru);
}

uint32_t wk_pcache_match(wk_pcache_t *pc, const int64_t *ids, uint32_t n, wk_pcache_hold_t *hold_p)
{
    node_t *at = NULL;
    uint32_t got = 0, P = pc->page_tokens;
    /* at most n - 1 tokens: the last prompt token is always computed */
    while (n > 0 && got + P <= n - 1) {
        node_t *c = find(pc, at, ids + got);
        if (!c)
            break;
        touch(pc, c);
        at = c;
        got += P;
    }
    if (hold_p) {
        *hold_p = at;
        if (at) {
            if (at->refs++ == 0)
                pc->st.held++;
        }
    }
    pc->st.hit_tokens += got;
    pc->st.miss_tokens += n - got;
    return got;
}

void wk_pcache_release(wk_pcache_t *pc, wk_pcache_hold_t hold)
{
    if (hold && --hold->refs == 0)
        pc->st.held--;
}

static void unlink_node(wk_pcache_t *pc, node_t *v)
{
    node_t **pp = &pc->table[v->hash & (pc->n_buckets - 1)];
    while (*pp != v)
        pp = &(*pp)->hnext;
    *pp = v->hnext;
    baton_list_remove(&v->lru);
    if (v->parent)
        v->parent->children--;
    pc->st.nodes--;
    pc->st.cached_tokens -= pc->page_tokens;
    free(v);
}

/* Evicts the least recently used unheld leaf that is not `keep` (the path being inserted).
 * 1 when one went. */
static int evict_one(wk_pcache_t *pc, const node_t *keep)
{
    for (baton_list_t *l = pc->lru.next; l != &pc->lru; l = l->next) {
        node_t *v = container_of(l, node_t, lru);
        if (v->children == 0 && v->refs == 0 && v != keep) {
            notify(pc, 0, v);
            unlink_node(pc, v);
            pc->st.evictions++;
            pc->st.evicted_tokens += pc->page_tokens;
            return 1;
        }
    }
    return 0;
}

static void grow(wk_pcache_t *pc)
{
    size_t nb = pc->n_buckets * 2;
    node_t **t = calloc(nb, sizeof(*t));
    if (!t)
        return; /* longer chains, still correct */
    for (size_t b = 0; b < pc->n_buckets; b++) {
        node_t *n = pc->table[b];
        while (n) {
            node_t *next = n->hnext;
            n->hnext = t[n->hash & (nb - 1)];
            t[n->hash & (nb - 1)] = n;
            n = next;
        }
    }
    free(pc->table);
    pc->table = t;
    pc->n_buckets = nb;
}

uint32_t wk_pcache_insert(wk_pcache_t *pc, const int64_t *ids, uint32_t n)
{
    node_t *at = NULL;
    uint32_t got = 0, P = pc->page_tokens;
    while (got + P <= n) {
        node_t *c = find(pc, at, ids + got);
        if (!c) {
            if (pc->capacity_pages == 0)
                break;
            /* The path so far is protected from eviction by `at` having a child on the way:
             * only `at` itself (a leaf until the new child hangs below it) needs sparing. */
            while (pc->st.nodes >= pc->capacity_pages && evict_one(pc, at))
                ;
            if (pc->st.nodes >= pc->capacity_pages)
                break;
            c = malloc(sizeof(*c) + P * sizeof(int64_t));
            if (!c)
                break;
            memcpy(c->ids, ids + got, P * sizeof(int64_t));
            c->parent = at;
            c->children = 0;
            c->refs = 0;
            c->hash = page_hash(at, c->ids, P);
            /* Stable across runs and processes (page_hash mixes in the parent's address). */
            c->ev_hash = wk_pcache_block_hash(at != NULL, at ? at->ev_hash : 0, c->ids, P);
            c->hnext = pc->table[c->hash & (pc->n_buckets - 1)];
            pc->table[c->hash & (pc->n_buckets - 1)] = c;
            baton_list_init(&c->lru);
            baton_list_push(&pc->lru, &c->lru);
            if (at)
                at->children++;
            pc->st.nodes++;
            pc->st.cached_tokens += P;
            if (pc->st.nodes > pc->n_buckets)
                grow(pc);
            notify(pc, 1, c);
        } else {
            touch(pc, c);
        }
        at = c;
        got += P;
    }
    return got;
}

void wk_pcache_stats(const wk_pcache_t *pc, wk_pcache_stats_t *st)
{
    *st = pc->st;
}

uint64_t wk_pcache_block_hash(int has_parent, uint64_t parent_hash, const int64_t *ids, uint32_t n)
{
    uint64_t h = baton_mix64((has_parent ? parent_hash : BATON_GOLDEN_GAMMA) ^ n);
    for (uint32_t i = 0; i < n; i++)
        h = baton_mix64(h ^ (uint64_t)ids[i]);
    return h;
}
