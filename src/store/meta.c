/* store/meta.c — the master's object table: the objects' one state machine (its table and the
 * only function that moves an object), put / commit / revoke / takeover, get and exists with
 * their leases, remove, node loss and the periodic reclaim. */
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "common/log.h"
#include "common/rand.h"
#include "store/meta_int.h"

/* ---- the state machine -------------------------------------------------------------------- */

#define S(x) (1u << BATON__OBJ_##x)
static const unsigned state_next[BATON__OBJ_COUNT] = {
    [BATON__OBJ_PUTTING] = S(COMPLETE) | S(REVOKED) | S(FREED),
    [BATON__OBJ_COMPLETE] = S(FREED),
    [BATON__OBJ_REVOKED] = S(FREED),
    [BATON__OBJ_FREED] = 0,
};
#undef S

static const char *const state_names[BATON__OBJ_COUNT] = {"putting", "complete", "revoked",
                                                          "freed"};

int baton__meta_state_allowed(baton__obj_state_t from, baton__obj_state_t to)
{
    if ((unsigned)from >= BATON__OBJ_COUNT || (unsigned)to >= BATON__OBJ_COUNT)
        return 0;
    return (state_next[from] >> to) & 1u;
}

const char *baton__meta_state_name(baton__obj_state_t s)
{
    return (unsigned)s < BATON__OBJ_COUNT ? state_names[s] : "invalid";
}

void baton__olist_remove(baton__olist_t *l, baton__mobj_t *o)
{
    if (o->prev)
        o->prev->next = o->next;
    else
        l->head = o->next;
    if (o->next)
        o->next->prev = o->prev;
    else
        l->tail = o->prev;
    o->prev = o->next = NULL;
    o->list = NULL;
    l->n--;
}

void baton__olist_push(baton__olist_t *l, baton__mobj_t *o)
{
    o->next = NULL;
    o->prev = l->tail;
    if (l->tail)
        l->tail->next = o;
    else
        l->head = o;
    l->tail = o;
    o->list = l;
    l->n++;
}

static void hash_unlink(baton__meta_t *m, baton__mobj_t *o)
{
    baton__mobj_t **pp = &m->buckets[o->hash & (m->n_buckets - 1)];
    while (*pp && *pp != o)
        pp = &(*pp)->hnext;
    if (*pp) {
        *pp = o->hnext;
        o->hnext = NULL;
        m->n_keyed--;
    }
}

static void ns_charge(baton__meta_t *m, baton__mobj_t *o, int sign)
{
    baton__ns_t *ns = &m->nss[o->ns];
    if (sign > 0)
        ns->used += o->held_bytes;
    else
        ns->used -= o->held_bytes < ns->used ? o->held_bytes : ns->used;
}

/* Tells the journal about o, now in state `state`. */
static void journal(baton__meta_t *m, const baton__mobj_t *o, baton__obj_state_t state)
{
    if (m->cfg.journal == NULL)
        return;
    baton__meta_rec_t rec = {o->put_id,
                             state,
                             m->nss[o->ns].name,
                             o->key,
                             o->len,
                             o->crc,
                             o->soft_pin ? BATON_STORE_PUT_SOFT_PIN : 0,
                             o->n_replicas,
                             o->n_slices,
                             o->slices};
    m->cfg.journal(m->cfg.journal_data, &rec);
}

/*
 * The only place an object's state changes. Each state's list membership, key ownership, space
 * and namespace charge follow from the state, so they change here too: PUTTING → putting list,
 * COMPLETE → an LRU list, REVOKED → revoked list (key released, space kept), FREED → space given
 * back and the object released (the caller must not touch it afterwards).
 */
