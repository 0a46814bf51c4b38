/* registry.c — the worker registry: validation, stable ids, references, snapshots, generation. */
#include "router/control/registry.h"

#include "baton/error.h"
#include "common/hash.h"
#include "common/log.h"

#include <ctype.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <uv.h>

struct baton_registry_s {
    pthread_mutex_t lock; /* the list; workers' atomics are read without it */
    baton_worker_t *first;
    baton_worker_t *last;
    size_t n;
    atomic_ullong generation;
    /* Shared registry: set once before the loops start, then read-only. */
    baton_registry_hooks_t hooks;
    /* Its state for /readiness, guarded by lock. */
    char shared_source[16];
    int shared_connected;
    char shared_detail[256];
    _Atomic int pd_default; /* baton_pd_protocol_t for specs without one */
    struct baton_kvroute_s *kv; /* set once before the loops start */
};

static const char *const role_names[] = {"prefill", "decode", "regular"};

const char *baton_worker_role_name(baton_worker_role_t role)
{
    if (role == BATON_ROLE_ANY)
        return "any";
    if ((unsigned)role < BATON_ROLE_COUNT)
        return role_names[role];
    return "unknown";
}

int baton_worker_role_parse(const char *name, baton_worker_role_t *role_p)
{
    if (name == NULL)
        return BATON_EINVAL;
    for (int i = 0; i < BATON_ROLE_COUNT; i++) {
        if (strcmp(name, role_names[i]) == 0) {
            *role_p = (baton_worker_role_t)i;
            return 0;
        }
    }
    return BATON_EINVAL;
}

const char *baton_worker_health_name(baton_worker_health_t h)
{
    return h == BATON_HEALTH_HEALTHY ? "healthy" : "unhealthy";
}

static const char *const pd_names[BATON_PD_COUNT] = {"sglang", "vllm-nixl", "vllm-mooncake"};

const char *baton_pd_protocol_name(baton_pd_protocol_t p)
{
    return (unsigned)p < BATON_PD_COUNT ? pd_names[p] : "unknown";
}

int baton_pd_protocol_parse(const char *name, baton_pd_protocol_t *p_p)
{
    for (int i = 0; name && i < BATON_PD_COUNT; i++) {
        if (strcmp(name, pd_names[i]) == 0) {
            *p_p = (baton_pd_protocol_t)i;
            return 0;
        }
    }
    return BATON_EINVAL;
}

void baton_registry_set_pd_default(baton_registry_t *reg, baton_pd_protocol_t p)
{
    if ((unsigned)p < BATON_PD_COUNT)
        atomic_store(&reg->pd_default, (int)p);
}

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ---- URLs ---- */

int baton_worker_url_normalize(const char *url, char *out, size_t outlen, baton_url_t *parsed_p)
{
    baton_url_t u;
    if (url == NULL || baton_url_parse(url, &u) != 0)
        return BATON_EINVAL;
    /* Host names are case-insensitive: one spelling, so duplicates are found. */
    for (char *h = u.host; *h; h++)
        *h = (char)tolower((unsigned char)*h);
    int ipv6 = strchr(u.host, ':') != NULL;
    const char *scheme = u.tls ? "https" : "http";
    int n = snprintf(out, outlen, ipv6 ? "%s://[%s]:%d%s" : "%s://%s:%d%s", scheme, u.host, u.port,
                     u.prefix);
    if (n < 0 || (size_t)n >= outlen)
        return BATON_EINVAL;
    if (parsed_p != NULL)
        *parsed_p = u;
    return 0;
}

/* ---- workers ---- */

static void worker_free(baton_worker_t *w)
{
    baton_worker_desc_t d;
    BATON_WORKER_DESC_COPY_FIELDS(&d, w); /* its strings, freed as a descriptor's */
    baton_worker_desc_free(&d);
    free(w->dp_in_flight);
    free(w->models_found);
    free(w);
}

