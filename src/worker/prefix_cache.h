/* prefix_cache.h — baton-worker's simulated prefix cache: a radix tree over page-aligned token
 * blocks, bounded in tokens, LRU eviction of unreferenced leaves (SGLang's radix cache, in
 * pages). Private to src/worker. */
#ifndef BATON_WORKER_PREFIX_CACHE_H
#define BATON_WORKER_PREFIX_CACHE_H

#include <stddef.h>
#include <stdint.h>

/*
 * Every node holds one full page of `page_tokens` token ids and hangs below the node of the
 * page before it (the root is the empty prefix), so a path from the root spells a prompt's
 * prefix page by page: a radix tree whose edges are pages. Children are found through one hash
 * table keyed by (parent, page contents); the page's ids are kept and compared, so a hash
 * collision never gives a false hit. Only whole pages are cached, as an engine that pages its
 * KV cache does.
 *
 * Capacity is in tokens (pages × page_tokens). Inserting past it evicts least-recently used
 * leaves that nobody holds; when every leaf is held, the rest of the insert is dropped (the
 * cache never grows past its capacity).
 *
 * Ref-counting: wk_pcache_match() holds the deepest matched node (and so, because only leaves
 * are evicted, the whole matched path) until wk_pcache_release(): the KV a prefill reads from
 * the cache cannot be evicted under it.
 *
 * It shares no core with the router's cache_aware tree (router/dataplane/policy_tree.h): that
 * one records hashed names of what was sent, approximately, evicting any name under a mutex;
 * this one is exact (page contents compared), ref-counted and leaf-evicting, on one thread. The
 * LRU list both use is common/list.h.
 *
 * Threading: none; the worker's loop thread owns the cache. Ownership: the cache owns its
 * nodes; a wk_pcache_hold_t is an opaque handle to give back exactly once.
 */

typedef struct wk_pcache_s wk_pcache_t;
typedef struct wk_pcache_node_s *wk_pcache_hold_t; /* NULL: nothing held */

typedef struct wk_pcache_stats_s {
    uint64_t capacity_tokens;
    uint64_t cached_tokens; /* pages in the tree × page_tokens */
    uint64_t nodes;
    uint64_t hit_tokens, miss_tokens; /* summed over wk_pcache_match() calls */
    uint64_t evicted_tokens, evictions;
    uint64_t held; /* nodes with a reference */
} wk_pcache_stats_t;

/* capacity_tokens 0 is a valid, always-empty cache; page_tokens >= 1. 0, BATON_EINVAL or
 * BATON_ENOMEM. */
int wk_pcache_create(wk_pcache_t **pc_p, uint64_t capacity_tokens, uint32_t page_tokens);
/* Every hold must have been released. NULL is ignored. */
void wk_pcache_destroy(wk_pcache_t *pc);

/*
 * How many leading tokens of ids[0..n) are cached: a multiple of page_tokens, and at most
 * n - 1 so at least one token is always computed (the first output token needs it, as in
 * SGLang). The matched pages become most recently used. When hold_p is not NULL the matched
 * path is held (see above) and *hold_p must be given to wk_pcache_release(); NULL when nothing
 * matched. Counts hit (returned) and miss (n - returned) tokens in the stats.
 */
uint32_t wk_pcache_match(wk_pcache_t *pc, const int64_t *ids, uint32_t n, wk_pcache_hold_t *hold_p);

/* Gives a hold back (NULL is ignored). */
void wk_pcache_release(wk_pcache_t *pc, wk_pcache_hold_t hold);

/* Caches every whole page of ids[0..n) (most recently used), evicting as needed. Returns the
 * tokens now cached along this path (a multiple of page_tokens, maybe less than asked when the
 * capacity is held by others). 0 or BATON_ENOMEM never: allocation failures just stop it. */
uint32_t wk_pcache_insert(wk_pcache_t *pc, const int64_t *ids, uint32_t n);

void wk_pcache_stats(const wk_pcache_t *pc, wk_pcache_stats_t *st);

/* One page as the cache's observer sees it: its hash (stable: a chain over the page contents
 * from the root, the same in every process), its parent's (none for a first page) and its ids. */
typedef struct {
    uint64_t hash;
    int has_parent;
    uint64_t parent_hash;
    const int64_t *ids;
    uint32_t n;
} wk_pcache_block_t;

/* A page's event hash: the chain above, from its parent's (has_parent 0: the root) over its n
 * ids; what the KV events name the page with, here and in the L3 puts' block info (tier.c). */
uint64_t wk_pcache_block_hash(int has_parent, uint64_t parent_hash, const int64_t *ids, uint32_t n);

/* Called once per page cached (stored 1) and per page evicted (stored 0), synchronously; not at
 * wk_pcache_destroy. The KV-event publisher (kvev.h) is the one observer. */
typedef void (*wk_pcache_observer_t)(void *ud, int stored, const wk_pcache_block_t *b);
void wk_pcache_observe(wk_pcache_t *pc, wk_pcache_observer_t cb, void *ud);

#endif
