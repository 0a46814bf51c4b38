/* worker_desc.h — the worker descriptor declared once (an X-macro field list) and everything
 * derived from it: the config's, the registry spec's and the registered worker's fields, init,
 * dup, free, equal, from-JSON and to-JSON. */
#ifndef BATON_ROUTER_WORKER_DESC_H
#define BATON_ROUTER_WORKER_DESC_H

#include <jansson.h>
#include <stddef.h>

typedef enum {
    BATON_ROLE_PREFILL = 0,
    BATON_ROLE_DECODE = 1,
    BATON_ROLE_REGULAR = 2,
    BATON_ROLE_COUNT = 3,
    BATON_ROLE_ANY = -1 /* only as a filter argument */
} baton_worker_role_t;

/* The PD protocol a worker speaks. A request's pair always speaks one protocol: the decode is
 * picked among the workers of the prefill's protocol. */
typedef enum {
    BATON_PD_SGLANG = 0,        /* bootstrap_host/port/room injected, both legs at once */
    BATON_PD_VLLM_NIXL = 1,     /* two phases: prefill (max_tokens 1), then decode with the
                                 * prefill's kv_transfer_params */
    BATON_PD_VLLM_MOONCAKE = 2, /* one transfer_id minted per request, both legs at once */
    BATON_PD_COUNT = 3,
    BATON_PD_UNSET = -1 /* spec only: the registry's default (baton_registry_set_pd_default) */
} baton_pd_protocol_t;

/*
 * The fields, once: X(kind, name, json_key). Adding a field is one line here (and its kind's
 * rules below when it is of a new kind); the three structs, the copies, the comparison and both
 * JSON directions follow.
 *
 *   url             required "http://host[:port][/prefix]" (port 80 if absent); a registered
 *                   worker's is normalized (no trailing '/')
 *   role            JSON "worker_type": prefill | decode | regular (default regular)
 *   bootstrap_port  -1 = none (JSON null); 1..65535 and only for prefill (sglang)
 *   api_key         NULL = none; sent upstream as "Authorization: Bearer" (never shown by GET)
 *   model_id        NULL = none
 *   priority        >= 0, default 50 (higher = preferred; informational now)
 *   cost            >= 0, default 1.0 (informational now)
 *   labels_json     JSON "labels": an object, kept as compact text; NULL = none (a registered
 *                   worker's is "{}" then, never NULL)
 *   pd_protocol     UNSET = the router's --pd-protocol (a registered worker's is resolved)
 *   engine_id       vllm-mooncake prefill: its kv_transfer_config engine_id; NULL = none
 *   bootstrap_addr  vllm-mooncake prefill: "http://host:port" of its bootstrap; NULL = none
 *   dp_size         sglang, or a vllm-mooncake prefill: data-parallel ranks (0 = not DP)
 *   kv_events_endpoint         the worker's KV-event PUB socket, "tcp://host:port" or
 *                              "ipc://path" (docs/PROTOCOLS.md §7); NULL = none
 *   kv_events_replay_endpoint  its replay ROUTER socket; NULL = none
 */
#define BATON_WORKER_DESC_FIELDS(X)                                                                \
    X(URL, url, "url")                                                                             \
    X(ROLE, role, "worker_type")                                                                   \
    X(PORT, bootstrap_port, "bootstrap_port")                                                      \
    X(STR, api_key, "api_key")                                                                     \
    X(STR, model_id, "model_id")                                                                   \
    X(PRIO, priority, "priority")                                                                  \
    X(COST, cost, "cost")                                                                          \
    X(LABELS, labels_json, "labels")                                                               \
    X(PROTO, pd_protocol, "pd_protocol")                                                           \
    X(STR, engine_id, "engine_id")                                                                 \
    X(STR, bootstrap_addr, "bootstrap_addr")                                                       \
    X(DP, dp_size, "dp_size")                                                                      \
    X(ZMQ, kv_events_endpoint, "kv_events_endpoint")                                               \
    X(ZMQ, kv_events_replay_endpoint, "kv_events_replay_endpoint")