void baton_worker_ref(baton_worker_t *w)
{
    atomic_fetch_add_explicit(&w->refcount, 1, memory_order_relaxed);
}

void baton_worker_unref(baton_worker_t *w)
{
    if (w == NULL)
        return;
    /* acq_rel: every write made while a reference was held happens before the free. */
    if (atomic_fetch_sub_explicit(&w->refcount, 1, memory_order_acq_rel) == 1)
        worker_free(w);
}

void baton_workers_unref(baton_worker_t **ws, size_t n)
{
    for (size_t i = 0; i < n; i++)
        baton_worker_unref(ws[i]);
}

int baton_workers_contain(baton_worker_t *const *ws, size_t n, const baton_worker_t *w)
{
    for (size_t i = 0; i < n; i++)
        if (ws[i] == w)
            return 1;
    return 0;
}

void baton_workers_release(baton_worker_t **ws, size_t n, baton_worker_t **stack)
{
    baton_workers_unref(ws, n);
    if (ws != stack)
        free(ws);
}

void baton_worker_in_flight_inc(baton_worker_t *w)
{
    atomic_fetch_add_explicit(&w->in_flight, 1, memory_order_relaxed);
}

void baton_worker_in_flight_dec(baton_worker_t *w)
{
    atomic_fetch_sub_explicit(&w->in_flight, 1, memory_order_relaxed);
}

long baton_worker_in_flight(const baton_worker_t *w)
{
    return atomic_load_explicit(&((baton_worker_t *)w)->in_flight, memory_order_relaxed);
}

baton_worker_health_t baton_worker_health(const baton_worker_t *w)
{
    return (baton_worker_health_t)atomic_load(&((baton_worker_t *)w)->health);
}

baton_breaker_state_t baton_worker_breaker(const baton_worker_t *w)
{
    return (baton_breaker_state_t)atomic_load(&((baton_worker_t *)w)->breaker);
}

int baton_worker_is_draining(const baton_worker_t *w)
{
    return atomic_load(&((baton_worker_t *)w)->draining);
}

int baton_worker_is_removed(const baton_worker_t *w)
{
    return atomic_load(&((baton_worker_t *)w)->removed);
}

uint64_t baton_worker_removed_ns(const baton_worker_t *w)
{
    return atomic_load(&((baton_worker_t *)w)->removed_ns);
}

int baton_worker_is_eligible(const baton_worker_t *w)
{
    return baton_worker_health(w) == BATON_HEALTH_HEALTHY &&
           baton_worker_breaker(w) != BATON_BREAKER_OPEN && !baton_worker_is_draining(w) &&
           !baton_worker_is_removed(w);
}

/* ---- registry ---- */

int baton_registry_create(baton_registry_t **reg_p)
{
    baton_registry_t *reg = calloc(1, sizeof(*reg));
    if (reg == NULL)
        return BATON_ENOMEM;
    if (pthread_mutex_init(&reg->lock, NULL) != 0) {
        free(reg);
        return BATON_ENOMEM;
    }
    atomic_init(&reg->generation, 1);
    atomic_init(&reg->pd_default, BATON_PD_SGLANG);
    *reg_p = reg;
    return 0;
}

void baton_registry_destroy(baton_registry_t *reg)
{
    if (reg == NULL)
        return;
    baton_worker_t *w = reg->first;
    while (w != NULL) {
        baton_worker_t *next = w->next;
        w->next = NULL;
        atomic_store(&w->removed_ns, uv_hrtime());
        atomic_store(&w->removed, 1);
        atomic_store(&w->draining, 1);
        baton_worker_unref(w);
        w = next;
    }
    pthread_mutex_destroy(&reg->lock);
    free(reg);
}

static void bump(baton_registry_t *reg)
{
    atomic_fetch_add(&reg->generation, 1);
}

