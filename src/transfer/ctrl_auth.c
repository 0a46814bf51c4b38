/* transfer/ctrl_auth.c — the KV bootstrap's mutual challenge-response (AUTH frames, HMAC-SHA-256
 * with the engines' shared secret) that runs before HELLO, and the count and rate-limited log of
 * refused peers. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include <mbedtls/md.h>

#include "common/log.h"
#include "transfer/internal.h"

/*
 * The exchange (decode D connects, prefill P accepts; K the shared secret):
 *   D -> P  AUTH CHALLENGE  id_D, inc_D, gen_D, nonce_D
 *   P -> D  AUTH RESPONSE   id_P, inc_P, gen_P, nonce_P, mac_P = HMAC(K, "…prefill" | T)
 *   D -> P  AUTH PROOF      id_D, inc_D, gen_D,          mac_D = HMAC(K, "…decode"  | T)
 *   D -> P  HELLO …          (as without a secret, from here on)
 * T = nonce_D | nonce_P | id_D | inc_D | gen_D | id_P | inc_P | gen_P. Both nonces are fresh
 * (getrandom) per connection, so a recorded RESPONSE or PROOF proves nothing on another
 * connection (replay), and the two labels keep one side's proof from being reflected as the
 * other's. P sends nothing but its RESPONSE (no transport address, region or key) before D's
 * PROOF checked out, and D sends its HELLO (transport addresses) only after P's RESPONSE did.
 * What it does not do: protect the bytes after the handshake from an on-path attacker (that
 * takes TLS on the control channel and lanes; see docs/SECURITY.md).
 */

static const char LABEL_PREFILL[] = "baton kv-auth v1 prefill";
static const char LABEL_DECODE[] = "baton kv-auth v1 decode";

/* At most this many refusal lines per second per engine; the rest are counted in one line. */
#define AUTH_LOG_BURST 5

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* One side's identity in the transcript: u8 id length, id, le64 incarnation, le64 generation. */
static int hmac_party(mbedtls_md_context_t *md, const char *id, uint64_t inc, uint64_t gen)
{
    uint8_t len = (uint8_t)strlen(id);
    uint8_t nums[16];
    put_le64(nums, inc);
    put_le64(nums + 8, gen);
    int rc = mbedtls_md_hmac_update(md, &len, 1);
    if (rc == 0)
        rc = mbedtls_md_hmac_update(md, (const uint8_t *)id, len);
    if (rc == 0)
        rc = mbedtls_md_hmac_update(md, nums, sizeof(nums));
    return rc;
}

int baton__auth_mac(const uint8_t *key, size_t key_len, const char *label,
                    const baton__auth_party_t *d, const baton__auth_party_t *p,
                    uint8_t mac[BATON__AUTH_MAC])
{
    const mbedtls_md_info_t *info = mbedtls_md_info_from_type(MBEDTLS_MD_SHA256);
    if (info == NULL)
        return BATON_ENOTSUP;
    mbedtls_md_context_t md;
    mbedtls_md_init(&md);
    int rc = mbedtls_md_setup(&md, info, 1);
    if (rc == 0)
        rc = mbedtls_md_hmac_starts(&md, key, key_len);
    if (rc == 0) /* the NUL too: no label is a prefix of another's bytes */
        rc = mbedtls_md_hmac_update(&md, (const uint8_t *)label, strlen(label) + 1);
    if (rc == 0)
        rc = mbedtls_md_hmac_update(&md, d->nonce, BATON__AUTH_NONCE);
    if (rc == 0)
        rc = mbedtls_md_hmac_update(&md, p->nonce, BATON__AUTH_NONCE);
    if (rc == 0)
        rc = hmac_party(&md, d->id, d->incarnation, d->generation);
    if (rc == 0)
        rc = hmac_party(&md, p->id, p->incarnation, p->generation);
    if (rc == 0)
        rc = mbedtls_md_hmac_finish(&md, mac);
    mbedtls_md_free(&md);
    return rc == 0 ? 0 : BATON_ENOMEM;
}

/* Constant time in the bytes compared: the time taken says nothing of where they differ. */
static int mac_equal(const uint8_t *a, const uint8_t *b)
{
    volatile uint8_t diff = 0;
    for (size_t i = 0; i < BATON__AUTH_MAC; i++)
        diff |= a[i] ^ b[i];
    return diff == 0;
}

