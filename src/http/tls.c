/* tls.c — mbedTLS under the HTTP server and client: configurations, reload, per-connection I/O. */
#include "http/tls.h"

#include "baton/error.h"
#include "common/log.h"
#include "common/metrics.h"

#include <mbedtls/asn1.h>
#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>
#include <mbedtls/error.h>
#include <mbedtls/oid.h>
#include <mbedtls/pk.h>
#include <mbedtls/ssl.h>
#include <mbedtls/ssl_ticket.h>
#include <mbedtls/x509_crt.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The system CA bundle (ca-certificates) a client falls back to without --upstream-ca. */
#define SYSTEM_CA_BUNDLE "/etc/ssl/certs/ca-certificates.crt"
/* Rate limit of the per-connection failure lines: an outside party can trigger them at will. */
#define LOG_LINES_PER_SEC 10
/* Session tickets stay valid this long (seconds); the ticket keys rotate at the same pace. */
#define TICKET_LIFETIME_S 86400
/* Largest TLS record body we accept on the wire (2^14 plaintext + expansion, RFC 5246 6.2.3). */
#define MAX_RECORD_LEN (16384 + 2048)

/* Modern suites only: forward-secret key exchange, AEAD ciphers. */
static const int suites[] = {
    MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    MBEDTLS_TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    MBEDTLS_TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    MBEDTLS_TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    MBEDTLS_TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    MBEDTLS_TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    0,
};
/* P-256 first: with its NIST reduction it is mbedTLS 2.28's fastest ECDHE curve (measured:
 * about 20% more full handshakes/s than X25519, whose arithmetic is generic there). */
static const mbedtls_ecp_group_id curves[] = {
    MBEDTLS_ECP_DP_SECP256R1,
    MBEDTLS_ECP_DP_CURVE25519,
    MBEDTLS_ECP_DP_SECP384R1,
    MBEDTLS_ECP_DP_NONE,
};
static const char *alpn[] = {"http/1.1", NULL};

static const char *const reason_labels[] = {
#define XX(name, label) label,
    BATON_TLS_REASON_MAP(XX)
#undef XX
};

const char *baton_tls_reason_label(baton_tls_reason_t reason)
{
    return (unsigned)reason < BATON_TLS_R_COUNT ? reason_labels[reason] : "unknown";
}

/* ---------------------------------------------------------------------------------------- */
/* Counters                                                                                  */

static _Atomic uint64_t st_handshakes[2], st_resumed[2], st_fail[2][BATON_TLS_R_COUNT];
static _Atomic uint64_t st_reloads, st_reload_failures;
/* Prometheus children, set once by baton_tls_metrics_init (NULL until then: no-ops). */
static baton_metric_child_t *_Atomic m_handshakes[2], *_Atomic m_fail[2][BATON_TLS_R_COUNT];
static baton_metric_child_t *_Atomic m_reload[2], *_Atomic m_resumed[2];
/* The failure lines' limiter (common/log.h): an outside party can trigger them at will. */
static baton_log_limit_t fail_log = BATON_LOG_LIMIT_INIT("tls_failed", LOG_LINES_PER_SEC);

void baton_tls_stats(baton_tls_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    for (int r = 0; r < 2; r++) {
        out->handshakes[r] = atomic_load_explicit(&st_handshakes[r], memory_order_relaxed);
        out->resumed[r] = atomic_load_explicit(&st_resumed[r], memory_order_relaxed);
        for (int i = 0; i < BATON_TLS_R_COUNT; i++)
            out->failures[r][i] = atomic_load_explicit(&st_fail[r][i], memory_order_relaxed);
    }
    out->reloads = atomic_load_explicit(&st_reloads, memory_order_relaxed);
    out->reload_failures = atomic_load_explicit(&st_reload_failures, memory_order_relaxed);
}

static const char *const side_names[2] = {"server", "client"};