int baton__meta_obj_set_state(baton__meta_t *m, baton__mobj_t *o, baton__obj_state_t to,
                              uint64_t now_ms)
{
    baton__obj_state_t from = o->state;
    if (!baton__meta_state_allowed(from, to)) {
        m->st.refused++;
        log_error("store", "object_state_refused key_len=%u from=%s to=%s", o->key_len,
                  baton__meta_state_name(from), baton__meta_state_name(to));
        return BATON_XFER_EINVAL;
    }
    if (o->list)
        baton__olist_remove(o->list, o);
    o->state = to;
    switch (to) {
    case BATON__OBJ_COMPLETE:
        o->atime_ms = now_ms;
        if (o->soft_pin)
            o->pin_until = now_ms + m->cfg.pin_ttl_ms;
        baton__olist_push(o->soft_pin ? &m->lru_pin : &m->lru, o);
        journal(m, o, to);
        break;
    case BATON__OBJ_REVOKED:
        hash_unlink(m, o);
        o->since_ms = now_ms;
        baton__olist_push(&m->revoked, o);
        break;
    case BATON__OBJ_FREED:
        journal(m, o, to);
        if (from != BATON__OBJ_REVOKED)
            hash_unlink(m, o);
        baton__meta_release_space(m, o);
        ns_charge(m, o, -1);
        free(o->slices);
        free(o);
        break;
    default:
        break;
    }
    return 0;
}

int baton__meta_leased(const baton__mobj_t *o, uint64_t now_ms)
{
    return now_ms < o->lease_until;
}

/* ---- life time ----------------------------------------------------------------------------- */

void baton__meta_config_init(baton__meta_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->lease_ttl_ms = 10000;
    cfg->put_timeout_ms = 30000;
    cfg->reclaim_ms = 600000;
    cfg->pin_ttl_ms = 1800000;
    cfg->high_watermark = 0.90;
    cfg->evict_ratio = 0.05;
    cfg->stripe_bytes = 4u << 20;
    cfg->max_slices = 16;
    cfg->seed = 0x5eed5eedu;
}

int baton__meta_create(const baton__meta_config_t *cfg, baton__meta_t **m_p)
{
    if (cfg->high_watermark <= 0 || cfg->high_watermark > 1 || cfg->evict_ratio <= 0 ||
        cfg->evict_ratio > 1 || cfg->max_slices == 0 || cfg->stripe_bytes == 0)
        return BATON_XFER_EINVAL;
    baton__meta_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return BATON_XFER_ENOMEM;
    m->cfg = *cfg;
    m->n_buckets = 1024;
    m->buckets = calloc(m->n_buckets, sizeof(*m->buckets));
    if (m->buckets == NULL) {
        free(m);
        return BATON_XFER_ENOMEM;
    }
    baton_xoshiro_seed(m->rng, cfg->seed);
    *m_p = m;
    return 0;
}

static void free_list(baton__olist_t *l)
{
    baton__mobj_t *o = l->head;
    while (o) {
        baton__mobj_t *next = o->next;
        free(o->slices);
        free(o);
        o = next;
    }
    l->head = l->tail = NULL;
    l->n = 0;
}

void baton__meta_destroy(baton__meta_t *m)
{
    if (m == NULL)
        return;
    free_list(&m->lru);
    free_list(&m->lru_pin);
    free_list(&m->putting);
    free_list(&m->revoked);
    for (size_t i = 0; i < m->n_segs; i++)
        free(m->segs[i].free);
    for (size_t i = 0; i < m->n_nodes; i++)
        free(m->nodes[i].id);
    free(m->segs);
    free(m->nodes);
    free(m->nss);
    free(m->buckets);
    free(m->view_slices);
    free(m);
}

void baton__meta_stats(const baton__meta_t *m, baton__meta_stats_t *st)
{
    *st = m->st;
    st->capacity = m->capacity;
    st->used = m->used;
    st->objects = m->lru.n + m->lru_pin.n;
    st->putting = m->putting.n;
    st->revoked = m->revoked.n;
    st->segments = 0;
    for (size_t i = 0; i < m->n_segs; i++)
        st->segments += m->segs[i].alive ? 1 : 0;
    st->nodes = 0;
    for (size_t i = 0; i < m->n_nodes; i++)
        st->nodes += m->nodes[i].alive ? 1 : 0;
}

