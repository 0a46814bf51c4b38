/* tier_l2.h — HiCache's L2: a host-memory pool of whole pages (every layer, K and V halves),
 * found by page key, LRU-evicted, pinned while a fetch, check or store write uses a page; and the
 * page layout those pages and the store's objects share. */
#ifndef BATON_WORKER_TIER_L2_H
#define BATON_WORKER_TIER_L2_H

#include <stdint.h>

#include "worker/kvshape.h"
#include "worker/tier_key.h"

/*
 * Page object layout (SGLang's page_first host layout, MHA): the K half, then the V half; each
 * half is [layer][token][token_bytes / 2], the token's first half of its KV bytes (kvpattern.h)
 * in K, the second in V. So one page is two contiguous objects, "..._k" and "..._v", each
 * readable or writable by the store in place (zero copy).
 */
uint64_t wk_tier_page_bytes(const wk_kvshape_t *s);
/* Writes the page holding tokens ids[0..page_tokens) at prompt positions first_pos... */
void wk_tier_page_fill(uint8_t *dst, const wk_kvshape_t *s, const int64_t *ids, uint32_t first_pos);
/* 0 when every byte is what wk_tier_page_fill writes, else -1. */
int wk_tier_page_check(const uint8_t *src, const wk_kvshape_t *s, const int64_t *ids,
                       uint32_t first_pos);

/*
 * The pool: `bytes / page_bytes` slots over caller memory. An entry is FILLING from
 * wk_l2_alloc until wk_l2_commit (or wk_l2_drop), then READY. Entries are evicted least recently
 * used first, never while pinned or FILLING; a dirty entry (write_back: not in L3 yet) is handed
 * to the evict callback instead, which pins it while writing it out and calls wk_l2_clean after.
 * Single-threaded (the worker's loop).
 */
typedef struct wk_l2_s wk_l2_t;
typedef void (*wk_l2_dirty_cb)(void *ud, wk_l2_t *l2, int32_t slot, const wk_tier_key_t *key);

typedef struct {
    uint64_t slots, used, evictions, dirty;
} wk_l2_stats_t;

/* 0, BATON_EINVAL (no whole slot) or BATON_ENOMEM. */
int wk_l2_create(wk_l2_t **l2_p, void *mem, uint64_t bytes, uint64_t page_bytes,
                 wk_l2_dirty_cb dirty_cb, void *ud);
void wk_l2_destroy(wk_l2_t *l2);

/* A READY entry's slot (now most recently used), or -1. */
int32_t wk_l2_find(wk_l2_t *l2, const wk_tier_key_t *key);
/* Whether `key` is FILLING (a copy of it on its way into L2). */
int wk_l2_filling(const wk_l2_t *l2, const wk_tier_key_t *key);
/* A slot for `key`, FILLING and pinned once; -1 when the key is already there (FILLING or
 * READY), -2 when every slot is pinned, filling or dirty. */
int32_t wk_l2_alloc(wk_l2_t *l2, const wk_tier_key_t *key);
/* The fill is complete: READY, unpinned once; dirty: not yet in L3. */
void wk_l2_commit(wk_l2_t *l2, int32_t slot, int dirty);
/* The fill failed, or the page is bad: the entry goes (it must be pinned only by the caller). */
void wk_l2_drop(wk_l2_t *l2, int32_t slot);
void wk_l2_pin(wk_l2_t *l2, int32_t slot);
void wk_l2_unpin(wk_l2_t *l2, int32_t slot);
uint32_t wk_l2_pins(const wk_l2_t *l2, int32_t slot);
/* A dirty entry is in L3 now (or will never be: it stays clean either way). */
void wk_l2_clean(wk_l2_t *l2, int32_t slot);
uint8_t *wk_l2_addr(const wk_l2_t *l2, int32_t slot);
const wk_tier_key_t *wk_l2_key(const wk_l2_t *l2, int32_t slot);
void wk_l2_stats(const wk_l2_t *l2, wk_l2_stats_t *st);

#endif