int baton_tls_metrics_init(baton_metrics_t *reg)
{
    static const char *const side_l[] = {"side"};
    static const char *const fail_l[] = {"side", "reason"};
    static const char *const reload_l[] = {"result"};
    baton_metric_family_t *hs = baton_metrics_counter(reg, "baton_tls_handshakes_total",
                                                      "TLS handshakes completed", 1, side_l);
    baton_metric_family_t *fail = baton_metrics_counter(
        reg, "baton_tls_failures_total",
        "TLS connections ended early (handshake, certificate, protocol), by reason", 2, fail_l);
    baton_metric_family_t *rl = baton_metrics_counter(
        reg, "baton_tls_reloads_total", "certificate/key reloads (SIGHUP)", 1, reload_l);
    baton_metric_family_t *res = baton_metrics_counter(
        reg, "baton_tls_resumed_total",
        "TLS handshakes that resumed a session (ticket) instead of a full handshake", 1, side_l);
    if (hs == NULL || fail == NULL || rl == NULL || res == NULL)
        return BATON_ENOMEM;
    for (int s = 0; s < 2; s++) {
        const char *sv[] = {side_names[s]};
        baton_metric_child_t *c = baton_metric_child(hs, sv);
        baton_counter_add(c, (double)atomic_load(&st_handshakes[s]));
        atomic_store(&m_handshakes[s], c);
        c = baton_metric_child(res, sv);
        baton_counter_add(c, (double)atomic_load(&st_resumed[s]));
        atomic_store(&m_resumed[s], c);
        for (int i = 0; i < BATON_TLS_R_COUNT; i++) {
            const char *fv[] = {side_names[s], reason_labels[i]};
            c = baton_metric_child(fail, fv);
            baton_counter_add(c, (double)atomic_load(&st_fail[s][i]));
            atomic_store(&m_fail[s][i], c);
        }
    }
    const char *ok[] = {"ok"}, *bad[] = {"failed"};
    atomic_store(&m_reload[0], baton_metric_child(rl, ok));
    atomic_store(&m_reload[1], baton_metric_child(rl, bad));
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Randomness: one DRBG per thread, so loops never contend on a lock for it                    */

typedef struct rng_s {
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context drbg;
} rng_t;

static pthread_key_t rng_key;
static pthread_once_t rng_once = PTHREAD_ONCE_INIT;

static void rng_free(void *p)
{
    rng_t *r = p;
    mbedtls_ctr_drbg_free(&r->drbg);
    mbedtls_entropy_free(&r->entropy);
    free(r);
}

static void rng_key_init(void)
{
    pthread_key_create(&rng_key, rng_free);
}

static int rng_thread(void *unused, unsigned char *out, size_t len)
{
    (void)unused;
    pthread_once(&rng_once, rng_key_init);
    rng_t *r = pthread_getspecific(rng_key);
    if (r == NULL) {
        r = calloc(1, sizeof(*r));
        if (r == NULL)
            return MBEDTLS_ERR_CTR_DRBG_ENTROPY_SOURCE_FAILED;
        mbedtls_entropy_init(&r->entropy);
        mbedtls_ctr_drbg_init(&r->drbg);
        static const unsigned char pers[] = "baton-tls";
        if (mbedtls_ctr_drbg_seed(&r->drbg, mbedtls_entropy_func, &r->entropy, pers,
                                  sizeof(pers) - 1) != 0) {
            rng_free(r);
            return MBEDTLS_ERR_CTR_DRBG_ENTROPY_SOURCE_FAILED;
        }
        pthread_setspecific(rng_key, r);
    }
    return mbedtls_ctr_drbg_random(&r->drbg, out, len);
}

/* ---------------------------------------------------------------------------------------- */
/* Configurations: a generation per (re)load, shared by reference with its connections        */

typedef struct gen_s {
    _Atomic unsigned refs;
    mbedtls_ssl_config conf;
    mbedtls_x509_crt chain;
    mbedtls_x509_crt ca;
    mbedtls_pk_context key;
} gen_t;

struct baton_tls_s {
    baton_tls_role_t role;
    char *cert_file, *key_file, *ca_file;
    pthread_mutex_t lock; /* guards cur */
    gen_t *cur;
    /* Kept across reloads, so tickets issued before a reload still resume after it. */
    mbedtls_ssl_ticket_context ticket;
};

static void gen_unref(gen_t *g)
{
    if (g == NULL || atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) != 1)
        return;
    mbedtls_ssl_config_free(&g->conf);
    mbedtls_x509_crt_free(&g->chain);
    mbedtls_x509_crt_free(&g->ca);
    mbedtls_pk_free(&g->key);
    free(g);
}

static gen_t *gen_current(baton_tls_t *tls)
{
    pthread_mutex_lock(&tls->lock);
    gen_t *g = tls->cur;
    atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);
    pthread_mutex_unlock(&tls->lock);
    return g;
}

static void set_err(char *err, size_t errlen, const char *what, const char *file, int rc)
{
    char m[160] = "";
    if (rc)
        mbedtls_strerror(rc, m, sizeof(m));
    if (err && errlen)
        snprintf(err, errlen, "%s %s: %s", what, file ? file : "", rc ? m : "missing");
}

/* mbedTLS reports a missing or unreadable file as "PK - Read/write of file failed"; the
 * operator needs the file and the system's reason. 1 (with the message) when it cannot be read. */