/* ---- namespaces and keys ------------------------------------------------------------------- */

static int ns_find(baton__meta_t *m, const char *name, int create, uint32_t *ns_p)
{
    if (name == NULL || name[0] == '\0')
        name = "default";
    if (strlen(name) > BATON_STORE_NAMESPACE_MAX)
        return BATON_XFER_EINVAL;
    for (size_t i = 0; i < m->n_ns; i++)
        if (strcmp(m->nss[i].name, name) == 0) {
            *ns_p = (uint32_t)i;
            return 0;
        }
    if (!create)
        return BATON_XFER_ENOTFOUND;
    baton__ns_t *nss = realloc(m->nss, (m->n_ns + 1) * sizeof(*nss));
    if (nss == NULL)
        return BATON_XFER_ENOMEM;
    m->nss = nss;
    memset(&nss[m->n_ns], 0, sizeof(nss[0]));
    strcpy(nss[m->n_ns].name, name);
    *ns_p = (uint32_t)m->n_ns++;
    return 0;
}

int baton__meta_ns_quota(baton__meta_t *m, const char *ns, uint64_t bytes)
{
    uint32_t i;
    int rc = ns_find(m, ns, 1, &i);
    if (rc == 0)
        m->nss[i].quota = bytes;
    return rc;
}

uint64_t baton__meta_ns_used(const baton__meta_t *m, const char *ns)
{
    uint32_t i;
    return ns_find((baton__meta_t *)m, ns, 0, &i) == 0 ? m->nss[i].used : 0;
}

static uint64_t key_hash(uint32_t ns, const char *key, size_t len)
{
    return baton_fnv1a64_add(baton_fnv1a64_step(0xcbf29ce484222325ull, ns), key, len);
}

static baton__mobj_t *lookup(const baton__meta_t *m, uint32_t ns, const char *key)
{
    size_t len = strlen(key);
    uint64_t h = key_hash(ns, key, len);
    for (baton__mobj_t *o = m->buckets[h & (m->n_buckets - 1)]; o; o = o->hnext)
        if (o->hash == h && o->ns == ns && o->key_len == len && memcmp(o->key, key, len) == 0)
            return o;
    return NULL;
}

static void hash_grow(baton__meta_t *m)
{
    size_t n = m->n_buckets * 2;
    baton__mobj_t **b = calloc(n, sizeof(*b));
    if (b == NULL)
        return; /* longer chains, still correct */
    for (size_t i = 0; i < m->n_buckets; i++) {
        baton__mobj_t *o = m->buckets[i];
        while (o) {
            baton__mobj_t *next = o->hnext;
            o->hnext = b[o->hash & (n - 1)];
            b[o->hash & (n - 1)] = o;
            o = next;
        }
    }
    free(m->buckets);
    m->buckets = b;
    m->n_buckets = n;
}

static void hash_link(baton__meta_t *m, baton__mobj_t *o)
{
    if (m->n_keyed >= m->n_buckets)
        hash_grow(m);
    baton__mobj_t **b = &m->buckets[o->hash & (m->n_buckets - 1)];
    o->hnext = *b;
    *b = o;
    m->n_keyed++;
}

static int valid_key(const char *key)
{
    size_t n = key ? strlen(key) : 0;
    return n > 0 && n <= BATON_STORE_KEY_MAX;
}

/* Copies the object's placement into the module's view buffer. */
static int fill_view(baton__meta_t *m, const baton__mobj_t *o, baton__obj_view_t *v)
{
    size_t n = (size_t)o->n_replicas * o->n_slices;
    if (n > m->view_cap) {
        baton__slice_t *s = realloc(m->view_slices, n * sizeof(*s));
        if (s == NULL)
            return BATON_XFER_ENOMEM;
        m->view_slices = s;
        m->view_cap = n;
    }
    memcpy(m->view_slices, o->slices, n * sizeof(*o->slices));
    memset(v, 0, sizeof(*v));
    v->put_id = o->put_id;
    v->len = o->len;
    v->crc = o->crc;
    v->n_replicas = o->n_replicas;
    v->n_slices = o->n_slices;
    v->slices = m->view_slices;
    return 0;
}

