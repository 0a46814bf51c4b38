/* policy_tree.c — cache_aware's per-worker sets of hashed prompt prefixes: chain building,
 * longest match, LRU-bounded insert, dropping a restarted worker's tree. */
#include "router/dataplane/policy_tree.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/hash.h"
#include "common/list.h"
#include "common/rand.h"

typedef struct name_s {
    uint64_t hash;
    struct name_s *hnext;
    baton_list_t lru; /* least recently used first */
} name_t;

typedef struct tenant_s {
    char id[BATON_WORKER_ID_MAX];
    unsigned incarnation;
    name_t **table;
    size_t n_buckets; /* power of two */
    size_t n;
    baton_list_t lru;
} tenant_t;

struct baton_ptree_s {
    pthread_mutex_t mu;
    size_t max_blocks;
    tenant_t **tenants;
    size_t n_tenants, cap_tenants;
};

/* ---- chains ---- */

static int is_space(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\v' || ch == '\f' || ch == '\r';
}

uint32_t baton_ptree_words(const char *text, size_t len)
{
    uint32_t n = 0;
    for (size_t i = 0; i < len; i++)
        if (!is_space(text[i]) && (i == 0 || is_space(text[i - 1])))
            n++;
    return n;
}

int baton_ptree_chain(const char *text, size_t len, unsigned block_words, baton_ptree_chain_t *c)
{
    memset(c, 0, sizeof(*c));
    if (block_words == 0)
        block_words = 1;
    size_t cap = 0;
    uint64_t h = 0x243f6a8885a308d3ULL;
    uint32_t words = 0;
    size_t i = 0;
    for (;;) {
        while (i < len && is_space(text[i]))
            i++;
        if (i >= len)
            break;
        uint64_t wh = BATON_FNV1A64_INIT; /* FNV-1a over the word's bytes */
        while (i < len && !is_space(text[i]))
            wh = baton_fnv1a64_step(wh, (unsigned char)text[i++]);
        h = baton_mix64(h ^ wh);
        words++;
        int at_end = 1;
        for (size_t j = i; j < len; j++)
            if (!is_space(text[j])) {
                at_end = 0;
                break;
            }
        if (words % block_words != 0 && !at_end)
            continue;
        if (c->n == BATON_PTREE_MAX_CHAIN)
            continue; /* counted, not indexed */
        if (c->n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            uint64_t *nh = realloc(c->hash, nc * sizeof(*nh));
            if (nh)
                c->hash = nh;
            uint32_t *ne = nh ? realloc(c->ends, nc * sizeof(*ne)) : NULL;
            if (!nh || !ne) {
                baton_ptree_chain_free(c);
                return BATON_ENOMEM;
            }
            c->ends = ne;
            cap = nc;
        }
        c->hash[c->n] = h;
        c->ends[c->n] = words;
        c->n++;
    }
    c->words = words;
    return 0;
}

void baton_ptree_chain_free(baton_ptree_chain_t *c)
{
    free(c->hash);
    free(c->ends);
    memset(c, 0, sizeof(*c));
}

/* ---- tenants ---- */

int baton_ptree_create(baton_ptree_t **t_p, size_t max_blocks)
{
    if (max_blocks == 0)
        return BATON_EINVAL;
    baton_ptree_t *t = calloc(1, sizeof(*t));
    if (!t)
        return BATON_ENOMEM;
    pthread_mutex_init(&t->mu, NULL);
    t->max_blocks = max_blocks;
    *t_p = t;
    return 0;
}

static void tenant_clear(tenant_t *te)
{
    for (size_t b = 0; b < te->n_buckets; b++) {
        name_t *n = te->table[b];
        while (n) {
            name_t *next = n->hnext;
            free(n);
            n = next;
        }
        te->table[b] = NULL;
    }
    te->n = 0;
    baton_list_init(&te->lru);
}

static void tenant_free(tenant_t *te)
{
    tenant_clear(te);
    free(te->table);
    free(te);
}

void baton_ptree_destroy(baton_ptree_t *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n_tenants; i++)
        tenant_free(t->tenants[i]);
    free(t->tenants);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

static tenant_t *tenant_find(baton_ptree_t *t, const char *id)
{
    for (size_t i = 0; i < t->n_tenants; i++)
        if (strcmp(t->tenants[i]->id, id) == 0)
            return t->tenants[i];
    return NULL;
}

/* The worker's tenant, emptied first when the worker is a new incarnation (its cache is gone);
 * created when `create`. NULL when absent (or no memory). */
static tenant_t *tenant_for(baton_ptree_t *t, const baton_worker_t *w, int create)
{
    unsigned inc = atomic_load(&w->incarnation);
    tenant_t *te = tenant_find(t, w->id);
    if (te) {
        if (te->incarnation != inc) {
            tenant_clear(te);
            te->incarnation = inc;
        }
        return te;
    }
    if (!create)
        return NULL;
    if (t->n_tenants == t->cap_tenants) {
        size_t nc = t->cap_tenants ? t->cap_tenants * 2 : 8;
        tenant_t **nt = realloc(t->tenants, nc * sizeof(*nt));
        if (!nt)
            return NULL;
        t->tenants = nt;
        t->cap_tenants = nc;
    }
    te = calloc(1, sizeof(*te));
    if (!te || !(te->table = calloc(64, sizeof(*te->table)))) {
        free(te);
        return NULL;
    }
    te->n_buckets = 64;
    snprintf(te->id, sizeof(te->id), "%s", w->id);
    te->incarnation = inc;
    baton_list_init(&te->lru);
    t->tenants[t->n_tenants++] = te;
    return te;
}