/* FNV-1a 32 of the normalized URL: the same URL gets the same id across restarts and router
 * replicas. `salt` resolves the (unlikely) collision between two different URLs. */
static void make_id(const char *norm_url, unsigned salt, char id[BATON_WORKER_ID_MAX])
{
    uint32_t h = baton_fnv1a32_add_str(BATON_FNV1A32_INIT, norm_url);
    for (unsigned i = 0; i < salt; i++)
        h = baton_fnv1a32_step(h, 0x5bd1e995u + i);
    /* Final avalanche (murmur3's fmix32) so similar URLs get visibly different ids. */
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    snprintf(id, BATON_WORKER_ID_MAX, "w-%08x", h);
}

static baton_worker_t *find_id_locked(baton_registry_t *reg, const char *id)
{
    for (baton_worker_t *w = reg->first; w != NULL; w = w->next)
        if (strcmp(w->id, id) == 0)
            return w;
    return NULL;
}

static baton_worker_t *find_url_locked(baton_registry_t *reg, const char *norm_url)
{
    for (baton_worker_t *w = reg->first; w != NULL; w = w->next)
        if (strcmp(w->url, norm_url) == 0)
            return w;
    return NULL;
}

/* A worker carries only its own protocol's fields: one sent for another protocol means the
 * operator paired the wrong kind of engine with this router, which must fail at registration
 * rather than at the first request. */
int baton_worker_api_key_ok(const char *k)
{
    if (!k[0])
        return 0;
    for (const unsigned char *p = (const unsigned char *)k; *p; p++)
        if (*p < 0x21 || *p > 0x7e)
            return 0;
    return 1;
}

static int pd_fields_check(const baton_worker_spec_t *spec, baton_pd_protocol_t proto, char *err,
                           size_t errlen)
{
    const char *pname = baton_pd_protocol_name(proto);
    if ((unsigned)proto >= BATON_PD_COUNT) {
        set_err(err, errlen, "pd_protocol must be sglang, vllm-nixl or vllm-mooncake");
        return BATON_EINVAL;
    }
    if (proto != BATON_PD_SGLANG && spec->role == BATON_ROLE_REGULAR) {
        set_err(err, errlen, "pd_protocol %s is for prefill and decode workers only", pname);
        return BATON_EINVAL;
    }
    if (spec->dp_size < 0 || spec->dp_size > 1024) {
        set_err(err, errlen, "dp_size must be in 0..1024");
        return BATON_EINVAL;
    }
    int mooncake_prefill = proto == BATON_PD_VLLM_MOONCAKE && spec->role == BATON_ROLE_PREFILL;
    /* vLLM's Mooncake decode names a prefill's DP rank by its engine id ({base}_dp{rank}); the
     * other vLLM legs need no rank from the router */
    if (proto != BATON_PD_SGLANG &&
        ((spec->dp_size && !mooncake_prefill) || spec->bootstrap_port != -1)) {
        set_err(err, errlen, "%s is an sglang field; this worker speaks %s",
                spec->bootstrap_port != -1 ? "bootstrap_port" : "dp_size", pname);
        return BATON_EINVAL;
    }
    if (!mooncake_prefill && (spec->engine_id || spec->bootstrap_addr)) {
        set_err(err, errlen, "engine_id and bootstrap_addr are for vllm-mooncake prefill workers");
        return BATON_EINVAL;
    }
    if (mooncake_prefill &&
        (!spec->engine_id || !spec->engine_id[0] || !spec->bootstrap_addr ||
         strncmp(spec->bootstrap_addr, "http://", 7) != 0 || !spec->bootstrap_addr[7])) {
        /* vLLM's decode appends "/query" to remote_bootstrap_addr: the scheme is required. */
        set_err(
            err, errlen,
            "a vllm-mooncake prefill needs engine_id (--prefill-engine-id) and the address of its "
            "Mooncake bootstrap server (--prefill URL PORT, or bootstrap_addr "
            "\"http://host:port\")");
        return BATON_EINVAL;
    }
    return 0;
}