/* ---- put ------------------------------------------------------------------------------------ */

/* Makes room for `need` bytes within the namespace's quota (evicting only its own objects). */
static int quota_admit(baton__meta_t *m, uint32_t ns, uint64_t need, uint64_t now_ms)
{
    baton__ns_t *n = &m->nss[ns];
    if (n->quota == 0)
        return 0;
    if (need > n->quota)
        return BATON_STORE_EQUOTA;
    if (n->used + need > n->quota)
        baton__meta_evict(m, n->used + need - n->quota, ns, now_ms);
    return n->used + need <= n->quota ? 0 : BATON_STORE_EQUOTA;
}

int baton__meta_put_start(baton__meta_t *m, const baton__put_req_t *req, uint64_t now_ms,
                          baton__obj_view_t *view)
{
    if (!valid_key(req->key) || req->len == 0 || req->replicas == 0 ||
        req->replicas > BATON_STORE_REPLICAS_MAX)
        return BATON_XFER_EINVAL;
    uint32_t ns;
    int rc = ns_find(m, req->ns, 1, &ns);
    if (rc != 0)
        return rc;
    m->st.puts++;
    baton__mobj_t *old = lookup(m, ns, req->key);
    if (old && old->state == BATON__OBJ_PUTTING) {
        if (now_ms - old->since_ms < m->cfg.put_timeout_ms)
            return BATON_XFER_EEXIST;
        m->st.takeovers++;
        baton__meta_obj_set_state(m, old, BATON__OBJ_REVOKED, now_ms);
        old = NULL;
    }
    if (old) {
        if (!(req->flags & BATON_STORE_PUT_UPSERT))
            return BATON_XFER_EEXIST;
        if (baton__meta_leased(old, now_ms))
            return BATON_XFER_EBUSY;
        baton__meta_obj_set_state(m, old, BATON__OBJ_FREED, now_ms);
    }
    /* What the object will hold, before striping's alignment (quota and watermark are
     * approximate by at most BATON__META_ALIGN per slice). */
    uint64_t need = req->len * req->replicas;
    rc = quota_admit(m, ns, need, now_ms);
    if (rc != 0)
        return rc;
    if ((double)(m->used + need) > m->cfg.high_watermark * (double)m->capacity)
        baton__meta_evict_watermark(m, now_ms);

    size_t klen = strlen(req->key);
    baton__mobj_t *o = calloc(1, sizeof(*o) + klen + 1);
    if (o == NULL)
        return BATON_XFER_ENOMEM;
    memcpy(o->key, req->key, klen + 1);
    o->key_len = (uint16_t)klen;
    o->ns = ns;
    o->hash = key_hash(ns, req->key, klen);
    o->len = req->len;
    o->crc = req->crc;
    o->soft_pin = (req->flags & BATON_STORE_PUT_SOFT_PIN) != 0;
    o->state = BATON__OBJ_PUTTING;
    rc = baton__meta_place(m, o, req->replicas);
    if (rc == BATON_STORE_ENOSPACE) { /* a put that finds no space triggers eviction */
        baton__meta_evict(m, need, UINT32_MAX, now_ms);
        rc = baton__meta_place(m, o, req->replicas);
    }
    if (rc != 0) {
        free(o);
        return rc;
    }
    o->put_id = ++m->next_put_id;
    o->since_ms = now_ms;
    ns_charge(m, o, +1);
    hash_link(m, o);
    baton__olist_push(&m->putting, o);
    journal(m, o, BATON__OBJ_PUTTING);
    rc = fill_view(m, o, view);
    if (rc != 0) {
        baton__meta_obj_set_state(m, o, BATON__OBJ_FREED, now_ms);
        return rc;
    }
    return 0;
}

