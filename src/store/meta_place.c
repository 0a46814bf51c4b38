/* store/meta_place.c — nodes and their segments: each segment's free extents (first fit,
 * coalesced), and the placement of a new object's replicas and stripes by free space. */
#include <stdlib.h>
#include <string.h>

#include "common/rand.h"
#include "store/meta_int.h"

static uint64_t align_up(uint64_t v)
{
    return (v + BATON__META_ALIGN - 1) & ~(uint64_t)(BATON__META_ALIGN - 1);
}

/* ---- nodes and segments ------------------------------------------------------------------- */

int baton__meta_node_add(baton__meta_t *m, const char *node_id, uint32_t *node_p)
{
    if (node_id == NULL || node_id[0] == '\0' || strlen(node_id) > 255)
        return BATON_XFER_EINVAL;
    for (size_t i = 0; i < m->n_nodes; i++)
        if (strcmp(m->nodes[i].id, node_id) == 0) {
            m->nodes[i].alive = 1;
            *node_p = (uint32_t)i;
            return 0;
        }
    baton__node_t *nodes = realloc(m->nodes, (m->n_nodes + 1) * sizeof(*nodes));
    if (nodes == NULL)
        return BATON_XFER_ENOMEM;
    m->nodes = nodes;
    nodes[m->n_nodes].id = strdup(node_id);
    if (nodes[m->n_nodes].id == NULL)
        return BATON_XFER_ENOMEM;
    nodes[m->n_nodes].alive = 1;
    *node_p = (uint32_t)m->n_nodes++;
    return 0;
}

const char *baton__meta_node_id(const baton__meta_t *m, uint32_t node)
{
    return node < m->n_nodes ? m->nodes[node].id : NULL;
}

int baton__meta_segment_add(baton__meta_t *m, uint32_t node, uint64_t bytes, uint32_t *seg_p)
{
    bytes &= ~(uint64_t)(BATON__META_ALIGN - 1);
    if (node >= m->n_nodes || !m->nodes[node].alive || bytes == 0)
        return BATON_XFER_EINVAL;
    baton__seg_t *segs = realloc(m->segs, (m->n_segs + 1) * sizeof(*segs));
    if (segs == NULL)
        return BATON_XFER_ENOMEM;
    m->segs = segs;
    baton__seg_t *s = &segs[m->n_segs];
    memset(s, 0, sizeof(*s));
    s->free = malloc(4 * sizeof(*s->free));
    if (s->free == NULL)
        return BATON_XFER_ENOMEM;
    s->cap_free = 4;
    s->free[0] = (baton__extent_t){0, bytes};
    s->n_free = 1;
    s->node = node;
    s->alive = 1;
    s->capacity = bytes;
    m->capacity += bytes;
    *seg_p = (uint32_t)m->n_segs++;
    return 0;
}

uint64_t baton__meta_segment_free(const baton__meta_t *m, uint32_t seg)
{
    if (seg >= m->n_segs || !m->segs[seg].alive)
        return 0;
    return m->segs[seg].capacity - m->segs[seg].used;
}

uint64_t baton__meta_segment_capacity(const baton__meta_t *m, uint32_t seg)
{
    return seg < m->n_segs && m->segs[seg].alive ? m->segs[seg].capacity : 0;
}

int baton__seg_alloc(baton__seg_t *s, uint64_t len, uint64_t *off_p)
{
    len = align_up(len);
    for (size_t i = 0; i < s->n_free; i++) {
        baton__extent_t *e = &s->free[i];
        if (e->len < len)
            continue;
        *off_p = e->off;
        e->off += len;
        e->len -= len;
        if (e->len == 0) {
            memmove(e, e + 1, (s->n_free - i - 1) * sizeof(*e));
            s->n_free--;
        }
        s->used += len;
        return 0;
    }
    return BATON_STORE_ENOSPACE;
}

