/* tls.h — TLS (mbedTLS) as a byte-transforming layer under the HTTP server and client. */
#ifndef BATON_HTTP_TLS_H
#define BATON_HTTP_TLS_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "common/buf.h"

/*
 * One integration of mbedTLS with libuv streams, used by both server.c and client.c. The layer
 * never touches a socket: the owner of a connection hands it the ciphertext it read and gets
 * back the plaintext (through a callback) and the ciphertext to write (appended to a buffer
 * the owner then writes with its own write path). So keep-alive, pipelining, timers and
 * back-pressure stay in the HTTP code, the same over TLS as over TCP; only the bytes change.
 *
 * Protocol: TLS 1.2 only. mbedTLS 2.28 (Debian 12) has TLS 1.3 only as an experimental
 * client-side option that the Debian build leaves off, so 1.3 is not offered. Suites: ECDHE
 * with AES-GCM or ChaCha20-Poly1305 (AEAD, forward secret) only. ALPN: http/1.1. Session
 * tickets (server) and session reuse (client). Renegotiation is refused and ends the
 * connection.
 *
 * Threading: a baton_tls_t is shared by every loop of the process; baton_tls_reload() may run
 * on any thread. A connection (baton_tls_conn_t) belongs to its owner's loop. Connections keep
 * the certificate generation they started with, so a reload never disturbs them.
 */

typedef struct baton_tls_s baton_tls_t;
typedef struct baton_tls_conn_s baton_tls_conn_t;
typedef struct baton_tls_session_s baton_tls_session_t;

typedef enum {
    BATON_TLS_SERVER = 0,
    BATON_TLS_CLIENT = 1,
} baton_tls_role_t;

typedef struct baton_tls_opts_s {
    /* Server: the certificate chain (PEM, leaf first) and key; required.
     * Client: a client certificate for mTLS; optional (both or neither). */
    const char *cert_file;
    const char *key_file;
    /* Server: when set, clients must present a certificate that chains to it (mTLS).
     * Client: the CA bundle peers are verified against; when NULL the system bundle is used.
     * A client always verifies the peer's chain and its host name or IP address. */
    const char *ca_file;
} baton_tls_opts_t;

/* Why a TLS connection ended early: one metric label each. */
#define BATON_TLS_REASON_MAP(XX)                                                                   \
    XX(PLAINTEXT, "plaintext_http")                                                                \
    XX(GARBAGE, "bad_record")                                                                      \
    XX(TRUNCATED, "truncated_handshake")                                                           \
    XX(TIMEOUT, "handshake_timeout")                                                               \
    XX(RENEGOTIATION, "renegotiation")                                                             \
    XX(CERT_EXPIRED, "cert_expired")                                                               \
    XX(CERT_UNTRUSTED, "cert_untrusted")                                                           \
    XX(CERT_WRONG_HOST, "cert_wrong_host")                                                         \
    XX(CERT_MISSING, "cert_missing")                                                               \
    XX(CERT_OTHER, "cert_invalid")                                                                 \
    XX(PROTOCOL, "handshake_failed")                                                               \
    XX(INTERNAL, "internal_error")

typedef enum {
#define XX(name, label) BATON_TLS_R_##name,
    BATON_TLS_REASON_MAP(XX)
#undef XX
        BATON_TLS_R_COUNT
} baton_tls_reason_t;

/* "plaintext_http", ... */
const char *baton_tls_reason_label(baton_tls_reason_t reason);

/*
 * Loads the files and builds the configuration. 0, or BATON_EINVAL with a message in err
 * (which file, what mbedTLS said).
 */
int baton_tls_create(baton_tls_t **tls_p, baton_tls_role_t role, const baton_tls_opts_t *opts,
                     char *err, size_t errlen);

/*
 * Reads the same files again (SIGHUP). New connections use the new certificates; established
 * ones keep theirs. On failure the previous generation stays in use and err says why.
 */
int baton_tls_reload(baton_tls_t *tls, char *err, size_t errlen);

/* Frees the configuration; connections still open keep their generation alive until freed. */
void baton_tls_destroy(baton_tls_t *tls);