static int fresh_nonce(uint8_t nonce[BATON__AUTH_NONCE])
{
    size_t got = 0;
    while (got < BATON__AUTH_NONCE) {
        ssize_t n = getrandom(nonce + got, BATON__AUTH_NONCE - got, 0);
        if (n <= 0)
            return BATON_ENODEV; /* no entropy: better no connection than a guessable nonce */
        got += (size_t)n;
    }
    return 0;
}

static void self_party(const baton__conn_t *c, baton__auth_party_t *me)
{
    snprintf(me->id, sizeof(me->id), "%s", c->eng->engine_id);
    me->incarnation = c->eng->incarnation;
    me->generation = c->gen;
    memcpy(me->nonce, c->auth_nonce, BATON__AUTH_NONCE);
}

static int send_auth(baton__conn_t *c, int step, const uint8_t *mac)
{
    baton__auth_t a;
    memset(&a, 0, sizeof(a));
    a.step = (uint8_t)step;
    snprintf(a.engine_id, sizeof(a.engine_id), "%s", c->eng->engine_id);
    a.incarnation = c->eng->incarnation;
    a.generation = c->gen;
    if (step != BATON__AUTH_PROOF)
        memcpy(a.nonce, c->auth_nonce, BATON__AUTH_NONCE);
    if (mac != NULL)
        memcpy(a.mac, mac, BATON__AUTH_MAC);
    baton_buf_t b = BATON_BUF_INIT;
    int rc = baton__enc_auth(&b, &a);
    if (rc == 0)
        baton__conn_send(c, &b);
    baton_buf_free(&b);
    return rc;
}

void baton__auth_refused(baton__conn_t *c, const char *reason)
{
    baton_xfer_engine_t *eng = c->eng;
    atomic_fetch_add(&eng->st_auth_failures, 1);
    /* A peer that can open connections at will must not be able to flood the log. */
    uint64_t now = baton_now_ms();
    if (now - eng->auth_log_window_ms >= 1000) {
        if (eng->auth_log_suppressed > 0)
            log_warn(BATON__LOG, "kv_auth_refused_suppressed count=%" PRIu64 " window_ms=%" PRIu64,
                     eng->auth_log_suppressed, now - eng->auth_log_window_ms);
        eng->auth_log_window_ms = now;
        eng->auth_log_lines = 0;
        eng->auth_log_suppressed = 0;
    }
    if (eng->auth_log_lines < AUTH_LOG_BURST) {
        eng->auth_log_lines++;
        log_warn(BATON__LOG, "kv_auth_refused peer=%s role=%s claimed_id=%s reason=\"%s\"", c->addr,
                 c->role == BATON__ROLE_DECODE ? "decode" : "prefill",
                 c->auth_peer.id[0] ? c->auth_peer.id : "-", reason);
    } else {
        eng->auth_log_suppressed++;
    }
    baton__conn_fail(c, BATON_EAUTH, reason);
}

/* ---- decode side ------------------------------------------------------------------------- */

void baton__auth_decode_start(baton__conn_t *c)
{
    int rc = fresh_nonce(c->auth_nonce);
    if (rc == 0)
        rc = send_auth(c, BATON__AUTH_CHALLENGE, NULL);
    if (rc != 0) {
        baton__conn_fail(c, rc, "cannot send AUTH challenge");
        return;
    }
    if (c->state != BATON__CONN_CLOSING)
        (void)BATON__CONN_MOVE(c, BATON__CONN_AUTH);
}

static int decode_on_response(baton__conn_t *c, const baton__auth_t *a)
{
    baton_xfer_engine_t *eng = c->eng;
    snprintf(c->auth_peer.id, sizeof(c->auth_peer.id), "%s", a->engine_id);
    c->auth_peer.incarnation = a->incarnation;
    c->auth_peer.generation = a->generation;
    memcpy(c->auth_peer.nonce, a->nonce, BATON__AUTH_NONCE);
    baton__auth_party_t me;
    self_party(c, &me);
    uint8_t want[BATON__AUTH_MAC];
    int rc = baton__auth_mac(eng->secret, eng->secret_len, LABEL_PREFILL, &me, &c->auth_peer, want);
    if (rc != 0)
        return rc;
    if (a->step != BATON__AUTH_RESPONSE || !mac_equal(want, a->mac)) {
        baton__auth_refused(c, "prefill peer failed to prove the shared secret");
        return 0;
    }
    uint8_t proof[BATON__AUTH_MAC];
    rc = baton__auth_mac(eng->secret, eng->secret_len, LABEL_DECODE, &me, &c->auth_peer, proof);
    if (rc == 0)
        rc = send_auth(c, BATON__AUTH_PROOF, proof);
    if (rc != 0)
        return rc;
    c->authed = 1;
    baton__hs_decode_hello(c);
    return 0;
}