int baton__seg_reserve(baton__seg_t *s, uint64_t off, uint64_t len)
{
    len = align_up(len);
    if (off % BATON__META_ALIGN != 0 || len == 0 || off > s->capacity || len > s->capacity - off)
        return BATON_XFER_EINVAL;
    for (size_t i = 0; i < s->n_free; i++) {
        baton__extent_t *e = &s->free[i];
        if (off < e->off || off + len > e->off + e->len)
            continue;
        uint64_t tail_off = off + len, tail_len = e->off + e->len - tail_off;
        if (off > e->off && tail_len > 0) { /* split in two */
            if (s->n_free == s->cap_free) {
                baton__extent_t *f = realloc(s->free, s->cap_free * 2 * sizeof(*f));
                if (f == NULL)
                    return BATON_XFER_ENOMEM;
                s->free = f;
                s->cap_free *= 2;
                e = &s->free[i];
            }
            memmove(e + 2, e + 1, (s->n_free - i - 1) * sizeof(*e));
            s->n_free++;
            e->len = off - e->off;
            e[1] = (baton__extent_t){tail_off, tail_len};
        } else if (off > e->off) {
            e->len = off - e->off;
        } else if (tail_len > 0) {
            e->off = tail_off;
            e->len = tail_len;
        } else {
            memmove(e, e + 1, (s->n_free - i - 1) * sizeof(*e));
            s->n_free--;
        }
        s->used += len;
        return 0;
    }
    return BATON_XFER_EEXIST;
}