int baton_registry_add(baton_registry_t *reg, const baton_worker_spec_t *spec,
                       baton_worker_t **worker_p, char *err, size_t errlen)
{
    if (reg == NULL || spec == NULL) {
        set_err(err, errlen, "no worker given");
        return BATON_EINVAL;
    }
    if (spec->url == NULL || spec->url[0] == '\0') {
        set_err(err, errlen, "url is required");
        return BATON_EINVAL;
    }
    char norm[BATON_WORKER_URL_MAX];
    baton_url_t parsed;
    if (baton_worker_url_normalize(spec->url, norm, sizeof(norm), &parsed) != 0) {
        set_err(err, errlen, "invalid worker url (expected http://host:port): '%.200s'", spec->url);
        return BATON_EINVAL;
    }
    if ((unsigned)spec->role >= BATON_ROLE_COUNT) {
        set_err(err, errlen, "invalid worker_type (expected prefill, decode or regular)");
        return BATON_EINVAL;
    }
    if (spec->bootstrap_port != -1) {
        if (spec->role != BATON_ROLE_PREFILL) {
            set_err(err, errlen, "bootstrap_port is only valid for prefill workers");
            return BATON_EINVAL;
        }
        if (spec->bootstrap_port < 1 || spec->bootstrap_port > 65535) {
            set_err(err, errlen, "bootstrap_port must be in 1..65535 or null");
            return BATON_EINVAL;
        }
    }
    baton_pd_protocol_t proto = spec->pd_protocol == BATON_PD_UNSET
                                    ? (baton_pd_protocol_t)atomic_load(&reg->pd_default)
                                    : spec->pd_protocol;
    /* vLLM's and SGLang's routers take `--prefill URL BOOTSTRAP_PORT`; for a Mooncake prefill the
     * port is its Mooncake bootstrap server's, on the prefill's host: bootstrap_addr. */
    baton_worker_spec_t mooncake;
    char addr[300];
    if (proto == BATON_PD_VLLM_MOONCAKE && spec->role == BATON_ROLE_PREFILL &&
        spec->bootstrap_port != -1 && spec->bootstrap_addr == NULL) {
        int v6 = strchr(parsed.host, ':') != NULL;
        snprintf(addr, sizeof(addr), "http://%s%s%s:%d", v6 ? "[" : "", parsed.host, v6 ? "]" : "",
                 spec->bootstrap_port);
        mooncake = *spec;
        mooncake.bootstrap_addr = addr;
        mooncake.bootstrap_port = -1;
        spec = &mooncake;
    }
    if (pd_fields_check(spec, proto, err, errlen) != 0)
        return BATON_EINVAL;
    if (spec->priority < 0) {
        set_err(err, errlen, "priority must be >= 0");
        return BATON_EINVAL;
    }
    if (!(spec->cost >= 0) || spec->cost > 1e12) { /* also NaN */
        set_err(err, errlen, "cost must be a number >= 0");
        return BATON_EINVAL;
    }
    if (spec->api_key && !baton_worker_api_key_ok(spec->api_key)) {
        /* It becomes an Authorization header on every request and health check. */
        set_err(err, errlen, "api_key must be visible ASCII (no spaces or control characters)");
        return BATON_EINVAL;
    }
    char *labels = NULL;
    if (spec->labels_json != NULL) {
        json_error_t jerr;
        json_t *j = json_loads(spec->labels_json, JSON_REJECT_DUPLICATES, &jerr);
        if (j == NULL || !json_is_object(j)) {
            json_decref(j);
            set_err(err, errlen, "labels must be a JSON object");
            return BATON_EINVAL;
        }
        labels = json_dumps(j, JSON_COMPACT);
        json_decref(j);
    } else {
        labels = strdup("{}");
    }
    if (labels == NULL) {
        set_err(err, errlen, "out of memory");
        return BATON_ENOMEM;
    }

    /* The worker's descriptor: the spec as resolved here, its strings copied. */
    baton_worker_spec_t resolved = *spec;
    resolved.url = norm;
    resolved.labels_json = labels;
    resolved.pd_protocol = proto;
    baton_worker_desc_t d;
    baton_worker_t *w = calloc(1, sizeof(*w));
    int oom = w == NULL || baton_worker_desc_dup(&d, &resolved) != 0;
    free(labels);
    if (!oom) {
        BATON_WORKER_DESC_COPY_FIELDS(w, &d);
        if (spec->dp_size > 1) {
            w->dp_in_flight = calloc((size_t)spec->dp_size, sizeof(*w->dp_in_flight));
            oom |= w->dp_in_flight == NULL;
        }
    }
    if (oom) {
        if (w != NULL)
            worker_free(w);
        set_err(err, errlen, "out of memory");
        return BATON_ENOMEM;
    }
    w->parsed = parsed;
    atomic_init(&w->in_flight, 0);
    atomic_init(&w->health, BATON_HEALTH_HEALTHY);
    atomic_init(&w->breaker, BATON_BREAKER_CLOSED);
    atomic_init(&w->draining, 0);
    atomic_init(&w->removed, 0);
    atomic_init(&w->removed_ns, 0);
    atomic_init(&w->dp_turn, 0);
    for (int i = 0; w->dp_in_flight != NULL && i < w->dp_size; i++)
        atomic_init(&w->dp_in_flight[i], 0);
    atomic_init(&w->refcount, 1); /* the registry's */

    pthread_mutex_lock(&reg->lock);
    if (find_url_locked(reg, w->url) != NULL) {
        pthread_mutex_unlock(&reg->lock);
        set_err(err, errlen, "a worker with url %s already exists", w->url);
        worker_free(w);
        return BATON_EEXIST;
    }
    for (unsigned salt = 0;; salt++) {
        make_id(w->url, salt, w->id);
        if (find_id_locked(reg, w->id) == NULL)
            break;
    }
    if (reg->last != NULL)
        reg->last->next = w;
    else
        reg->first = w;
    reg->last = w;
    reg->n++;
    if (worker_p != NULL) {
        baton_worker_ref(w);
        *worker_p = w;
    }
    bump(reg);
    pthread_mutex_unlock(&reg->lock);
    log_info("router", "worker_added id=%s url=%s role=%s bootstrap_port=%d pd_protocol=%s", w->id,
             w->url, baton_worker_role_name(w->role), w->bootstrap_port,
             baton_pd_protocol_name(w->pd_protocol));
    return 0;
}

