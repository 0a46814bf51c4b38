/* registry.h — the router's worker registry: workers by role, references, health/breaker slots. */
#ifndef BATON_ROUTER_REGISTRY_H
#define BATON_ROUTER_REGISTRY_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "health/breaker_state.h" /* baton_breaker_state_t: CLOSED / OPEN / HALF_OPEN */
#include "http/common.h"
#include "router/control/worker_desc.h"

/*
 * One registry is shared by every router thread (each thread runs its own libuv loop).
 *
 * Threading: every function here is thread-safe. The registry's list is guarded by one mutex,
 * held only for short copies; per-worker mutable state (in-flight count, health, breaker,
 * draining) is atomic and read without the lock.
 *
 * Ownership and lifetime: a worker is reference-counted. The registry holds one reference while
 * the worker is registered. Every function that hands out a worker pointer (add with worker_p,
 * get, find_url, snapshot) hands out a NEW reference that the caller must drop with
 * baton_worker_unref() (or baton_workers_unref()). Removing a worker marks it removed and
 * draining and drops the registry's reference; a request that still holds a reference keeps
 * the worker (and its strings) valid until its last reference is dropped, then it is freed on
 * whichever thread dropped it.
 *
 * Change detection: baton_registry_generation() increases on every change that can alter the
 * result of a snapshot (add, remove, health/breaker/draining change). A per-loop cache may keep
 * a snapshot and refresh it when the generation it saw differs.
 */

/* "prefill", "decode", "regular" (and "any" for BATON_ROLE_ANY). */
const char *baton_worker_role_name(baton_worker_role_t role);
/* Exact, case-sensitive match of the names above (not "any"). 0 or BATON_EINVAL. */
int baton_worker_role_parse(const char *name, baton_worker_role_t *role_p);

/* Health as decided by the health layer. A new worker starts HEALTHY. */
typedef enum {
    BATON_HEALTH_HEALTHY = 0,
    BATON_HEALTH_UNHEALTHY = 1,
} baton_worker_health_t;
const char *baton_worker_health_name(baton_worker_health_t h); /* "healthy", "unhealthy" */

/* "sglang", "vllm-nixl", "vllm-mooncake". */
const char *baton_pd_protocol_name(baton_pd_protocol_t p);
/* Exact match of the names above. 0 or BATON_EINVAL. */
int baton_pd_protocol_parse(const char *name, baton_pd_protocol_t *p_p);

#define BATON_WORKER_ID_MAX 16 /* "w-" + 8 hex digits + NUL fits with room to spare */

/* What a caller asks to register: baton_worker_spec_t (worker_desc.h), its strings borrowed
 * for the duration of the call only; baton_worker_spec_init fills the defaults. */

/*
 * A registered worker. The fields in the first block are immutable after registration and may
 * be read from any thread while holding a reference. The atomic block is updated through the
 * functions below; read it with the accessors.
 */
typedef struct baton_worker_s {
    char id[BATON_WORKER_ID_MAX]; /* "w-" + 8 lowercase hex, stable: derived from the URL */
    /* The descriptor's fields (worker_desc.h), as registered: url normalized
     * ("http://host:port[/prefix]", no trailing '/'), labels_json compact and never NULL ("{}"
     * when none), pd_protocol resolved (never UNSET). */
    BATON_WORKER_DESC_FIELDS(BATON_WORKER_DESC_DECL)
    baton_url_t parsed; /* url's host (no brackets), port, prefix */

    /* Mutable, atomic. */
    atomic_long in_flight;       /* requests currently sent to this worker */
    atomic_int health;           /* baton_worker_health_t */
    atomic_int breaker;          /* baton_breaker_state_t */
    atomic_int draining;         /* 1: takes no new requests (set on removal or by drain) */
    atomic_int removed;          /* 1: no longer in the registry */
    _Atomic uint64_t removed_ns; /* uv_hrtime() when it was removed (its drain began); 0 before */
    /* Cache- and load-aware routing (policy.h). incarnation rises each time the health layer
     * sees the worker come back up (a restart empties its cache: the router's tree for it is
     * dropped); the rest is written by the policies and shown by /workers. */
    atomic_long in_flight_tokens;      /* prompt words of the requests in flight (least_load) */
    atomic_uint incarnation;           /* unhealthy → healthy transitions */
    _Atomic uint64_t cache_tree_names; /* cache_aware: names in its router-side tree */
    _Atomic uint64_t cache_tree_bytes; /* ... and their memory */
    atomic_uint cache_hit_ppm;         /* recent predicted hit ratio, ppm (EWMA, 1/8 weight) */
    atomic_uint dp_turn;               /* DP attention: the next rank, round robin */
    /* The KV block index's sources (bit s: source s, one per DP rank) whose history the
     * router knows (kv_route.h): what the precise policy reads; 0 when none. */
    _Atomic uint64_t kv_sources;
    atomic_long *dp_in_flight; /* dp_size > 1: this router's requests per rank (dp_rank.h) */
    /* Reported load (load_poll.h, least_load): the worker's own /get_load total, this router's
     * in-flight count when it was read, and until when the report counts (baton_now_ms; 0: no
     * report). Written by the poller's loop, read by every request loop. */
    atomic_long reported_load;
    atomic_long reported_base;
    _Atomic uint64_t reported_until_ms;
    /* The models the worker lists at its own /v1/models when it was registered without a
     * model_id (worker_models.h): '\n'-separated names, NULL when none was read. */
    char *models_found;

    /* Private to registry.c. */
    atomic_long refcount;
    struct baton_worker_s *next;
} baton_worker_t;