/* ---- restore (a successor master) ----------------------------------------------------------- */

int baton__meta_restore(baton__meta_t *m, const baton__meta_rec_t *rec, uint64_t now_ms)
{
    size_t n = (size_t)rec->n_replicas * rec->n_slices;
    if (!valid_key(rec->key) || rec->len == 0 || n == 0 || rec->n_replicas > 255 ||
        rec->n_slices > 255 ||
        (rec->state != BATON__OBJ_PUTTING && rec->state != BATON__OBJ_COMPLETE))
        return BATON_XFER_EINVAL;
    uint32_t ns;
    int rc = ns_find(m, rec->ns, 1, &ns);
    if (rc != 0)
        return rc;
    if (rec->state == BATON__OBJ_COMPLETE && lookup(m, ns, rec->key))
        return BATON_XFER_EEXIST;
    for (uint32_t s = 0; s < rec->n_slices; s++) { /* every stripe needs a live copy */
        int live = 0;
        for (uint32_t r = 0; r < rec->n_replicas; r++) {
            const baton__slice_t *sl = &rec->slices[(size_t)r * rec->n_slices + s];
            live |= sl->node != BATON__SLICE_LOST && sl->seg < m->n_segs &&
                    m->segs[sl->seg].alive && m->segs[sl->seg].node == sl->node;
        }
        if (!live)
            return BATON_STORE_ENOREPLICA;
    }
    size_t klen = strlen(rec->key);
    baton__mobj_t *o = calloc(1, sizeof(*o) + klen + 1);
    baton__slice_t *slices = malloc(n * sizeof(*slices));
    if (o == NULL || slices == NULL) {
        free(o);
        free(slices);
        return BATON_XFER_ENOMEM;
    }
    memcpy(slices, rec->slices, n * sizeof(*slices));
    size_t taken = 0;
    for (; taken < n; taken++) {
        baton__slice_t *sl = &slices[taken];
        if (sl->node == BATON__SLICE_LOST || sl->seg >= m->n_segs || !m->segs[sl->seg].alive ||
            m->segs[sl->seg].node != sl->node) {
            sl->node = BATON__SLICE_LOST;
            continue;
        }
        if (baton__seg_reserve(&m->segs[sl->seg], sl->off, sl->len) != 0)
            break;
        uint64_t held = (sl->len + BATON__META_ALIGN - 1) & ~(uint64_t)(BATON__META_ALIGN - 1);
        m->used += held;
        o->held_bytes += held;
    }
    o->slices = slices;
    o->n_replicas = rec->n_replicas;
    o->n_slices = rec->n_slices;
    if (taken < n) { /* a range someone else holds: give back what was taken */
        for (size_t i = taken; i < n; i++)
            slices[i].node = BATON__SLICE_LOST;
        baton__meta_release_space(m, o);
        free(slices);
        free(o);
        return BATON_XFER_EEXIST;
    }
    memcpy(o->key, rec->key, klen + 1);
    o->key_len = (uint16_t)klen;
    o->ns = ns;
    o->hash = key_hash(ns, rec->key, klen);
    o->len = rec->len;
    o->crc = rec->crc;
    o->soft_pin = (rec->flags & BATON_STORE_PUT_SOFT_PIN) != 0;
    o->put_id = rec->put_id;
    if (rec->put_id > m->next_put_id)
        m->next_put_id = rec->put_id;
    ns_charge(m, o, +1);
    if (rec->state == BATON__OBJ_PUTTING) { /* its writer may still write: held, keyless */
        o->state = BATON__OBJ_REVOKED;
        o->since_ms = now_ms;
        baton__olist_push(&m->revoked, o);
        return 0;
    }
    o->state = BATON__OBJ_COMPLETE;
    o->atime_ms = now_ms;
    o->lease_until = now_ms + m->cfg.lease_ttl_ms;
    if (o->soft_pin)
        o->pin_until = now_ms + m->cfg.pin_ttl_ms;
    hash_link(m, o);
    baton__olist_push(o->soft_pin ? &m->lru_pin : &m->lru, o);
    return 0;
}