/* Unlinks w (held lock) and drops the registry's reference after unlocking. */
static void unlink_locked(baton_registry_t *reg, baton_worker_t *w)
{
    baton_worker_t *prev = NULL;
    for (baton_worker_t *c = reg->first; c != NULL; prev = c, c = c->next) {
        if (c != w)
            continue;
        if (prev != NULL)
            prev->next = c->next;
        else
            reg->first = c->next;
        if (reg->last == c)
            reg->last = prev;
        c->next = NULL;
        reg->n--;
        break;
    }
    atomic_store(&w->removed_ns, uv_hrtime());
    atomic_store(&w->draining, 1);
    atomic_store(&w->removed, 1);
    bump(reg);
}

static int remove_worker(baton_registry_t *reg, baton_worker_t *w)
{
    unlink_locked(reg, w);
    pthread_mutex_unlock(&reg->lock);
    log_info("router", "worker_removed id=%s url=%s in_flight=%ld", w->id, w->url,
             baton_worker_in_flight(w));
    baton_worker_unref(w);
    return 0;
}

int baton_registry_remove(baton_registry_t *reg, const char *id)
{
    if (reg == NULL || id == NULL)
        return BATON_ENOTFOUND;
    pthread_mutex_lock(&reg->lock);
    baton_worker_t *w = find_id_locked(reg, id);
    if (w == NULL) {
        pthread_mutex_unlock(&reg->lock);
        return BATON_ENOTFOUND;
    }
    return remove_worker(reg, w);
}