/* ---- prefill side ------------------------------------------------------------------------ */

static int prefill_on_challenge(baton__conn_t *c, const baton__auth_t *a)
{
    baton_xfer_engine_t *eng = c->eng;
    snprintf(c->auth_peer.id, sizeof(c->auth_peer.id), "%s", a->engine_id);
    c->auth_peer.incarnation = a->incarnation;
    c->auth_peer.generation = a->generation;
    memcpy(c->auth_peer.nonce, a->nonce, BATON__AUTH_NONCE);
    int rc = fresh_nonce(c->auth_nonce);
    if (rc != 0)
        return rc;
    baton__auth_party_t me;
    self_party(c, &me);
    uint8_t mac[BATON__AUTH_MAC];
    rc = baton__auth_mac(eng->secret, eng->secret_len, LABEL_PREFILL, &c->auth_peer, &me, mac);
    if (rc == 0)
        rc = send_auth(c, BATON__AUTH_RESPONSE, mac);
    if (rc == 0 && c->state != BATON__CONN_CLOSING)
        (void)BATON__CONN_MOVE(c, BATON__CONN_AUTH);
    return rc;
}

static int prefill_on_proof(baton__conn_t *c, const baton__auth_t *a)
{
    baton_xfer_engine_t *eng = c->eng;
    /* The proof covers the identity of the challenge: the same peer must send both. */
    if (strcmp(a->engine_id, c->auth_peer.id) != 0 || a->incarnation != c->auth_peer.incarnation ||
        a->generation != c->auth_peer.generation) {
        baton__auth_refused(c, "AUTH proof names another engine than its challenge");
        return 0;
    }
    baton__auth_party_t me;
    self_party(c, &me);
    uint8_t want[BATON__AUTH_MAC];
    int rc = baton__auth_mac(eng->secret, eng->secret_len, LABEL_DECODE, &c->auth_peer, &me, want);
    if (rc != 0)
        return rc;
    if (!mac_equal(want, a->mac)) {
        baton__auth_refused(c, "decode peer failed to prove the shared secret");
        return 0;
    }
    c->authed = 1;
    (void)BATON__CONN_MOVE(c, BATON__CONN_PENDING); /* its HELLO comes next */
    return 0;
}

int baton__auth_on_frame(baton__conn_t *c, const baton__auth_t *a)
{
    if (c->eng->secret_len == 0) {
        baton__auth_refused(c, "peer asks for authentication; no shared secret configured here");
        return 0;
    }
    if (c->role == BATON__ROLE_DECODE)
        return decode_on_response(c, a);
    if (c->state == BATON__CONN_PENDING && !c->authed && a->step == BATON__AUTH_CHALLENGE)
        return prefill_on_challenge(c, a);
    if (c->state == BATON__CONN_AUTH && a->step == BATON__AUTH_PROOF)
        return prefill_on_proof(c, a);
    baton__auth_refused(c, "AUTH frame out of order");
    return 0;
}

int baton__auth_check_hello(baton__conn_t *c, const baton__hello_t *h)
{
    if (c->eng->secret_len == 0)
        return 1;
    if (!c->authed) {
        baton__auth_refused(c, "HELLO without authentication (a shared secret is required)");
        return 0;
    }
    /* HELLO must come from the engine that authenticated, on this very connection. */
    if (strcmp(h->engine_id, c->auth_peer.id) != 0 || h->incarnation != c->auth_peer.incarnation ||
        h->generation != c->auth_peer.generation) {
        baton__auth_refused(c, "HELLO names another engine than the one authenticated");
        return 0;
    }
    return 1;
}