static baton__mobj_t *find_put(baton__meta_t *m, const char *ns_name, const char *key,
                               uint64_t put_id)
{
    uint32_t ns;
    if (!valid_key(key) || ns_find(m, ns_name, 0, &ns) != 0)
        return NULL;
    baton__mobj_t *o = lookup(m, ns, key);
    return o && o->state == BATON__OBJ_PUTTING && o->put_id == put_id ? o : NULL;
}

int baton__meta_put_commit(baton__meta_t *m, const char *ns, const char *key, uint64_t put_id,
                           uint64_t now_ms)
{
    baton__mobj_t *o = find_put(m, ns, key, put_id);
    if (o == NULL)
        return BATON_XFER_ENOTFOUND;
    if (o->lost) {
        baton__meta_obj_set_state(m, o, BATON__OBJ_FREED, now_ms);
        return BATON_STORE_ENOREPLICA;
    }
    m->st.commits++;
    return baton__meta_obj_set_state(m, o, BATON__OBJ_COMPLETE, now_ms);
}

int baton__meta_put_revoke(baton__meta_t *m, const char *ns, const char *key, uint64_t put_id,
                           uint64_t now_ms)
{
    baton__mobj_t *o = find_put(m, ns, key, put_id);
    if (o == NULL)
        return BATON_XFER_ENOTFOUND;
    m->st.revokes++;
    /* The putter's writes are fenced when it revokes (its write callbacks fired): the space
     * can be reused at once. */
    return baton__meta_obj_set_state(m, o, BATON__OBJ_FREED, now_ms);
}

/* ---- reads ---------------------------------------------------------------------------------- */

static baton__mobj_t *find_complete(baton__meta_t *m, const char *ns_name, const char *key)
{
    uint32_t ns;
    if (!valid_key(key) || ns_find(m, ns_name, 0, &ns) != 0)
        return NULL;
    baton__mobj_t *o = lookup(m, ns, key);
    return o && o->state == BATON__OBJ_COMPLETE ? o : NULL;
}

static void grant_lease(baton__meta_t *m, baton__mobj_t *o, uint64_t now_ms)
{
    uint64_t until = now_ms + m->cfg.lease_ttl_ms;
    if (until > o->lease_until)
        o->lease_until = until;
    o->atime_ms = now_ms;
    baton__olist_t *l = o->list; /* touch: most recently used */
    baton__olist_remove(l, o);
    baton__olist_push(l, o);
}

int baton__meta_get(baton__meta_t *m, const char *ns, const char *key, uint64_t now_ms,
                    baton__obj_view_t *view)
{
    m->st.gets++;
    baton__mobj_t *o = find_complete(m, ns, key);
    if (o == NULL) {
        m->st.misses++;
        return BATON_XFER_ENOTFOUND;
    }
    int rc = fill_view(m, o, view);
    if (rc != 0)
        return rc;
    m->st.hits++;
    grant_lease(m, o, now_ms);
    view->lease_ms = m->cfg.lease_ttl_ms;
    return 0;
}

int baton__meta_exists(baton__meta_t *m, const char *ns, const char *key, uint64_t now_ms,
                       int lease, uint64_t *len_p, uint32_t *replicas_p)
{
    baton__mobj_t *o = find_complete(m, ns, key);
    if (o == NULL)
        return 0;
    if (lease)
        grant_lease(m, o, now_ms);
    if (len_p)
        *len_p = o->len;
    if (replicas_p)
        *replicas_p = o->n_replicas;
    return 1;
}