typedef struct baton_registry_s baton_registry_t;

/* 0, or BATON_ENOMEM. */
int baton_registry_create(baton_registry_t **reg_p);

/*
 * Drops the registry's reference to every worker and frees the registry. Workers still
 * referenced by requests stay valid until they are unreferenced. No other call on this registry
 * may run concurrently or afterwards.
 */
void baton_registry_destroy(baton_registry_t *reg);

/*
 * Validates and registers a worker:
 *   BATON_EINVAL  bad URL (must be http://host[:port][/prefix]), bad role,
 *                 bootstrap_port out of 1..65535 or given for a non-prefill role, negative
 *                 priority/cost, labels_json not a JSON object; a field of another PD
 *                 protocol than the worker's (bootstrap_port on a vLLM worker, dp_size on a
 *                 vLLM worker other than a vllm-mooncake prefill,
 *                 engine_id/bootstrap_addr on a non-mooncake or non-prefill one), a
 *                 vllm-mooncake prefill without engine_id and bootstrap_addr, a vLLM protocol
 *                 on a regular worker, dp_size out of 0..1024;
 *   BATON_EEXIST  a registered worker already has this (normalized) URL;
 *   BATON_ENOMEM.
 * On failure and when err != NULL, a one-line human-readable reason is written to err
 * (errlen bytes, NUL-terminated). worker_p may be NULL; otherwise it receives a new reference.
 */
int baton_registry_add(baton_registry_t *reg, const baton_worker_spec_t *spec,
                       baton_worker_t **worker_p, char *err, size_t errlen);

/* The protocol of workers registered without one (default BATON_PD_SGLANG); set before
 * workers are added (a later change does not alter registered workers). */
void baton_registry_set_pd_default(baton_registry_t *reg, baton_pd_protocol_t p);

/* Removes by id or by URL (the URL is normalized first). 0 or BATON_ENOTFOUND. The worker is
 * marked removed and draining; requests holding references finish normally. */
int baton_registry_remove(baton_registry_t *reg, const char *id);
int baton_registry_remove_url(baton_registry_t *reg, const char *url);

/* A new reference to the registered worker with this id / URL, or NULL. */
baton_worker_t *baton_registry_get(baton_registry_t *reg, const char *id);
baton_worker_t *baton_registry_find_url(baton_registry_t *reg, const char *url);

/* Snapshot flags. */
#define BATON_SNAP_ALL 0u /* every registered worker of the role */
#define BATON_SNAP_ELIGIBLE                                                                        \
    1u /* only those a policy may pick: healthy, breaker not OPEN, not                             \
        * draining */

/*
 * Copies up to `cap` workers of `role` (BATON_ROLE_ANY for all roles) into out[], in
 * registration order, each with a NEW reference. Returns how many match in total, which may be
 * more than cap (like snprintf): only min(total, cap) were written and referenced. Release them
 * with baton_workers_unref(out, min(total, cap)).
 */
size_t baton_registry_snapshot(baton_registry_t *reg, baton_worker_role_t role, unsigned flags,
                               baton_worker_t **out, size_t cap);

/*
 * The same without a size limit: into stack[0..n_stack) when that holds every match, else into
 * a heap array with room for workers registered meanwhile. *ws_p is the array used; returns how
 * many references it holds. When no heap array can be had, the first n_stack matches are kept
 * (a partial view beats none). Release with baton_workers_release(*ws_p, n, stack).
 */
size_t baton_registry_snapshot_all(baton_registry_t *reg, baton_worker_role_t role, unsigned flags,
                                   baton_worker_t **stack, size_t n_stack, baton_worker_t ***ws_p);

/* Registered workers per role; counts[BATON_ROLE_COUNT]. `eligible` may be NULL; otherwise it
 * receives the per-role counts of BATON_SNAP_ELIGIBLE workers (for /readiness). */
void baton_registry_counts(baton_registry_t *reg, size_t counts[BATON_ROLE_COUNT],
                           size_t eligible[BATON_ROLE_COUNT]);

/* Total registered workers. */
size_t baton_registry_size(baton_registry_t *reg);