int baton_registry_remove_url(baton_registry_t *reg, const char *url)
{
    char norm[BATON_WORKER_URL_MAX];
    if (reg == NULL || baton_worker_url_normalize(url, norm, sizeof(norm), NULL) != 0)
        return BATON_ENOTFOUND;
    pthread_mutex_lock(&reg->lock);
    baton_worker_t *w = find_url_locked(reg, norm);
    if (w == NULL) {
        pthread_mutex_unlock(&reg->lock);
        return BATON_ENOTFOUND;
    }
    return remove_worker(reg, w);
}

baton_worker_t *baton_registry_get(baton_registry_t *reg, const char *id)
{
    if (reg == NULL || id == NULL)
        return NULL;
    pthread_mutex_lock(&reg->lock);
    baton_worker_t *w = find_id_locked(reg, id);
    if (w != NULL)
        baton_worker_ref(w);
    pthread_mutex_unlock(&reg->lock);
    return w;
}

baton_worker_t *baton_registry_find_url(baton_registry_t *reg, const char *url)
{
    char norm[BATON_WORKER_URL_MAX];
    if (reg == NULL || baton_worker_url_normalize(url, norm, sizeof(norm), NULL) != 0)
        return NULL;
    pthread_mutex_lock(&reg->lock);
    baton_worker_t *w = find_url_locked(reg, norm);
    if (w != NULL)
        baton_worker_ref(w);
    pthread_mutex_unlock(&reg->lock);
    return w;
}

size_t baton_registry_snapshot(baton_registry_t *reg, baton_worker_role_t role, unsigned flags,
                               baton_worker_t **out, size_t cap)
{
    if (reg == NULL)
        return 0;
    size_t total = 0;
    pthread_mutex_lock(&reg->lock);
    for (baton_worker_t *w = reg->first; w != NULL; w = w->next) {
        if (role != BATON_ROLE_ANY && w->role != role)
            continue;
        if ((flags & BATON_SNAP_ELIGIBLE) && !baton_worker_is_eligible(w))
            continue;
        if (total < cap && out != NULL) {
            baton_worker_ref(w);
            out[total] = w;
        }
        total++;
    }
    pthread_mutex_unlock(&reg->lock);
    return total;
}

size_t baton_registry_snapshot_all(baton_registry_t *reg, baton_worker_role_t role, unsigned flags,
                                   baton_worker_t **stack, size_t n_stack, baton_worker_t ***ws_p)
{
    *ws_p = stack;
    size_t total = baton_registry_snapshot(reg, role, flags, stack, n_stack);
    if (total <= n_stack)
        return total;
    size_t cap = total + 16; /* room for workers registered meanwhile */
    baton_worker_t **heap = malloc(cap * sizeof(*heap));
    if (heap == NULL)
        return n_stack;
    baton_workers_unref(stack, n_stack);
    total = baton_registry_snapshot(reg, role, flags, heap, cap);
    *ws_p = heap;
    return total < cap ? total : cap;
}

void baton_registry_counts(baton_registry_t *reg, size_t counts[BATON_ROLE_COUNT],
                           size_t eligible[BATON_ROLE_COUNT])
{
    for (int i = 0; i < BATON_ROLE_COUNT; i++) {
        counts[i] = 0;
        if (eligible != NULL)
            eligible[i] = 0;
    }
    if (reg == NULL)
        return;
    pthread_mutex_lock(&reg->lock);
    for (baton_worker_t *w = reg->first; w != NULL; w = w->next) {
        counts[w->role]++;
        if (eligible != NULL && baton_worker_is_eligible(w))
            eligible[w->role]++;
    }
    pthread_mutex_unlock(&reg->lock);
}

