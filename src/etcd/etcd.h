/* etcd.h — etcd v3 client over the JSON gateway: calls, watches, fail-over, authentication. */
#ifndef BATON_ETCD_ETCD_H
#define BATON_ETCD_ETCD_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/*
 * etcd 3.4's gateway serves the gRPC API as JSON under /v3/: POST /v3/kv/range, /v3/kv/put,
 * /v3/kv/deleterange, /v3/lease/grant, /v3/lease/keepalive, /v3/watch (a stream of JSON
 * objects), /v3/auth/authenticate. Keys and values are base64 in the JSON; 64-bit integers
 * (revisions, lease ids) come back as strings. This client hides neither: callers build the
 * request bodies with the helpers below and read the result objects themselves, so every
 * gateway quirk stays visible in one place (baton_etcd_* helpers) instead of a wrapper per RPC.
 *
 * Endpoints: "etcd://host:port[,host:port...]/prefix", or "etcds://..." for etcd's client port
 * over TLS (what etcdctl calls https:// endpoints; the scheme ends in "s" as https and rediss
 * do, so one string still names every member and the prefix). A call goes to the current endpoint;
 * when it cannot be reached, times out or answers 5xx, the next endpoint is tried (each at most
 * once per call) before the call fails. The endpoint that answered stays current.
 *
 * Authentication: with a user name, the client gets a token from /v3/auth/authenticate before
 * its first call and again when etcd says the token is invalid (tokens expire), and sends it in
 * the Authorization header.
 *
 * TLS (etcds://): every connection goes through http/tls.h's client layer with the
 * configuration the caller passes: etcd's certificate must chain to its CA and name the
 * endpoint's host or IP; a client certificate in it answers etcd's --client-cert-auth. A
 * handshake or verification failure is a connection error (BATON_ETLS) like a refused connect:
 * the next endpoint is tried, and the TLS layer logs and counts the reason.
 *
 * Threading: a client belongs to one loop; every call and callback happens on its thread.
 * Callbacks never run inside the call that started the work; each call's callback runs exactly
 * once (BATON_ECANCELED when the client is closed first).
 */

typedef struct baton_etcd_s baton_etcd_t;
typedef struct baton_etcd_watch_s baton_etcd_watch_t;

#define BATON_ETCD_MAX_ENDPOINTS 16

typedef struct baton_etcd_url_s {
    size_t n;
    char host[BATON_ETCD_MAX_ENDPOINTS][256];
    int port[BATON_ETCD_MAX_ENDPOINTS];
    char prefix[256]; /* "/baton" style: starts with '/', no trailing '/' */
    int tls;          /* etcds:// */
} baton_etcd_url_t;

/* Parses "etcd[s]://h:p[,h:p...]/prefix" (the prefix is required, ports default to 2379).
 * 0, or BATON_EINVAL with the reason in err. */
int baton_etcd_url_parse(const char *url, baton_etcd_url_t *out, char *err, size_t errlen);

/*
 * result: the parsed JSON answer (borrowed, valid during the callback) when err is 0; err is
 * a connection or timeout error, BATON_EUPSTREAM (an error answer: its message in result's
 * "error"/"message" when there was a JSON body) or BATON_ECANCELED.
 */
typedef void (*baton_etcd_cb)(void *data, int err, json_t *result);

/*
 * user/password may be NULL (no authentication). Strings are copied. tls: a client
 * configuration (http/tls.h), required for an etcds:// URL and ignored for etcd://; not owned,
 * it must outlive the client (a reload of it applies to the next connections). BATON_EINVAL
 * for etcds:// without one.
 */
struct baton_tls_s;
int baton_etcd_create(baton_etcd_t **etcd_p, uv_loop_t *loop, const baton_etcd_url_t *url,
                      const char *user, const char *password, struct baton_tls_s *tls,
                      uint64_t timeout_ms);

/* Cancels every call and watch (their callbacks run with BATON_ECANCELED on later loop turns)
 * and frees the client once they have reported. */
void baton_etcd_close(baton_etcd_t *etcd);

/* "host:port" of the endpoint in use (for logs). */
const char *baton_etcd_endpoint(const baton_etcd_t *etcd);

/* POSTs body (not stolen) to api, e.g. "/v3/kv/range". 0 or BATON_ENOMEM/BATON_ESHUTDOWN. */
int baton_etcd_call(baton_etcd_t *etcd, const char *api, json_t *body, baton_etcd_cb cb,
                    void *data);

/*
 * Watches [key, range_end) from start_revision (0 = from now). on_msg runs once per message
 * of the stream (the "result" object: "created", "events", "compact_revision", "canceled"...);
 * on_end runs exactly once when the stream ends: an error, BATON_EEOF when etcd closed it, or
 * BATON_ECANCELED after baton_etcd_watch_cancel / close. The watch goes to the current
 * endpoint; on its end the caller decides how to resume (a new watch, maybe after a read).
 */
typedef void (*baton_etcd_msg_cb)(void *data, json_t *result);
int baton_etcd_watch(baton_etcd_watch_t **w_p, baton_etcd_t *etcd, const char *key,
                     const char *range_end, int64_t start_revision, baton_etcd_msg_cb on_msg,
                     baton_etcd_cb on_end, void *data);
void baton_etcd_watch_cancel(baton_etcd_watch_t *w);

/* "host:port" of the endpoint the watch's stream is on, written to out. Its own endpoint, not
 * the client's current one: another call's fail-over may have moved the client since. */
void baton_etcd_watch_endpoint(const baton_etcd_watch_t *w, char *out, size_t outlen);

/* ---- helpers for request bodies and results ---- */

/* A JSON string holding base64(s[0..len)), or NULL on ENOMEM. */
json_t *baton_etcd_b64(const char *s, size_t len);
/* Decodes a base64 JSON string into a new NUL-terminated buffer (free()); *len_p may be NULL.
 * NULL when v is not a string or not base64. */
char *baton_etcd_unb64(json_t *v, size_t *len_p);
/* The key just past every key starting with prefix (etcd's "range_end" for a prefix). */
void baton_etcd_prefix_end(const char *prefix, char *out, size_t outlen);
/* An int64 field the gateway writes as a string (or a number); def when absent or bad. */
int64_t baton_etcd_int(json_t *obj, const char *key, int64_t def);

#endif