void baton__seg_free(baton__seg_t *s, uint64_t off, uint64_t len)
{
    len = align_up(len);
    size_t i = 0; /* first extent after off */
    size_t lo = 0, hi = s->n_free;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (s->free[mid].off < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    i = lo;
    s->used -= len < s->used ? len : s->used;
    int merge_prev = i > 0 && s->free[i - 1].off + s->free[i - 1].len == off;
    int merge_next = i < s->n_free && off + len == s->free[i].off;
    if (merge_prev && merge_next) {
        s->free[i - 1].len += len + s->free[i].len;
        memmove(&s->free[i], &s->free[i + 1], (s->n_free - i - 1) * sizeof(*s->free));
        s->n_free--;
    } else if (merge_prev) {
        s->free[i - 1].len += len;
    } else if (merge_next) {
        s->free[i].off = off;
        s->free[i].len += len;
    } else {
        if (s->n_free == s->cap_free) {
            size_t cap = s->cap_free * 2;
            baton__extent_t *f = realloc(s->free, cap * sizeof(*f));
            if (f == NULL)
                return; /* the range is lost to this segment until restart; never reused twice */
            s->free = f;
            s->cap_free = cap;
        }
        memmove(&s->free[i + 1], &s->free[i], (s->n_free - i) * sizeof(*s->free));
        s->free[i] = (baton__extent_t){off, len};
        s->n_free++;
    }
}

void baton__meta_release_space(baton__meta_t *m, baton__mobj_t *o)
{
    size_t n = (size_t)o->n_replicas * o->n_slices;
    for (size_t i = 0; i < n; i++) {
        if (o->slices[i].node == BATON__SLICE_LOST) /* its segment is gone with its node */
            continue;
        baton__seg_t *s = &m->segs[o->slices[i].seg];
        if (!s->alive)
            continue;
        baton__seg_free(s, o->slices[i].off, o->slices[i].len);
        m->used -= align_up(o->slices[i].len);
    }
}

/* ---- placement ------------------------------------------------------------------------------ */

/*
 * Placement by free space, with a cap. Each slice goes to a segment drawn at random with weight
 * min(free, 2 x the mean free of live segments): fuller segments get fewer writes, but a node
 * that joins empty gets at most about twice an average node's share, not every write (an empty
 * node attracting every put turns it into the one hot spot for the data just written, and read
 * soon after). Replicas of one slice never share a segment and, when the tier allows, never a
 * node; the slices of one replica prefer distinct segments (striping spreads bandwidth).
 *
 * Tiers, tried in order until one has a candidate with room:
 *   0: a node no other replica of this slice uses, a segment this replica does not use yet
 *   1: a node no other replica of this slice uses
 *   2: a segment no other replica of this slice uses (hard rule)
 */
typedef struct {
    const baton__slice_t *slices; /* placed so far, replica-major */
    uint32_t n_slices, r, s;
} place_ctx_t;

static int tier_ok(const baton__meta_t *m, const place_ctx_t *c, uint32_t seg, int tier)
{
    const baton__seg_t *sg = &m->segs[seg];
    for (uint32_t r = 0; r < c->r; r++) {
        const baton__slice_t *x = &c->slices[(size_t)r * c->n_slices + c->s];
        if (x->seg == seg)
            return 0;
        if (tier <= 1 && x->node == sg->node)
            return 0;
    }
    if (tier == 0)
        for (uint32_t s = 0; s < c->s; s++)
            if (c->slices[(size_t)c->r * c->n_slices + s].seg == seg)
                return 0;
    return 1;
}

static int pick_segment(baton__meta_t *m, const place_ctx_t *c, uint64_t len, uint32_t *seg_p,
                        uint64_t *off_p)
{
    uint64_t total_free = 0, n_live = 0;
    for (size_t i = 0; i < m->n_segs; i++)
        if (m->segs[i].alive) {
            total_free += m->segs[i].capacity - m->segs[i].used;
            n_live++;
        }
    if (n_live == 0)
        return BATON_STORE_ENOSPACE;
    uint64_t cap = 2 * (total_free / n_live) + 1;
    uint8_t tried[256];
    memset(tried, 0, sizeof(tried));
    for (int tier = 0; tier <= 2; tier++) {
        for (;;) {
            uint64_t sum = 0;
            for (size_t i = 0; i < m->n_segs; i++) {
                const baton__seg_t *s = &m->segs[i];
                uint64_t f = s->capacity - s->used;
                if (!s->alive || f < align_up(len) || (i < 256 && tried[i]) ||
                    !tier_ok(m, c, (uint32_t)i, tier))
                    continue;
                sum += f < cap ? f : cap;
            }
            if (sum == 0)
                break;
            uint64_t x = baton_xoshiro_next(m->rng) % sum;
            size_t pick = 0;
            for (size_t i = 0; i < m->n_segs; i++) {
                const baton__seg_t *s = &m->segs[i];
                uint64_t f = s->capacity - s->used;
                if (!s->alive || f < align_up(len) || (i < 256 && tried[i]) ||
                    !tier_ok(m, c, (uint32_t)i, tier))
                    continue;
                uint64_t w = f < cap ? f : cap;
                if (x < w) {
                    pick = i;
                    break;
                }
                x -= w;
            }
            if (baton__seg_alloc(&m->segs[pick], len, off_p) == 0) {
                *seg_p = (uint32_t)pick;
                return 0;
            }
            if (pick >= 256) /* fragmented beyond the tried set: give up this tier */
                break;
            tried[pick] = 1; /* fragmented: free bytes, but no extent long enough */
        }
    }
    return BATON_STORE_ENOSPACE;
}

int baton__meta_place(baton__meta_t *m, baton__mobj_t *o, uint32_t replicas)
{
    uint64_t live = 0;
    for (size_t i = 0; i < m->n_segs; i++)
        live += m->segs[i].alive ? 1 : 0;
    uint64_t k = (o->len + m->cfg.stripe_bytes - 1) / m->cfg.stripe_bytes;
    if (k > m->cfg.max_slices)
        k = m->cfg.max_slices;
    if (k > live)
        k = live ? live : 1;
    uint64_t base = align_up((o->len + k - 1) / k);
    while (k > 1 && base * (k - 1) >= o->len)
        k--;
    baton__slice_t *sl = calloc((size_t)replicas * k, sizeof(*sl));
    if (sl == NULL)
        return BATON_XFER_ENOMEM;
    place_ctx_t c = {sl, (uint32_t)k, 0, 0};
    uint32_t placed = 0;
    for (uint32_t r = 0; r < replicas; r++) {
        c.r = r;
        uint32_t s;
        for (s = 0; s < k; s++) {
            c.s = s;
            baton__slice_t *x = &sl[(size_t)r * k + s];
            x->len = s + 1 < k ? base : o->len - base * (k - 1);
            if (pick_segment(m, &c, x->len, &x->seg, &x->off) != 0)
                break;
            x->node = m->segs[x->seg].node;
            m->used += align_up(x->len);
            o->held_bytes += align_up(x->len);
        }
        if (s < k) { /* this replica does not fit: give back its slices, stop here */
            for (uint32_t j = 0; j < s; j++) {
                baton__slice_t *x = &sl[(size_t)r * k + j];
                baton__seg_free(&m->segs[x->seg], x->off, x->len);
                m->used -= align_up(x->len);
                o->held_bytes -= align_up(x->len);
            }
            break;
        }
        placed++;
    }
    if (placed == 0) {
        free(sl);
        return BATON_STORE_ENOSPACE;
    }
    o->slices = sl;
    o->n_slices = (uint32_t)k;
    o->n_replicas = placed;
    return 0;
}