/* Process-wide counters since start, for metrics (relaxed atomics; any thread). */
typedef struct baton_tls_stats_s {
    uint64_t handshakes[2];                  /* completed, by role */
    uint64_t resumed[2];                     /* of which abbreviated (ticket / session reuse) */
    uint64_t failures[2][BATON_TLS_R_COUNT]; /* by role and reason */
    uint64_t reloads, reload_failures;
} baton_tls_stats_t;
void baton_tls_stats(baton_tls_stats_t *out);

/*
 * Publishes the counters above into a Prometheus registry as well (router and worker):
 * baton_tls_handshakes_total{side}, baton_tls_failures_total{side,reason},
 * baton_tls_resumed_total{side}, baton_tls_reloads_total{result}. Once per process; 0 or
 * BATON_ENOMEM.
 */
struct baton_metrics_s;
int baton_tls_metrics_init(struct baton_metrics_s *reg);

/* ---- connections ---- */

/*
 * Plaintext delivery: return 0 to go on, non-zero to stop (the owner is closing the
 * connection; the rest of the input is dropped). `data` is valid only during the call.
 */
typedef int (*baton_tls_plain_cb)(void *owner, const char *data, size_t len);

/*
 * A connection over `tls`'s current generation. For a client, `host` is the name or IP literal
 * the peer's certificate must match (and the SNI sent when it is a name); NULL for a server.
 */
int baton_tls_conn_create(baton_tls_conn_t **tc_p, baton_tls_t *tls, const char *host);
void baton_tls_conn_free(baton_tls_conn_t *tc);

/* A client starts the handshake: the ClientHello is appended to `out`. 0 or BATON_ETLS. */
int baton_tls_conn_start(baton_tls_conn_t *tc, baton_buf_t *out);

/*
 * Feeds ciphertext read from the socket. Handshake replies are appended to `out` (write them
 * even when this fails: they may carry the alert), decrypted bytes go to plain_cb. Returns 0,
 * 1 when the peer sent close_notify (treat as EOF), or BATON_ETLS: the connection must be
 * closed; baton_tls_conn_reason() says why (already counted and logged, rate-limited).
 */
int baton_tls_conn_feed(baton_tls_conn_t *tc, const char *data, size_t len, baton_buf_t *out,
                        baton_tls_plain_cb plain_cb, void *owner);

/* Encrypts bufs into `out`. Only after the handshake. 0 or BATON_ETLS. */
int baton_tls_conn_encrypt(baton_tls_conn_t *tc, const uv_buf_t *bufs, unsigned n,
                           baton_buf_t *out);

/* The close_notify alert, appended to `out` (best effort). */
void baton_tls_conn_close_notify(baton_tls_conn_t *tc, baton_buf_t *out);

/*
 * Client session resumption: a session slot (one per upstream pool; owned by one loop) whose
 * session a new connection offers, and which gets the connection's session once its handshake
 * is done. Call before baton_tls_conn_start; `s` must outlive `tc`'s handshake.
 */
baton_tls_session_t *baton_tls_session_new(void); /* NULL when out of memory */
void baton_tls_session_free(baton_tls_session_t *s);
void baton_tls_conn_use_session(baton_tls_conn_t *tc, baton_tls_session_t *s);

/* 1 when the handshake resumed a session (a ticket) rather than doing a full one. */
int baton_tls_conn_resumed(const baton_tls_conn_t *tc);

/* 1 once the handshake finished. */
int baton_tls_conn_established(const baton_tls_conn_t *tc);

/* The handshake could not finish in time (the owner's header/connect timer): counted, logged. */
void baton_tls_conn_timed_out(baton_tls_conn_t *tc);

/* The peer closed the socket: a handshake cut short is counted and logged (truncated). */
void baton_tls_conn_eof(baton_tls_conn_t *tc);

/* Why the connection failed (valid after BATON_ETLS). */
baton_tls_reason_t baton_tls_conn_reason(const baton_tls_conn_t *tc);

/* For logs: the peer ("127.0.0.1:5555") the layer names in its lines; copied. */
void baton_tls_conn_set_peer(baton_tls_conn_t *tc, const char *peer);

#endif
