/* tier_l2.c — the L2 host page pool and the page object layout (see tier_l2.h). */
#include "worker/tier_l2.h"

#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/list.h"
#include "common/u64map.h"
#include "worker/kvpattern.h"

uint64_t wk_tier_page_bytes(const wk_kvshape_t *s)
{
    return (uint64_t)s->layers * s->page_tokens * wk_kvshape_token_bytes(s);
}

/* One layer of one page in the pattern's own layout (token after token) goes to or comes from
 * the two halves; `scratch` holds page_tokens × token_bytes. */
static void layer_bytes(uint8_t *scratch, const wk_kvshape_t *s, const int64_t *ids,
                        uint32_t first_pos, uint32_t layer)
{
    wk_kv_fill(scratch, wk_kvshape_token_bytes(s), ids, first_pos, s->page_tokens, layer);
}

void wk_tier_page_fill(uint8_t *dst, const wk_kvshape_t *s, const int64_t *ids, uint32_t first_pos)
{
    uint64_t tb = wk_kvshape_token_bytes(s), half = tb / 2;
    uint64_t half_obj = wk_tier_page_bytes(s) / 2;
    uint8_t *scratch = malloc(s->page_tokens * tb);
    if (scratch == NULL) {
        memset(dst, 0, wk_tier_page_bytes(s)); /* fails its check: never used */
        return;
    }
    for (uint32_t l = 0; l < s->layers; l++) {
        layer_bytes(scratch, s, ids, first_pos, l);
        for (uint32_t t = 0; t < s->page_tokens; t++) {
            uint64_t at = ((uint64_t)l * s->page_tokens + t) * half;
            memcpy(dst + at, scratch + t * tb, half);
            memcpy(dst + half_obj + at, scratch + t * tb + half, tb - half);
        }
    }
    free(scratch);
}

int wk_tier_page_check(const uint8_t *src, const wk_kvshape_t *s, const int64_t *ids,
                       uint32_t first_pos)
{
    uint64_t tb = wk_kvshape_token_bytes(s), half = tb / 2;
    uint64_t half_obj = wk_tier_page_bytes(s) / 2;
    uint8_t *scratch = malloc(s->page_tokens * tb);
    if (scratch == NULL)
        return -1;
    int bad = 0;
    for (uint32_t l = 0; l < s->layers && !bad; l++) {
        layer_bytes(scratch, s, ids, first_pos, l);
        for (uint32_t t = 0; t < s->page_tokens && !bad; t++) {
            uint64_t at = ((uint64_t)l * s->page_tokens + t) * half;
            bad = memcmp(src + at, scratch + t * tb, half) != 0 ||
                  memcmp(src + half_obj + at, scratch + t * tb + half, tb - half) != 0;
        }
    }
    free(scratch);
    return bad ? -1 : 0;
}

/* ---- the pool ---- */

enum { E_FREE = 0, E_FILLING, E_READY };

typedef struct {
    wk_tier_key_t key;
    uint64_t id; /* the key's first 16 hex digits: the map's key */
    baton_list_t lru;
    uint32_t pins;
    uint8_t state, dirty;
} entry_t;

struct wk_l2_s {
    uint8_t *mem;
    uint64_t page_bytes;
    uint32_t n;
    entry_t *e;
    uint32_t *free_stack, n_free;
    baton_list_t lru; /* READY entries, least recently used first */
    baton_u64map_t map;
    wk_l2_dirty_cb dirty_cb;
    void *ud;
    wk_l2_stats_t st;
};

static uint64_t key_id(const wk_tier_key_t *k)
{
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char c = k->hex[i];
        v = v << 4 | (uint64_t)(c >= 'a' ? c - 'a' + 10 : c - '0');
    }
    return v;
}

int wk_l2_create(wk_l2_t **l2_p, void *mem, uint64_t bytes, uint64_t page_bytes,
                 wk_l2_dirty_cb dirty_cb, void *ud)
{
    if (page_bytes == 0 || bytes / page_bytes == 0 || bytes / page_bytes > UINT32_MAX / 2)
        return BATON_EINVAL;
    wk_l2_t *l2 = calloc(1, sizeof(*l2));
    if (!l2)
        return BATON_ENOMEM;
    l2->n = (uint32_t)(bytes / page_bytes);
    l2->e = calloc(l2->n, sizeof(*l2->e));
    l2->free_stack = malloc(l2->n * sizeof(*l2->free_stack));
    if (!l2->e || !l2->free_stack) {
        free(l2->e);
        free(l2->free_stack);
        free(l2);
        return BATON_ENOMEM;
    }
    l2->mem = mem;
    l2->page_bytes = page_bytes;
    for (uint32_t i = 0; i < l2->n; i++) {
        l2->free_stack[i] = l2->n - 1 - i;
        baton_list_init(&l2->e[i].lru);
    }
    l2->n_free = l2->n;
    baton_list_init(&l2->lru);
    baton_u64map_init(&l2->map);
    l2->dirty_cb = dirty_cb;
    l2->ud = ud;
    l2->st.slots = l2->n;
    *l2_p = l2;
    return 0;
}