size_t baton_registry_size(baton_registry_t *reg)
{
    if (reg == NULL)
        return 0;
    pthread_mutex_lock(&reg->lock);
    size_t n = reg->n;
    pthread_mutex_unlock(&reg->lock);
    return n;
}

uint64_t baton_registry_generation(baton_registry_t *reg)
{
    return atomic_load(&reg->generation);
}

void baton_registry_set_health(baton_registry_t *reg, baton_worker_t *w, baton_worker_health_t h)
{
    int old = atomic_exchange(&w->health, (int)h);
    if (old == BATON_HEALTH_UNHEALTHY && h == BATON_HEALTH_HEALTHY)
        atomic_fetch_add(&w->incarnation, 1); /* back up: maybe restarted, its cache empty */
    if (old != (int)h && reg != NULL) {
        bump(reg);
        log_info("router", "worker_health id=%s url=%s health=%s", w->id, w->url,
                 baton_worker_health_name(h));
    }
}

void baton_registry_set_breaker(baton_registry_t *reg, baton_worker_t *w, baton_breaker_state_t s)
{
    int old = atomic_exchange(&w->breaker, (int)s);
    if (old != BATON_BREAKER_CLOSED && s == BATON_BREAKER_CLOSED)
        atomic_fetch_add(&w->incarnation, 1); /* failures were seen: its cache is not trusted */
    if (old != (int)s && reg != NULL) {
        bump(reg);
        log_info("router", "worker_breaker id=%s url=%s breaker=%s", w->id, w->url,
                 baton_breaker_state_name(s));
    }
}

void baton_registry_set_draining(baton_registry_t *reg, baton_worker_t *w, int draining)
{
    if (!draining && baton_worker_is_removed(w))
        return; /* a removed worker drains for good */
    int old = atomic_exchange(&w->draining, draining ? 1 : 0);
    if (old != (draining ? 1 : 0) && reg != NULL)
        bump(reg);
}

/* ---- shared registry hooks ---- */

void baton_registry_set_hooks(baton_registry_t *reg, const baton_registry_hooks_t *hooks)
{
    reg->hooks = *hooks;
}

void baton_registry_publish_add(baton_registry_t *reg, const baton_worker_t *w)
{
    if (reg->hooks.published_add != NULL)
        reg->hooks.published_add(reg->hooks.ctx, w);
}

void baton_registry_publish_remove(baton_registry_t *reg, const baton_worker_t *w)
{
    if (reg->hooks.published_remove != NULL)
        reg->hooks.published_remove(reg->hooks.ctx, w);
}

void baton_registry_set_shared_state(baton_registry_t *reg, const char *source, int connected,
                                     const char *detail)
{
    pthread_mutex_lock(&reg->lock);
    snprintf(reg->shared_source, sizeof(reg->shared_source), "%s", source);
    reg->shared_connected = connected;
    snprintf(reg->shared_detail, sizeof(reg->shared_detail), "%s", detail ? detail : "");
    pthread_mutex_unlock(&reg->lock);
}

int baton_registry_shared_state(baton_registry_t *reg, char *source, size_t source_len,
                                int *connected_p, char *detail, size_t detail_len)
{
    pthread_mutex_lock(&reg->lock);
    int has = reg->shared_source[0] != '\0';
    if (has) {
        snprintf(source, source_len, "%s", reg->shared_source);
        *connected_p = reg->shared_connected;
        snprintf(detail, detail_len, "%s", reg->shared_detail);
    }
    pthread_mutex_unlock(&reg->lock);
    return has;
}

void baton_registry_set_kv(baton_registry_t *reg, struct baton_kvroute_s *kv)
{
    reg->kv = kv;
}

struct baton_kvroute_s *baton_registry_kv(const baton_registry_t *reg)
{
    return reg->kv;
}
