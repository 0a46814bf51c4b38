/* register.h — baton-worker --register: the worker's own key under an etcd prefix, on a lease
 * kept alive while it runs (the routers watching the prefix add and remove it). */
#ifndef BATON_WORKER_REGISTER_H
#define BATON_WORKER_REGISTER_H

#include <stdint.h>
#include <uv.h>

/*
 * Grants a lease of ttl_s seconds, puts PREFIX/workers/KEY_NAME = value_json (the router's
 * POST /workers body) on it, and renews the lease every ttl_s/3. When the lease is gone (etcd
 * lost it, or the worker could not reach etcd for longer than the TTL), it grants a new one and
 * puts the key again. A worker that dies stops renewing: the key expires after at most ttl_s,
 * and every router drops the worker.
 *
 * user/password: etcd authentication (NULL: none).
 * tls: for an etcds:// URL, the client TLS configuration (http/tls.h: etcd's CA, the worker's
 * client certificate); not owned, it must outlive the registration (main() destroys it after
 * the loop has ended). Ignored for etcd://.
 * Threading: one loop; everything runs on it. Strings are copied.
 */
typedef struct wk_register_s wk_register_t;

/* 0, or BATON_EINVAL (bad URL, or etcds:// without tls: reason in err) / BATON_ENOMEM. The
 * first grant starts at once. */
struct baton_tls_s;
int wk_register_start(wk_register_t **reg_p, uv_loop_t *loop, const char *etcd_url,
                      const char *user, const char *password, struct baton_tls_s *tls,
                      unsigned ttl_s, const char *key_name, const char *value_json, char *err,
                      size_t errlen);

/* Revokes the lease (the routers drop the worker now rather than after the TTL), then frees
 * everything; done (may be NULL) runs once that is over, on a later loop turn. */
void wk_register_stop(wk_register_t *reg, void (*done)(void *data), void *data);

#endif