void wk_l2_destroy(wk_l2_t *l2)
{
    if (!l2)
        return;
    baton_u64map_free(&l2->map);
    free(l2->e);
    free(l2->free_stack);
    free(l2);
}

static entry_t *lookup(const wk_l2_t *l2, const wk_tier_key_t *key)
{
    void *v = baton_u64map_get(&l2->map, key_id(key));
    if (!v)
        return NULL;
    entry_t *e = &l2->e[(uintptr_t)v - 1];
    return memcmp(e->key.hex, key->hex, WK_TIER_KEY_HEX) == 0 ? e : NULL;
}

int32_t wk_l2_find(wk_l2_t *l2, const wk_tier_key_t *key)
{
    entry_t *e = lookup(l2, key);
    if (!e || e->state != E_READY)
        return -1;
    baton_list_remove(&e->lru);
    baton_list_push(&l2->lru, &e->lru);
    return (int32_t)(e - l2->e);
}

static void unmap(wk_l2_t *l2, entry_t *e)
{
    baton_u64map_del(&l2->map, e->id);
    baton_list_remove(&e->lru);
    baton_list_init(&e->lru);
    if (e->dirty)
        l2->st.dirty--;
    e->state = E_FREE;
    e->dirty = 0;
    e->pins = 0;
    l2->free_stack[l2->n_free++] = (uint32_t)(e - l2->e);
    l2->st.used--;
}

/* Frees the least recently used clean, unpinned entry. The first dirty one met on the way goes
 * to the callback (which pins it while it is written out, so it is clean for a later
 * eviction): one write-back per eviction, as a device evicting into a host writes back what it
 * evicts. 1 when a slot was freed. */
static int evict_one(wk_l2_t *l2)
{
    baton_list_t *l = l2->lru.next;
    int handed = 0;
    while (l != &l2->lru) {
        entry_t *e = container_of(l, entry_t, lru);
        l = l->next;
        if (e->pins)
            continue;
        if (e->dirty) {
            if (l2->dirty_cb && !handed) {
                handed = 1;
                e->pins++; /* the callback's; wk_l2_clean + unpin end it */
                l2->dirty_cb(l2->ud, l2, (int32_t)(e - l2->e), &e->key);
            }
            continue;
        }
        unmap(l2, e);
        l2->st.evictions++;
        return 1;
    }
    return 0;
}

int wk_l2_filling(const wk_l2_t *l2, const wk_tier_key_t *key)
{
    const entry_t *e = lookup(l2, key);
    return e && e->state == E_FILLING;
}

int32_t wk_l2_alloc(wk_l2_t *l2, const wk_tier_key_t *key)
{
    if (lookup(l2, key))
        return -1;
    if (l2->n_free == 0 && !evict_one(l2))
        return -2;
    uint32_t i = l2->free_stack[--l2->n_free];
    entry_t *e = &l2->e[i];
    e->key = *key;
    e->id = key_id(key);
    e->state = E_FILLING;
    e->pins = 1;
    e->dirty = 0;
    if (baton_u64map_put(&l2->map, e->id, (void *)(uintptr_t)(i + 1)) != 0) {
        e->state = E_FREE;
        l2->free_stack[l2->n_free++] = i;
        return -2;
    }
    l2->st.used++;
    return (int32_t)i;
}

void wk_l2_commit(wk_l2_t *l2, int32_t slot, int dirty)
{
    entry_t *e = &l2->e[slot];
    e->state = E_READY;
    e->dirty = dirty != 0;
    if (e->dirty)
        l2->st.dirty++;
    if (e->pins)
        e->pins--;
    baton_list_push(&l2->lru, &e->lru);
}

void wk_l2_drop(wk_l2_t *l2, int32_t slot)
{
    unmap(l2, &l2->e[slot]);
}

void wk_l2_pin(wk_l2_t *l2, int32_t slot)
{
    l2->e[slot].pins++;
}

void wk_l2_unpin(wk_l2_t *l2, int32_t slot)
{
    if (l2->e[slot].pins)
        l2->e[slot].pins--;
}

uint32_t wk_l2_pins(const wk_l2_t *l2, int32_t slot)
{
    return l2->e[slot].pins;
}

void wk_l2_clean(wk_l2_t *l2, int32_t slot)
{
    entry_t *e = &l2->e[slot];
    if (e->dirty) {
        e->dirty = 0;
        l2->st.dirty--;
    }
}

uint8_t *wk_l2_addr(const wk_l2_t *l2, int32_t slot)
{
    return l2->mem + (uint64_t)slot * l2->page_bytes;
}

const wk_tier_key_t *wk_l2_key(const wk_l2_t *l2, int32_t slot)
{
    return &l2->e[slot].key;
}

void wk_l2_stats(const wk_l2_t *l2, wk_l2_stats_t *st)
{
    *st = l2->st;
}
