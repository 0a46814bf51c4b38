/* store/client_cache.c — the store client's location cache: where an object it got or found lies,
 * kept with the lease that pins it there, so that a get within the lease reads straight from the
 * nodes without asking the master again. The client's thread fills it; in own-progress mode the
 * host's threads read it too (inline gets on the calling thread), hence the lock. */
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "store/client_int.h"

struct loc_s {
    char key[BATON_STORE_KEY_MAX + 1];
    uint64_t len;
    uint32_t crc;
    uint64_t lease_start_ms, lease_ms;
    uint64_t epoch; /* the master connection that granted the lease */
    uint32_t n_replicas, n_slices, n_nodes;
    baton__slice_t *slices;
    baton__sp_node_t *nodes;
};

static void loc_free(loc_t *e)
{
    if (e) {
        free(e->slices);
        free(e->nodes);
        free(e);
    }
}

int baton__loc_init(baton_store_client_t *cl, uint32_t entries)
{
    if (entries == 0)
        return 0;
    uint32_t n = 1;
    while (n < entries && n < (1u << 20))
        n <<= 1;
    cl->locs = calloc(n, sizeof(*cl->locs));
    if (cl->locs == NULL)
        return BATON_XFER_ENOMEM;
    cl->n_locs = n;
    return 0;
}

void baton__loc_free(baton_store_client_t *cl)
{
    for (uint32_t i = 0; i < cl->n_locs; i++)
        loc_free(cl->locs[i]);
    free(cl->locs);
    cl->locs = NULL;
    cl->n_locs = 0;
}

/* One slot per hash (direct mapped): a newer object simply replaces an older one. */
static loc_t **slot(baton_store_client_t *cl, const char *key)
{
    return &cl->locs[baton_fnv1a64_add_str(BATON_FNV1A64_INIT, key) & (cl->n_locs - 1)];
}

void baton__loc_drop(baton_store_client_t *cl, const char *key)
{
    if (cl->n_locs == 0)
        return;
    loc_t *gone = NULL;
    uv_mutex_lock(&cl->loc_lock);
    loc_t **s = slot(cl, key);
    if (*s && strcmp((*s)->key, key) == 0) {
        gone = *s;
        *s = NULL;
    }
    uv_mutex_unlock(&cl->loc_lock);
    loc_free(gone);
}

void baton__loc_put(baton_store_client_t *cl, const op_t *op, const oobj_t *o)
{
    uint64_t epoch = atomic_load(&cl->master_epoch);
    if (cl->n_locs == 0 || epoch == 0 || o->lease_ms == 0 || o->slices == NULL)
        return;
    size_t n = (size_t)o->n_replicas * o->n_slices;
    loc_t *e = calloc(1, sizeof(*e));
    if (e == NULL || (e->slices = malloc(n * sizeof(*e->slices))) == NULL ||
        (e->nodes = malloc(n * sizeof(*e->nodes))) == NULL) {
        loc_free(e);
        return;
    }
    memcpy(e->key, o->key, sizeof(e->key));
    e->len = o->obj_len;
    e->crc = o->crc;
    e->lease_start_ms = o->lease_start_ms;
    e->lease_ms = o->lease_ms;
    e->epoch = epoch;
    e->n_replicas = o->n_replicas;
    e->n_slices = o->n_slices;
    memcpy(e->slices, o->slices, n * sizeof(*e->slices));
    for (size_t i = 0; i < n; i++) {
        const baton__sp_node_t *nd = baton__op_node(op, o, o->slices[i].node);
        uint32_t k = 0;
        while (k < e->n_nodes && e->nodes[k].node != o->slices[i].node)
            k++;
        if (nd == NULL) {
            loc_free(e);
            return;
        }
        if (k == e->n_nodes)
            e->nodes[e->n_nodes++] = *nd;
    }
    uv_mutex_lock(&cl->loc_lock);
    loc_t **s = slot(cl, o->key), *old = *s;
    *s = e;
    uv_mutex_unlock(&cl->loc_lock);
    loc_free(old);
}

static int take(baton_store_client_t *cl, oobj_t *o, uint64_t now_ms);

int baton__loc_take(baton_store_client_t *cl, oobj_t *o, uint64_t now_ms)
{
    if (cl->n_locs == 0)
        return -1;
    uv_mutex_lock(&cl->loc_lock);
    int rc = take(cl, o, now_ms);
    uv_mutex_unlock(&cl->loc_lock);
    return rc;
}

static int take(baton_store_client_t *cl, oobj_t *o, uint64_t now_ms)
{
    const loc_t *e = *slot(cl, o->key);
    if (e == NULL || strcmp(e->key, o->key) != 0)
        return -1;
    /* Only while the lease outlives this read by far: a read that ends after it fails
     * (BATON_STORE_ELEASE), and the slowest read allowed takes the request time-out. */
    uint64_t margin = cl->timeout_ms > e->lease_ms / 2 ? cl->timeout_ms : e->lease_ms / 2;
    if (e->epoch != atomic_load(&cl->master_epoch) ||
        now_ms + margin >= e->lease_start_ms + e->lease_ms || e->len > o->len)
        return -1;
    size_t n = (size_t)e->n_replicas * e->n_slices;
    o->slices = malloc(n * sizeof(*o->slices));
    o->slice_try = calloc(e->n_slices, sizeof(*o->slice_try));
    o->nodes = malloc(e->n_nodes * sizeof(*o->nodes));
    if (o->slices == NULL || o->slice_try == NULL || o->nodes == NULL) {
        baton__obj_reset(o);
        return -1;
    }
    memcpy(o->slices, e->slices, n * sizeof(*o->slices));
    memcpy(o->nodes, e->nodes, e->n_nodes * sizeof(*o->nodes));
    o->n_nodes = e->n_nodes;
    o->n_replicas = e->n_replicas;
    o->n_slices = e->n_slices;
    o->obj_len = e->len;
    o->crc = e->crc;
    o->lease_ms = (uint32_t)e->lease_ms;
    o->lease_start_ms = e->lease_start_ms;
    return 0;
}