int baton__meta_remove(baton__meta_t *m, const char *ns, const char *key, uint64_t now_ms)
{
    baton__mobj_t *o = find_complete(m, ns, key);
    if (o == NULL)
        return BATON_XFER_ENOTFOUND;
    if (baton__meta_leased(o, now_ms)) {
        m->st.lease_denials++;
        return BATON_XFER_EBUSY;
    }
    m->st.removes++;
    return baton__meta_obj_set_state(m, o, BATON__OBJ_FREED, now_ms);
}

/* ---- nodes lost, periodic work ------------------------------------------------------------ */

/* Marks o's slices on the lost `node` (its segments are already dead: nothing to give back) and
 * uncharges them. Returns 1 when some slice index has no live copy left: the object is lost. A
 * striped object with replicas survives as long as every stripe has a copy somewhere, even when
 * no replica is whole any more (readers take each slice from the replica that still has it). */
static int lose_slices(baton__meta_t *m, baton__mobj_t *o, uint32_t node)
{
    for (size_t i = 0; i < (size_t)o->n_replicas * o->n_slices; i++) {
        baton__slice_t *sl = &o->slices[i];
        if (sl->node != node)
            continue;
        uint64_t len = (sl->len + BATON__META_ALIGN - 1) & ~(uint64_t)(BATON__META_ALIGN - 1);
        baton__ns_t *ns = &m->nss[o->ns];
        ns->used -= len < ns->used ? len : ns->used;
        o->held_bytes -= len < o->held_bytes ? len : o->held_bytes;
        sl->node = BATON__SLICE_LOST;
    }
    for (uint32_t s = 0; s < o->n_slices; s++) {
        int live = 0;
        for (uint32_t r = 0; r < o->n_replicas; r++)
            live |= o->slices[(size_t)r * o->n_slices + s].node != BATON__SLICE_LOST;
        if (!live)
            return 1;
    }
    return 0;
}

size_t baton__meta_node_lost(baton__meta_t *m, uint32_t node, uint64_t now_ms)
{
    if (node >= m->n_nodes || !m->nodes[node].alive)
        return 0;
    m->nodes[node].alive = 0;
    for (size_t i = 0; i < m->n_segs; i++) {
        baton__seg_t *s = &m->segs[i];
        if (s->node == node && s->alive) {
            s->alive = 0;
            m->capacity -= s->capacity;
            m->used -= s->used;
        }
    }
    baton__olist_t *lists[] = {&m->lru, &m->lru_pin, &m->putting, &m->revoked};
    size_t lost = 0;
    for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
        baton__mobj_t *o = lists[i]->head;
        while (o) {
            baton__mobj_t *next = o->next;
            if (lose_slices(m, o, node)) {
                if (o->state == BATON__OBJ_PUTTING) {
                    o->lost = 1; /* freed at its commit, revoke or timeout */
                } else {
                    lost += o->state == BATON__OBJ_COMPLETE;
                    baton__meta_obj_set_state(m, o, BATON__OBJ_FREED, now_ms);
                }
            }
            o = next;
        }
    }
    m->st.nodes_lost++;
    m->st.objects_lost += lost;
    return lost;
}

size_t baton__meta_tick(baton__meta_t *m, uint64_t now_ms)
{
    size_t freed = 0;
    /* Uncommitted puts past the put timeout give up their key (space kept: the writer may
     * still be writing), and revoked puts past the reclaim time give up their space. */
    while (m->putting.head && now_ms - m->putting.head->since_ms >= m->cfg.put_timeout_ms) {
        m->st.takeovers++;
        baton__meta_obj_set_state(m, m->putting.head, BATON__OBJ_REVOKED, now_ms);
    }
    while (m->revoked.head && now_ms - m->revoked.head->since_ms >= m->cfg.reclaim_ms) {
        baton__meta_obj_set_state(m, m->revoked.head, BATON__OBJ_FREED, now_ms);
        freed++;
    }
    return freed + baton__meta_evict_watermark(m, now_ms);
}
