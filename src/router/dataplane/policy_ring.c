/* policy_ring.c — building and searching the consistent-hash ring. */
#include "router/dataplane/policy_ring.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/hash.h"
#include "common/rand.h"

typedef struct point_s {
    uint64_t at;
    size_t idx;
} point_t;

struct baton_ring_s {
    point_t *pts;
    size_t n;
};

uint64_t baton_ring_hash(const void *data, size_t len)
{
    /* FNV-1a alone clusters similar ids on the circle; the mixer spreads them. */
    return baton_mix64(baton_fnv1a64_add(BATON_FNV1A64_INIT, data, len));
}

static int cmp_point(const void *a, const void *b)
{
    const point_t *x = a, *y = b;
    if (x->at != y->at)
        return x->at < y->at ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx; /* a tie is broken the same everywhere */
}

int baton_ring_build(baton_ring_t **ring_p, const char *const *ids, size_t n, unsigned vnodes)
{
    if (vnodes == 0)
        return BATON_EINVAL;
    baton_ring_t *r = calloc(1, sizeof(*r));
    if (!r || (n && !(r->pts = malloc(n * vnodes * sizeof(*r->pts))))) {
        free(r);
        return BATON_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        for (unsigned v = 0; v < vnodes; v++) {
            char buf[96];
            int len = snprintf(buf, sizeof(buf), "%s#%u", ids[i], v);
            r->pts[r->n].at = baton_ring_hash(buf, (size_t)len);
            r->pts[r->n].idx = i;
            r->n++;
        }
    }
    qsort(r->pts, r->n, sizeof(*r->pts), cmp_point);
    *ring_p = r;
    return 0;
}

void baton_ring_free(baton_ring_t *ring)
{
    if (ring) {
        free(ring->pts);
        free(ring);
    }
}

size_t baton_ring_lookup(const baton_ring_t *ring, uint64_t key)
{
    if (!ring || ring->n == 0)
        return SIZE_MAX;
    size_t lo = 0, hi = ring->n; /* first point with at >= key */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ring->pts[mid].at < key)
            lo = mid + 1;
        else
            hi = mid;
    }
    return ring->pts[lo == ring->n ? 0 : lo].idx;
}
