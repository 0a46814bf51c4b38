/* auth.h — who may call which route: API keys, the admin and metrics tokens, per-key rate limits.
 */
#ifndef BATON_ROUTER_AUTH_H
#define BATON_ROUTER_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "http/server.h"
#include "router/control/config.h"

/*
 * Threading: created on the main thread before the loops start; baton_auth_check and
 * baton_auth_rate may be called from every loop thread at once; baton_auth_reload runs on the
 * main thread (SIGHUP) while they do. The key sets are swapped under a lock, so a request sees
 * the old set or the new one, never a mix.
 * Ownership: the auth object copies what it needs from the config.
 *
 * Every secret comparison is constant-time in the secret's content (baton_auth_ct_equal), and
 * a presented key is compared with every configured key, so timing tells nothing about which
 * key or how much of one matched.
 */

typedef struct baton_auth_s baton_auth_t;

typedef enum {
    BATON_ROUTE_OPEN,      /* /health, /liveness, /readiness: always answered */
    BATON_ROUTE_METRICS,   /* /metrics: the metrics token when one is set */
    BATON_ROUTE_INFERENCE, /* everything else a client may call: an API key when keys are set */
    BATON_ROUTE_ADMIN,     /* the worker set: the admin token, else loopback clients only */
} baton_route_class_t;

typedef enum {
    BATON_AUTH_OK = 0,
    BATON_AUTH_NO_KEY,       /* 401 invalid_api_key: missing or wrong API key */
    BATON_AUTH_BAD_TOKEN,    /* 401: missing or wrong admin/metrics token */
    BATON_AUTH_NOT_LOOPBACK, /* 403: admin route without a token configured, remote client */
} baton_auth_result_t;

/* Reads the key and token files named in cfg. 0, or BATON_EINVAL / BATON_ENOMEM with the
 * reason in err (an unreadable file, an empty key file is allowed only with --api-key keys). */
int baton_auth_create(baton_auth_t **auth_p, const baton_config_t *cfg, char *err, size_t errlen);
void baton_auth_free(baton_auth_t *auth);

/* Re-reads the key and admin token files (SIGHUP). On a failure the old sets stay and the
 * reason is in err. 0 or BATON_EINVAL / BATON_ENOMEM. */
int baton_auth_reload(baton_auth_t *auth, char *err, size_t errlen);

/* Configured API keys now (from the flags and the file). */
size_t baton_auth_n_keys(baton_auth_t *auth);
/* Whether an admin token is configured. */
int baton_auth_has_admin_token(baton_auth_t *auth);

/* Decides whether req may call a route of class cls. */
baton_auth_result_t baton_auth_check(baton_auth_t *auth, const baton_http_req_t *req,
                                     baton_route_class_t cls);

/* The admin rule with a token the caller found elsewhere than the Bearer header (an inference
 * request's Bearer is its API key): the admin token when one is configured, else loopback. */
baton_auth_result_t baton_auth_check_admin(baton_auth_t *auth, const baton_http_req_t *req,
                                           const char *token);

/*
 * Takes one token from the caller's bucket (per API key; per client address when no keys are
 * configured): 1 allowed, 0 over the limit with *retry_after_s_p (>= 1) set. Always 1 without
 * --rate-limit. Call after baton_auth_check passed.
 */
int baton_auth_rate(baton_auth_t *auth, const baton_http_req_t *req, uint64_t now_ns,
                    unsigned *retry_after_s_p);

/* The priority class (router/dataplane/priority.h) of req's API key: `priority=CLASS` on its
 * line of the key file or its --api-key value; BATON_PRIO_NONE (-1) without a key, with a key
 * that matches none or has no class. Constant-time like baton_auth_check. */
int baton_auth_key_class(baton_auth_t *auth, const baton_http_req_t *req);

/* 1 when a (alen bytes) equals b (blen bytes). The time taken depends on the lengths only. */
int baton_auth_ct_equal(const void *a, size_t alen, const void *b, size_t blen);

/* Whether a peer ("127.0.0.1:5000", "[::1]:5000") is a loopback address. */
int baton_auth_peer_is_loopback(const char *peer);

/* The token of an "Authorization: Bearer TOKEN" header value, or NULL. */
const char *baton_auth_bearer(const baton_http_req_t *req);

#endif