/* Monotonic change counter, starts at 1. */
uint64_t baton_registry_generation(baton_registry_t *reg);

/* State changes used by the health layer and the drain logic; each bumps the generation when
 * the value actually changes. Safe on removed workers (no effect on the registry then). */
void baton_registry_set_health(baton_registry_t *reg, baton_worker_t *w, baton_worker_health_t h);
void baton_registry_set_breaker(baton_registry_t *reg, baton_worker_t *w, baton_breaker_state_t s);
void baton_registry_set_draining(baton_registry_t *reg, baton_worker_t *w, int draining);

/* ---- per-worker references and counters (any thread, lock-free) ---- */

void baton_worker_ref(baton_worker_t *w);
/* Drops one reference; frees the worker when it was the last. NULL is ignored. */
void baton_worker_unref(baton_worker_t *w);
/* Unrefs ws[0..n). */
void baton_workers_unref(baton_worker_t **ws, size_t n);
/* 1 when w is one of ws[0..n). */
int baton_workers_contain(baton_worker_t *const *ws, size_t n, const baton_worker_t *w);
/* Unrefs ws[0..n) and frees ws unless it is `stack` (baton_registry_snapshot_all). */
void baton_workers_release(baton_worker_t **ws, size_t n, baton_worker_t **stack);

/* Call inc when a request is dispatched to the worker and dec when it ends (whatever the
 * outcome). power_of_two reads this. */
void baton_worker_in_flight_inc(baton_worker_t *w);
void baton_worker_in_flight_dec(baton_worker_t *w);
long baton_worker_in_flight(const baton_worker_t *w);

baton_worker_health_t baton_worker_health(const baton_worker_t *w);
baton_breaker_state_t baton_worker_breaker(const baton_worker_t *w);
int baton_worker_is_draining(const baton_worker_t *w);
int baton_worker_is_removed(const baton_worker_t *w);
/* uv_hrtime() at removal (the start of its drain), 0 while registered. */
uint64_t baton_worker_removed_ns(const baton_worker_t *w);
/* healthy && breaker != OPEN && !draining && !removed */
int baton_worker_is_eligible(const baton_worker_t *w);

/*
 * Normalizes a worker URL into out (outlen bytes): lowercase scheme and host, explicit port,
 * IPv6 host in brackets, path prefix without trailing '/'. 0 or BATON_EINVAL (also when out
 * is too small). parsed_p may be NULL.
 */
int baton_worker_url_normalize(const char *url, char *out, size_t outlen, baton_url_t *parsed_p);

/* 1 when k can be a worker's bearer key (it becomes an Authorization header): visible ASCII,
 * at least one byte (RFC 6750, RFC 9110); 0 otherwise (control bytes, spaces, empty). */
int baton_worker_api_key_ok(const char *k);
/* ---- shared registry (several routers over etcd) ----
 *
 * The registry itself stays local to one router. A synchroniser (router/control/etcd_sync.h)
 * mirrors a shared store into it, and learns through these hooks what an operator changed through
 * this router's admin API, so that it can publish the change to the store. Changes the synchroniser
 * applies itself are not published again (it calls add/remove directly, not publish_*).
 */
typedef struct baton_registry_hooks_s {
    /* After an admin API add / remove on this router; on that request's thread. The worker is
     * borrowed for the call. */
    void (*published_add)(void *ctx, const baton_worker_t *w);
    void (*published_remove)(void *ctx, const baton_worker_t *w);
    void *ctx;
} baton_registry_hooks_t;

/* Set once, before any router thread starts (not synchronised). */
void baton_registry_set_hooks(baton_registry_t *reg, const baton_registry_hooks_t *hooks);
/* Called by the admin API after its local change succeeded; no-op without hooks. */
void baton_registry_publish_add(baton_registry_t *reg, const baton_worker_t *w);
void baton_registry_publish_remove(baton_registry_t *reg, const baton_worker_t *w);

/* The shared store's state, shown by /readiness: source ("etcd"), whether it is reachable, and
 * a one-line detail. Thread-safe. shared_state returns 0 when no shared store is configured. */
void baton_registry_set_shared_state(baton_registry_t *reg, const char *source, int connected,
                                     const char *detail);
int baton_registry_shared_state(baton_registry_t *reg, char *source, size_t source_len,
                                int *connected_p, char *detail, size_t detail_len);

/* The KV-event subscriptions that follow this registry (kv_route.h), for the admin API's
 * worker view; set once before any router thread starts. NULL: none. */
struct baton_kvroute_s;
void baton_registry_set_kv(baton_registry_t *reg, struct baton_kvroute_s *kv);
struct baton_kvroute_s *baton_registry_kv(const baton_registry_t *reg);

/* Room for any normalized URL: "http://" + [host] + ":65535" + prefix, both at their max. */
#define BATON_WORKER_URL_MAX 600

#endif