static int unreadable(const char *file, char *err, size_t errlen)
{
    FILE *f = fopen(file, "rb");
    if (f != NULL) {
        fclose(f);
        return 0;
    }
    if (err && errlen)
        snprintf(err, errlen, "cannot read %s: %s", file, strerror(errno));
    return 1;
}

static int ticket_parse(void *p_ticket, mbedtls_ssl_session *session, unsigned char *buf,
                        size_t len);

static int gen_build(baton_tls_t *tls, gen_t **gen_p, char *err, size_t errlen)
{
    gen_t *g = calloc(1, sizeof(*g));
    if (g == NULL)
        return BATON_ENOMEM;
    atomic_init(&g->refs, 1);
    mbedtls_ssl_config_init(&g->conf);
    mbedtls_x509_crt_init(&g->chain);
    mbedtls_x509_crt_init(&g->ca);
    mbedtls_pk_init(&g->key);
    int server = tls->role == BATON_TLS_SERVER;
    int rc = 0;
    const char *files[3] = {tls->cert_file, tls->key_file, tls->ca_file};
    for (int i = 0; i < 3; i++)
        if (files[i] && unreadable(files[i], err, errlen)) {
            rc = BATON_EINVAL;
            goto fail;
        }
    if (tls->cert_file && (rc = mbedtls_x509_crt_parse_file(&g->chain, tls->cert_file)) != 0) {
        set_err(err, errlen, "certificate", tls->cert_file, rc);
        goto fail;
    }
    if (tls->key_file && (rc = mbedtls_pk_parse_keyfile(&g->key, tls->key_file, NULL)) != 0) {
        set_err(err, errlen, "key", tls->key_file, rc);
        goto fail;
    }
    if (tls->cert_file && (rc = mbedtls_pk_check_pair(&g->chain.pk, &g->key)) != 0) {
        set_err(err, errlen, "key does not match certificate", tls->cert_file, rc);
        goto fail;
    }
    const char *ca = tls->ca_file;
    if (!server && ca == NULL)
        ca = SYSTEM_CA_BUNDLE;
    if (ca && (rc = mbedtls_x509_crt_parse_file(&g->ca, ca)) != 0) {
        set_err(err, errlen, "CA bundle", ca, rc);
        goto fail;
    }
    rc = mbedtls_ssl_config_defaults(&g->conf,
                                     server ? MBEDTLS_SSL_IS_SERVER : MBEDTLS_SSL_IS_CLIENT,
                                     MBEDTLS_SSL_TRANSPORT_STREAM, MBEDTLS_SSL_PRESET_DEFAULT);
    if (rc) {
        set_err(err, errlen, "configuration", "", rc);
        goto fail;
    }
    mbedtls_ssl_conf_rng(&g->conf, rng_thread, NULL);
    mbedtls_ssl_conf_min_version(&g->conf, MBEDTLS_SSL_MAJOR_VERSION_3,
                                 MBEDTLS_SSL_MINOR_VERSION_3);
    mbedtls_ssl_conf_max_version(&g->conf, MBEDTLS_SSL_MAJOR_VERSION_3,
                                 MBEDTLS_SSL_MINOR_VERSION_3);
    mbedtls_ssl_conf_ciphersuites(&g->conf, suites);
    mbedtls_ssl_conf_curves(&g->conf, curves);
    mbedtls_ssl_conf_renegotiation(&g->conf, MBEDTLS_SSL_RENEGOTIATION_DISABLED);
    mbedtls_ssl_conf_alpn_protocols(&g->conf, alpn);
    if (tls->cert_file && (rc = mbedtls_ssl_conf_own_cert(&g->conf, &g->chain, &g->key)) != 0) {
        set_err(err, errlen, "certificate", tls->cert_file, rc);
        goto fail;
    }
    if (ca) {
        mbedtls_ssl_conf_ca_chain(&g->conf, &g->ca, NULL);
        mbedtls_ssl_conf_authmode(&g->conf, MBEDTLS_SSL_VERIFY_REQUIRED);
    } else {
        mbedtls_ssl_conf_authmode(&g->conf, MBEDTLS_SSL_VERIFY_NONE);
    }
    if (server)
        mbedtls_ssl_conf_session_tickets_cb(&g->conf, mbedtls_ssl_ticket_write, ticket_parse,
                                            &tls->ticket);
    *gen_p = g;
    return 0;
fail:
    gen_unref(g);
    return BATON_EINVAL;
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

void baton_tls_destroy(baton_tls_t *tls)
{
    if (tls == NULL)
        return;
    gen_unref(tls->cur);
    if (tls->role == BATON_TLS_SERVER)
        mbedtls_ssl_ticket_free(&tls->ticket);
    pthread_mutex_destroy(&tls->lock);
    free(tls->cert_file);
    free(tls->key_file);
    free(tls->ca_file);
    free(tls);
}

int baton_tls_create(baton_tls_t **tls_p, baton_tls_role_t role, const baton_tls_opts_t *opts,
                     char *err, size_t errlen)
{
    if (tls_p == NULL || opts == NULL || (role != BATON_TLS_SERVER && role != BATON_TLS_CLIENT))
        return BATON_EINVAL;
    if ((opts->cert_file == NULL) != (opts->key_file == NULL) ||
        (role == BATON_TLS_SERVER && opts->cert_file == NULL)) {
        if (err && errlen)
            snprintf(err, errlen, "a certificate and its key go together");
        return BATON_EINVAL;
    }
    baton_tls_t *tls = calloc(1, sizeof(*tls));
    if (tls == NULL)
        return BATON_ENOMEM;
    tls->role = role;
    pthread_mutex_init(&tls->lock, NULL);
    tls->cert_file = dup_or_null(opts->cert_file);
    tls->key_file = dup_or_null(opts->key_file);
    tls->ca_file = dup_or_null(opts->ca_file);
    if (role == BATON_TLS_SERVER) {
        mbedtls_ssl_ticket_init(&tls->ticket);
        int rc = mbedtls_ssl_ticket_setup(&tls->ticket, rng_thread, NULL,
                                          MBEDTLS_CIPHER_AES_256_GCM, TICKET_LIFETIME_S);
        if (rc) {
            set_err(err, errlen, "session tickets", "", rc);
            tls->role = BATON_TLS_SERVER;
            baton_tls_destroy(tls);
            return BATON_EINVAL;
        }
    }
    int rc = gen_build(tls, &tls->cur, err, errlen);
    if (rc) {
        baton_tls_destroy(tls);
        return rc;
    }
    *tls_p = tls;
    return 0;
}

int baton_tls_reload(baton_tls_t *tls, char *err, size_t errlen)
{
    gen_t *g = NULL;
    int rc = gen_build(tls, &g, err, errlen);
    if (rc) {
        atomic_fetch_add_explicit(&st_reload_failures, 1, memory_order_relaxed);
        baton_counter_add(atomic_load_explicit(&m_reload[1], memory_order_relaxed), 1);
        return rc;
    }
    pthread_mutex_lock(&tls->lock);
    gen_t *old = tls->cur;
    tls->cur = g;
    pthread_mutex_unlock(&tls->lock);
    gen_unref(old); /* freed when its last connection goes */
    atomic_fetch_add_explicit(&st_reloads, 1, memory_order_relaxed);
    baton_counter_add(atomic_load_explicit(&m_reload[0], memory_order_relaxed), 1);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Connections                                                                               */

struct baton_tls_session_s {
    mbedtls_ssl_session sess;
    int valid;
};

baton_tls_session_t *baton_tls_session_new(void)
{
    baton_tls_session_t *s = calloc(1, sizeof(*s));
    if (s)
        mbedtls_ssl_session_init(&s->sess);
    return s;
}

void baton_tls_session_free(baton_tls_session_t *s)
{
    if (s == NULL)
        return;
    mbedtls_ssl_session_free(&s->sess);
    free(s);
}

struct baton_tls_conn_s {
    mbedtls_ssl_context ssl;
    gen_t *gen;
    baton_tls_role_t role;
    /* The ciphertext being fed and the buffer outgoing records go to, during a call only. */
    const unsigned char *in;
    size_t in_len;
    baton_buf_t *out;
    int out_err;
    /* Record framing seen on the wire, tracked ahead of mbedTLS (renegotiation, plaintext). */
    unsigned char rec_hdr[5];
    unsigned rec_hdr_have;
    size_t rec_body_left;
    uint64_t bytes_in;
    baton_tls_reason_t reason;
    baton_tls_session_t *session; /* client: offered, then replaced by the new one */
    unsigned established : 1;
    unsigned failed : 1;
    unsigned ip_check : 1;
    unsigned resumed : 1;
    unsigned char ip[16];
    size_t ip_len;
    char host[256];
    char peer[64];
};

static int bio_send(void *ctx, const unsigned char *buf, size_t len)
{
    baton_tls_conn_t *tc = ctx;
    if (tc->out == NULL || baton_buf_append(tc->out, buf, len) != 0) {
        tc->out_err = 1;
        return MBEDTLS_ERR_SSL_ALLOC_FAILED;
    }
    return (int)len;
}

static int bio_recv(void *ctx, unsigned char *buf, size_t len)
{
    baton_tls_conn_t *tc = ctx;
    if (tc->in_len == 0)
        return MBEDTLS_ERR_SSL_WANT_READ;
    size_t n = len < tc->in_len ? len : tc->in_len;
    memcpy(buf, tc->in, n);
    tc->in += n;
    tc->in_len -= n;
    return (int)n;
}

/* Walks the subjectAltName extension for an iPAddress entry equal to want (mbedTLS 2.28 lists
 * only dNSName entries in subject_alt_names, so IP-addressed workers are checked here). */
static int san_has_ip(const mbedtls_x509_crt *crt, const unsigned char *want, size_t want_len)
{
    unsigned char *p = crt->v3_ext.p, *end = p + crt->v3_ext.len;
    size_t len;
    if (p == NULL ||
        mbedtls_asn1_get_tag(&p, end, &len, MBEDTLS_ASN1_CONSTRUCTED | MBEDTLS_ASN1_SEQUENCE) != 0)
        return 0;
    end = p + len;
    while (p < end) {
        if (mbedtls_asn1_get_tag(&p, end, &len, MBEDTLS_ASN1_CONSTRUCTED | MBEDTLS_ASN1_SEQUENCE))
            return 0;
        unsigned char *ext_end = p + len;
        mbedtls_asn1_buf oid;
        if (mbedtls_asn1_get_tag(&p, ext_end, &oid.len, MBEDTLS_ASN1_OID))
            return 0;
        oid.p = p;
        p += oid.len;
        if (MBEDTLS_OID_CMP(MBEDTLS_OID_SUBJECT_ALT_NAME, &oid) != 0) {
            p = ext_end;
            continue;
        }
        int critical;
        if (p < ext_end && *p == MBEDTLS_ASN1_BOOLEAN &&
            mbedtls_asn1_get_bool(&p, ext_end, &critical) != 0)
            return 0;
        if (mbedtls_asn1_get_tag(&p, ext_end, &len, MBEDTLS_ASN1_OCTET_STRING) ||
            mbedtls_asn1_get_tag(&p, ext_end, &len,
                                 MBEDTLS_ASN1_CONSTRUCTED | MBEDTLS_ASN1_SEQUENCE))
            return 0;
        unsigned char *names_end = p + len;
        while (p < names_end) {
            unsigned char tag = *p++;
            if (mbedtls_asn1_get_len(&p, names_end, &len))
                return 0;
            if (tag == (MBEDTLS_ASN1_CONTEXT_SPECIFIC | MBEDTLS_X509_SAN_IP_ADDRESS) &&
                len == want_len && memcmp(p, want, len) == 0)
                return 1;
            p += len;
        }
        return 0;
    }
    return 0;
}

static int verify_ip_cb(void *ctx, mbedtls_x509_crt *crt, int depth, uint32_t *flags)
{
    baton_tls_conn_t *tc = ctx;
    if (depth == 0 && !san_has_ip(crt, tc->ip, tc->ip_len))
        *flags |= MBEDTLS_X509_BADCERT_CN_MISMATCH;
    return 0;
}

int baton_tls_conn_create(baton_tls_conn_t **tc_p, baton_tls_t *tls, const char *host)
{
    baton_tls_conn_t *tc = calloc(1, sizeof(*tc));
    if (tc == NULL)
        return BATON_ENOMEM;
    tc->role = tls->role;
    tc->gen = gen_current(tls);
    mbedtls_ssl_init(&tc->ssl);
    int rc = mbedtls_ssl_setup(&tc->ssl, &tc->gen->conf);
    if (rc == 0 && tls->role == BATON_TLS_CLIENT && host) {
        snprintf(tc->host, sizeof(tc->host), "%s", host);
        if (uv_inet_pton(AF_INET, host, tc->ip) == 0)
            tc->ip_len = 4;
        else if (uv_inet_pton(AF_INET6, host, tc->ip) == 0)
            tc->ip_len = 16;
        if (tc->ip_len) {
            /* No SNI for an address (RFC 6066 3); the address is checked against the SANs. */
            tc->ip_check = 1;
            mbedtls_ssl_set_verify(&tc->ssl, verify_ip_cb, tc);
        } else {
            rc = mbedtls_ssl_set_hostname(&tc->ssl, host);
        }
    }
    if (rc) {
        baton_tls_conn_free(tc);
        return BATON_ENOMEM;
    }
    mbedtls_ssl_set_bio(&tc->ssl, tc, bio_send, bio_recv, NULL);
    snprintf(tc->peer, sizeof(tc->peer), "%s", host ? host : "?");
    *tc_p = tc;
    return 0;
}

void baton_tls_conn_free(baton_tls_conn_t *tc)
{
    if (tc == NULL)
        return;
    mbedtls_ssl_free(&tc->ssl);
    gen_unref(tc->gen);
    free(tc);
}

void baton_tls_conn_set_peer(baton_tls_conn_t *tc, const char *peer)
{
    snprintf(tc->peer, sizeof(tc->peer), "%s", peer);
}

void baton_tls_conn_use_session(baton_tls_conn_t *tc, baton_tls_session_t *s)
{
    if (tc->role != BATON_TLS_CLIENT || s == NULL)
        return;
    tc->session = s;
    if (s->valid && mbedtls_ssl_set_session(&tc->ssl, &s->sess) != 0)
        s->valid = 0; /* unusable: a full handshake replaces it */
}

int baton_tls_conn_resumed(const baton_tls_conn_t *tc)
{
    return tc->resumed;
}

int baton_tls_conn_established(const baton_tls_conn_t *tc)
{
    return tc->established;
}

baton_tls_reason_t baton_tls_conn_reason(const baton_tls_conn_t *tc)
{
    return tc->reason;
}

static const char *role_name(const baton_tls_conn_t *tc)
{
    return tc->role == BATON_TLS_SERVER ? "server" : "client";
}

/* Counts and logs the failure once; always returns BATON_ETLS. */
static int conn_fail(baton_tls_conn_t *tc, baton_tls_reason_t reason, int mbed_rc)
{
    if (tc->failed)
        return BATON_ETLS;
    tc->failed = 1;
    tc->reason = reason;
    atomic_fetch_add_explicit(&st_fail[tc->role][reason], 1, memory_order_relaxed);
    baton_counter_add(atomic_load_explicit(&m_fail[tc->role][reason], memory_order_relaxed), 1);
    if (baton_log_enabled(BATON_LOG_WARN) &&
        baton_log_limit_pass(&fail_log, BATON_LOG_WARN, "tls")) {
        char m[128] = "-";
        if (mbed_rc)
            mbedtls_strerror(mbed_rc, m, sizeof(m));
        char vinfo[256] = "";
        uint32_t flags = mbedtls_ssl_get_verify_result(&tc->ssl);
        if (flags && flags != (uint32_t)-1) {
            int n = mbedtls_x509_crt_verify_info(vinfo, sizeof(vinfo), "", flags);
            for (int i = 0; i < n; i++)
                if (vinfo[i] == '\n')
                    vinfo[i] = ';';
        }
        log_warn("tls", "tls_failed side=%s peer=%s reason=%s established=%d detail=\"%s%s%s\"",
                 role_name(tc), tc->peer, baton_tls_reason_label(reason), tc->established, m,
                 vinfo[0] ? " " : "", vinfo);
    }
    return BATON_ETLS;
}

/* Why a handshake failed, from mbedTLS's code and the verification flags. */
static baton_tls_reason_t classify(baton_tls_conn_t *tc, int rc)
{
    uint32_t flags = mbedtls_ssl_get_verify_result(&tc->ssl);
    if (rc == MBEDTLS_ERR_X509_CERT_VERIFY_FAILED || rc == MBEDTLS_ERR_SSL_PEER_VERIFY_FAILED) {
        if (flags == (uint32_t)-1)
            return BATON_TLS_R_CERT_OTHER;
        if (flags & MBEDTLS_X509_BADCERT_CN_MISMATCH)
            return BATON_TLS_R_CERT_WRONG_HOST;
        if (flags & (MBEDTLS_X509_BADCERT_EXPIRED | MBEDTLS_X509_BADCERT_FUTURE))
            return BATON_TLS_R_CERT_EXPIRED;
        if (flags & MBEDTLS_X509_BADCERT_NOT_TRUSTED)
            return BATON_TLS_R_CERT_UNTRUSTED;
        return BATON_TLS_R_CERT_OTHER;
    }
    if (rc == MBEDTLS_ERR_SSL_NO_CLIENT_CERTIFICATE)
        return BATON_TLS_R_CERT_MISSING;
    if (rc == MBEDTLS_ERR_SSL_INVALID_RECORD || rc == MBEDTLS_ERR_SSL_INVALID_MAC ||
        rc == MBEDTLS_ERR_SSL_BAD_HS_CLIENT_HELLO)
        return BATON_TLS_R_GARBAGE;
    if (rc == MBEDTLS_ERR_SSL_ALLOC_FAILED)
        return BATON_TLS_R_INTERNAL;
    return BATON_TLS_R_PROTOCOL;
}

static int looks_like_http(unsigned char c)
{
    return c >= 'A' && c <= 'Z';
}

/*
 * Follows the record framing of the incoming bytes ahead of mbedTLS: plain HTTP on a TLS port
 * and handshake records after the handshake (renegotiation, which TLS 1.2 peers start that
 * way) are refused here, before mbedTLS sees them. 0 or a reason + 1.
 */
static int scan_records(baton_tls_conn_t *tc, const unsigned char *p, size_t len)
{
    while (len > 0) {
        if (tc->rec_body_left > 0) {
            size_t n = len < tc->rec_body_left ? len : tc->rec_body_left;
            tc->rec_body_left -= n;
            p += n;
            len -= n;
            continue;
        }
        if (tc->bytes_in == 0 && tc->rec_hdr_have == 0 && *p != MBEDTLS_SSL_MSG_HANDSHAKE)
            return 1 + (looks_like_http(*p) ? BATON_TLS_R_PLAINTEXT : BATON_TLS_R_GARBAGE);
        tc->rec_hdr[tc->rec_hdr_have++] = *p++;
        len--;
        tc->bytes_in++;
        if (tc->rec_hdr_have < 5)
            continue;
        tc->rec_hdr_have = 0;
        unsigned char type = tc->rec_hdr[0];
        size_t rlen = ((size_t)tc->rec_hdr[3] << 8) | tc->rec_hdr[4];
        if (type < MBEDTLS_SSL_MSG_CHANGE_CIPHER_SPEC || type > MBEDTLS_SSL_MSG_APPLICATION_DATA ||
            tc->rec_hdr[1] != 3 || rlen > MAX_RECORD_LEN)
            return 1 + BATON_TLS_R_GARBAGE;
        if (type == MBEDTLS_SSL_MSG_HANDSHAKE && tc->established)
            return 1 + BATON_TLS_R_RENEGOTIATION;
        tc->rec_body_left = rlen;
    }
    return 0;
}

/* A client keeps the new session for the next connection. A resumed session carries the
 * master secret of the one offered; a full handshake makes a new one. */
static void session_save(baton_tls_conn_t *tc)
{
    baton_tls_session_t *s = tc->session;
    mbedtls_ssl_session fresh;
    mbedtls_ssl_session_init(&fresh);
    if (mbedtls_ssl_get_session(&tc->ssl, &fresh) != 0) {
        mbedtls_ssl_session_free(&fresh);
        return;
    }
    if (s->valid && memcmp(fresh.master, s->sess.master, sizeof(fresh.master)) == 0)
        tc->resumed = 1;
    mbedtls_ssl_session_free(&s->sess);
    s->sess = fresh;
    s->valid = 1;
}

static void handshake_done(baton_tls_conn_t *tc)
{
    tc->established = 1;
    if (tc->session)
        session_save(tc);
    atomic_fetch_add_explicit(&st_handshakes[tc->role], 1, memory_order_relaxed);
    baton_counter_add(atomic_load_explicit(&m_handshakes[tc->role], memory_order_relaxed), 1);
    if (tc->resumed) {
        atomic_fetch_add_explicit(&st_resumed[tc->role], 1, memory_order_relaxed);
        baton_counter_add(atomic_load_explicit(&m_resumed[tc->role], memory_order_relaxed), 1);
    }
}

/* The connection whose handshake runs now on this thread: the ticket callback marks it. */
static __thread baton_tls_conn_t *cur_conn;

/* mbedTLS's ticket check, noting that this connection resumes a session. */
static int ticket_parse(void *p_ticket, mbedtls_ssl_session *session, unsigned char *buf,
                        size_t len)
{
    int rc = mbedtls_ssl_ticket_parse(p_ticket, session, buf, len);
    if (rc == 0 && cur_conn)
        cur_conn->resumed = 1;
    return rc;
}

/* Plaintext scratch for one feed at a time on this thread (reads are never nested). */
static __thread unsigned char plain[MBEDTLS_SSL_IN_CONTENT_LEN];

int baton_tls_conn_feed(baton_tls_conn_t *tc, const char *data, size_t len, baton_buf_t *out,
                        baton_tls_plain_cb plain_cb, void *owner)
{
    if (tc->failed)
        return BATON_ETLS;
    int bad = scan_records(tc, (const unsigned char *)data, len);
    if (bad)
        return conn_fail(tc, (baton_tls_reason_t)(bad - 1), 0);
    tc->in = (const unsigned char *)data;
    tc->in_len = len;
    tc->out = out;
    int result = 0;
    if (!tc->established) {
        cur_conn = tc;
        int rc = mbedtls_ssl_handshake(&tc->ssl);
        cur_conn = NULL;
        if (rc == MBEDTLS_ERR_SSL_WANT_READ || rc == MBEDTLS_ERR_SSL_WANT_WRITE)
            goto done;
        if (rc != 0) {
            result = conn_fail(tc, tc->out_err ? BATON_TLS_R_INTERNAL : classify(tc, rc), rc);
            goto done;
        }
        handshake_done(tc);
    }
    for (;;) {
        int n = mbedtls_ssl_read(&tc->ssl, plain, sizeof(plain));
        if (n > 0) {
            if (plain_cb(owner, (const char *)plain, (size_t)n) != 0)
                break;
            continue;
        }
        if (n == MBEDTLS_ERR_SSL_WANT_READ || n == MBEDTLS_ERR_SSL_WANT_WRITE)
            break;
        if (n == 0 || n == MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY) {
            result = 1;
            break;
        }
        result = conn_fail(tc, classify(tc, n), n);
        break;
    }
done:
    tc->in = NULL;
    tc->in_len = 0;
    tc->out = NULL;
    return result;
}

int baton_tls_conn_start(baton_tls_conn_t *tc, baton_buf_t *out)
{
    tc->out = out;
    int rc = mbedtls_ssl_handshake(&tc->ssl);
    tc->out = NULL;
    if (rc == 0 || rc == MBEDTLS_ERR_SSL_WANT_READ || rc == MBEDTLS_ERR_SSL_WANT_WRITE)
        return 0;
    return conn_fail(tc, BATON_TLS_R_INTERNAL, rc);
}

/*
 * Records a feed produced before its plaintext callback writes (the handshake's last flight:
 * a TLS 1.2 False Start client sends its first request with its Finished) must reach the wire
 * first: they move to the front of the caller's buffer.
 */
static int take_pending(baton_buf_t *pending, baton_buf_t *out)
{
    if (pending == NULL || pending->len == 0)
        return 0;
    if (baton_buf_append(out, pending->data, pending->len) != 0)
        return -1;
    baton_buf_reset(pending);
    return 0;
}

static int write_all(baton_tls_conn_t *tc, const unsigned char *p, size_t len)
{
    while (len > 0) {
        int n = mbedtls_ssl_write(&tc->ssl, p, len);
        if (n <= 0)
            return conn_fail(tc, BATON_TLS_R_INTERNAL, n);
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int baton_tls_conn_encrypt(baton_tls_conn_t *tc, const uv_buf_t *bufs, unsigned n, baton_buf_t *out)
{
    if (!tc->established || tc->failed)
        return BATON_ETLS;
    /* Small pieces (a chunk-size line, the data, its CRLF) are joined into one record. */
    unsigned char stage[4096];
    size_t staged = 0;
    int rc = 0;
    baton_buf_t *saved = tc->out; /* called from a plaintext callback inside a feed */
    if (take_pending(saved, out) != 0)
        return conn_fail(tc, BATON_TLS_R_INTERNAL, 0);
    tc->out = out;
    for (unsigned i = 0; i < n && rc == 0; i++) {
        const unsigned char *p = (const unsigned char *)bufs[i].base;
        size_t len = bufs[i].len;
        if (len <= sizeof(stage) - staged) {
            memcpy(stage + staged, p, len);
            staged += len;
            continue;
        }
        if (staged) {
            rc = write_all(tc, stage, staged);
            staged = 0;
        }
        if (rc == 0 && len <= sizeof(stage)) {
            memcpy(stage, p, len);
            staged = len;
        } else if (rc == 0) {
            rc = write_all(tc, p, len);
        }
    }
    if (rc == 0 && staged)
        rc = write_all(tc, stage, staged);
    tc->out = saved;
    return rc;
}

void baton_tls_conn_close_notify(baton_tls_conn_t *tc, baton_buf_t *out)
{
    if (!tc->established || tc->failed)
        return;
    baton_buf_t *saved = tc->out;
    if (take_pending(saved, out) != 0)
        return;
    tc->out = out;
    mbedtls_ssl_close_notify(&tc->ssl);
    tc->out = saved;
}

void baton_tls_conn_timed_out(baton_tls_conn_t *tc)
{
    conn_fail(tc, BATON_TLS_R_TIMEOUT, 0);
}

void baton_tls_conn_eof(baton_tls_conn_t *tc)
{
    /* A connection closed before its first byte is a port probe, not a failed handshake. */
    if (!tc->established && tc->bytes_in > 0)
        conn_fail(tc, BATON_TLS_R_TRUNCATED, 0);
}