static name_t *name_find(const tenant_t *te, uint64_t h)
{
    for (name_t *n = te->table[h & (te->n_buckets - 1)]; n; n = n->hnext)
        if (n->hash == h)
            return n;
    return NULL;
}

static void name_unlink(tenant_t *te, name_t *v)
{
    name_t **pp = &te->table[v->hash & (te->n_buckets - 1)];
    while (*pp != v)
        pp = &(*pp)->hnext;
    *pp = v->hnext;
    baton_list_remove(&v->lru);
    te->n--;
    free(v);
}

static void tenant_grow(tenant_t *te)
{
    size_t nb = te->n_buckets * 2;
    name_t **tb = calloc(nb, sizeof(*tb));
    if (!tb)
        return;
    for (size_t b = 0; b < te->n_buckets; b++) {
        name_t *n = te->table[b];
        while (n) {
            name_t *next = n->hnext;
            n->hnext = tb[n->hash & (nb - 1)];
            tb[n->hash & (nb - 1)] = n;
            n = next;
        }
    }
    free(te->table);
    te->table = tb;
    te->n_buckets = nb;
}

/* ---- lookups ---- */

void baton_ptree_match(baton_ptree_t *t, const baton_ptree_chain_t *c, baton_worker_t *const *ws,
                       size_t n, uint32_t *matched)
{
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < n; i++) {
        matched[i] = 0;
        tenant_t *te = tenant_for(t, ws[i], 0);
        if (!te || te->n == 0)
            continue;
        /* The set holds every prefix of what it holds (insert adds whole chains), so the
         * longest match is found by binary search over the chain. Eviction can break that
         * closure; the search then finds a match, maybe not the longest: approximate. */
        size_t lo = 0, hi = c->n; /* chain[0..lo) known held */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (name_find(te, c->hash[mid]))
                lo = mid + 1;
            else
                hi = mid;
        }
        matched[i] = lo ? c->ends[lo - 1] : 0;
    }
    pthread_mutex_unlock(&t->mu);
}

void baton_ptree_insert(baton_ptree_t *t, const baton_worker_t *w, const baton_ptree_chain_t *c)
{
    pthread_mutex_lock(&t->mu);
    tenant_t *te = tenant_for(t, w, 1);
    /* Deepest first, so a prefix is always more recent than its extensions: LRU eviction then
     * takes leaves before the prefixes they hang on (a radix tree's leaf-first eviction), and
     * the set stays closed under prefixes. */
    for (size_t k = c->n; te && k-- > 0;) {
        size_t i = k;
        name_t *nm = name_find(te, c->hash[i]);
        if (nm) {
            baton_list_remove(&nm->lru);
            baton_list_push(&te->lru, &nm->lru);
            continue;
        }
        while (te->n >= t->max_blocks)
            name_unlink(te, container_of(te->lru.next, name_t, lru));
        nm = malloc(sizeof(*nm));
        if (!nm)
            break;
        nm->hash = c->hash[i];
        nm->hnext = te->table[nm->hash & (te->n_buckets - 1)];
        te->table[nm->hash & (te->n_buckets - 1)] = nm;
        baton_list_init(&nm->lru);
        baton_list_push(&te->lru, &nm->lru);
        if (++te->n > te->n_buckets)
            tenant_grow(te);
    }
    pthread_mutex_unlock(&t->mu);
}

void baton_ptree_drop(baton_ptree_t *t, const char *worker_id)
{
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->n_tenants; i++) {
        if (strcmp(t->tenants[i]->id, worker_id) == 0) {
            tenant_free(t->tenants[i]);
            t->tenants[i] = t->tenants[--t->n_tenants];
            break;
        }
    }
    pthread_mutex_unlock(&t->mu);
}

static size_t tenant_bytes(const tenant_t *te)
{
    return sizeof(*te) + te->n_buckets * sizeof(name_t *) + te->n * sizeof(name_t);
}

size_t baton_ptree_size(baton_ptree_t *t, const char *worker_id, size_t *bytes_p)
{
    pthread_mutex_lock(&t->mu);
    tenant_t *te = tenant_find(t, worker_id);
    size_t n = te ? te->n : 0;
    if (bytes_p)
        *bytes_p = te ? tenant_bytes(te) : 0;
    pthread_mutex_unlock(&t->mu);
    return n;
}

size_t baton_ptree_total(baton_ptree_t *t, size_t *bytes_p)
{
    size_t n = 0, b = sizeof(*t);
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->n_tenants; i++) {
        n += t->tenants[i]->n;
        b += tenant_bytes(t->tenants[i]);
    }
    b += t->cap_tenants * sizeof(tenant_t *);
    pthread_mutex_unlock(&t->mu);
    if (bytes_p)
        *bytes_p = b;
    return n;
}