/* Each kind's C type: owned (T) and borrowed (CT). */
#define BATON__WD_T_URL     char *
#define BATON__WD_T_ROLE    baton_worker_role_t
#define BATON__WD_T_PORT    int
#define BATON__WD_T_STR     char *
#define BATON__WD_T_PRIO    int
#define BATON__WD_T_COST    double
#define BATON__WD_T_LABELS  char *
#define BATON__WD_T_PROTO   baton_pd_protocol_t
#define BATON__WD_T_DP      int
#define BATON__WD_T_ZMQ     char *
#define BATON__WD_CT_URL    const char *
#define BATON__WD_CT_ROLE   baton_worker_role_t
#define BATON__WD_CT_PORT   int
#define BATON__WD_CT_STR    const char *
#define BATON__WD_CT_PRIO   int
#define BATON__WD_CT_COST   double
#define BATON__WD_CT_LABELS const char *
#define BATON__WD_CT_PROTO  baton_pd_protocol_t
#define BATON__WD_CT_DP     int
#define BATON__WD_CT_ZMQ    const char *

/* Declares the fields inside a struct: owned strings, or borrowed ones. */
#define BATON_WORKER_DESC_DECL(kind, name, key)  BATON__WD_T_##kind name;
#define BATON_WORKER_DESC_CDECL(kind, name, key) BATON__WD_CT_##kind name;

/* A descriptor that owns its strings: a configured worker, a parsed POST /workers body. */
typedef struct baton_worker_desc_s {
    BATON_WORKER_DESC_FIELDS(BATON_WORKER_DESC_DECL)
} baton_worker_desc_t;

/* The same fields borrowing their strings for the duration of a call (what the registry takes
 * to register a worker). */
typedef struct baton_worker_spec_s {
    BATON_WORKER_DESC_FIELDS(BATON_WORKER_DESC_CDECL)
} baton_worker_spec_t;

/* Fills the defaults: strings NULL, role REGULAR, bootstrap_port -1, priority 50, cost 1.0,
 * pd_protocol UNSET, dp_size 0. */
void baton_worker_spec_init(baton_worker_spec_t *spec);
void baton_worker_desc_init(baton_worker_desc_t *d);
/* Frees d's strings and sets it back to the defaults. */
void baton_worker_desc_free(baton_worker_desc_t *d);
/* *dst = a copy of src that owns its strings (dst is overwritten, not freed). 0 or
 * BATON_ENOMEM (dst then holds nothing). */
int baton_worker_desc_dup(baton_worker_desc_t *dst, const baton_worker_spec_t *src);

/* Copies the fields (pointers, not strings) between any two structs declared with the list: a
 * borrowed view (spec) of a descriptor or a registered worker, or a descriptor's strings handed
 * to a worker and back. */
#define BATON__WD_COPY1(kind, name, key) wd__to->name = wd__from->name;
#define BATON_WORKER_DESC_COPY_FIELDS(to_p, from_p)                                                \
    do {                                                                                           \
        __typeof__(*(to_p)) *wd__to = (to_p);                                                      \
        const __typeof__(*(from_p)) *wd__from = (from_p);                                          \
        BATON_WORKER_DESC_FIELDS(BATON__WD_COPY1)                                                  \
    } while (0)

/*
 * 1 when a and b describe the same worker: URLs equal once normalized (an invalid URL equals
 * nothing), labels equal as JSON objects (NULL and {} alike, key order aside), every other field
 * equal as it is (an UNSET pd_protocol equals only UNSET: resolve it first where that matters).
 */
int baton_worker_spec_equal(const baton_worker_spec_t *a, const baton_worker_spec_t *b);

/*
 * A JSON object → d (initialised here, owning its strings). `strict` (a config file): an
 * unknown key is an error and null is accepted only where the field has a "none" (strings,
 * bootstrap_port, pd_protocol); otherwise (the admin API, a shared registry's value) unknown
 * keys are ignored and null means the default. The message names `where` ("workers[2]") when
 * given. 0, BATON_EINVAL (err says why) or BATON_ENOMEM; on failure d holds nothing.
 */
int baton_worker_desc_from_json(baton_worker_desc_t *d, json_t *obj, int strict, const char *where,
                                char *err, size_t errlen);

/* The fields as a JSON object (the keys above; labels as an object; "none" as null); the api
 * key only with `secrets` (what a shared registry stores; GET /workers never shows it). NULL
 * when out of memory. */
json_t *baton_worker_spec_to_json(const baton_worker_spec_t *s, int secrets);

#endif
