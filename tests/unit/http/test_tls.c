/* test_tls.c — the TLS layer without sockets: a client and a server connection pumped into
 * each other in memory, with certificates made by the test itself (mbedTLS x509write). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "baton/error.h"
#include "http/tls.h"

#include "tls_test_pki.h"

/* ---- a pair of connections pumped in memory ---- */

typedef struct side_s {
    baton_tls_conn_t *tc;
    baton_buf_t to_peer; /* ciphertext the other side has not read yet */
    char got[256];
    size_t got_len;
    int rc; /* last feed result */
} side_t;

static int on_plain(void *owner, const char *data, size_t len)
{
    side_t *s = owner;
    assert_true(s->got_len + len < sizeof(s->got));
    memcpy(s->got + s->got_len, data, len);
    s->got_len += len;
    return 0;
}

/* Moves the ciphertext both ways until nothing moves; returns when quiet or one side failed. */
static void pump(side_t *cli, side_t *srv)
{
    for (int i = 0; i < 50; i++) {
        int moved = 0;
        side_t *from[2] = {cli, srv}, *to[2] = {srv, cli};
        for (int k = 0; k < 2; k++) {
            if (from[k]->to_peer.len == 0 || to[k]->rc != 0)
                continue;
            baton_buf_t in = from[k]->to_peer;
            from[k]->to_peer = (baton_buf_t)BATON_BUF_INIT;
            to[k]->rc =
                baton_tls_conn_feed(to[k]->tc, in.data, in.len, &to[k]->to_peer, on_plain, to[k]);
            baton_buf_free(&in);
            moved = 1;
        }
        if (!moved)
            return;
    }
    fail_msg("the handshake never went quiet");
}

static baton_tls_t *make_tls(baton_tls_role_t role, const char *cert, const char *key,
                             const char *ca)
{
    baton_tls_t *t = NULL;
    baton_tls_opts_t o = {cert, key, ca};
    char err[256] = "";
    int rc = baton_tls_create(&t, role, &o, err, sizeof(err));
    if (rc != 0)
        fail_msg("baton_tls_create: %s", err);
    return t;
}

static void pair_open(side_t *cli, side_t *srv, baton_tls_t *ct, baton_tls_t *st, const char *host,
                      baton_tls_session_t *sess)
{
    memset(cli, 0, sizeof(*cli));
    memset(srv, 0, sizeof(*srv));
    assert_int_equal(baton_tls_conn_create(&cli->tc, ct, host), 0);
    assert_int_equal(baton_tls_conn_create(&srv->tc, st, NULL), 0);
    if (sess)
        baton_tls_conn_use_session(cli->tc, sess);
    assert_int_equal(baton_tls_conn_start(cli->tc, &cli->to_peer), 0);
    pump(cli, srv);
}

static void pair_close(side_t *cli, side_t *srv)
{
    baton_tls_conn_free(cli->tc);
    baton_tls_conn_free(srv->tc);
    baton_buf_free(&cli->to_peer);
    baton_buf_free(&srv->to_peer);
}

static void send_text(side_t *from, const char *text)
{
    uv_buf_t b = uv_buf_init((char *)text, (unsigned)strlen(text));
    assert_int_equal(baton_tls_conn_encrypt(from->tc, &b, 1, &from->to_peer), 0);
}

static baton_tls_t *server_tls(void)
{
    return make_tls(BATON_TLS_SERVER, path("srv.pem"), path("srv.key"), NULL);
}

static baton_tls_t *client_tls(void)
{
    return make_tls(BATON_TLS_CLIENT, NULL, NULL, path("ca.pem"));
}

/* ---- tests ---- */

static void test_handshake_and_data(void **state)
{
    (void)state;
    baton_tls_t *st = server_tls(), *ct = client_tls();
    side_t cli, srv;
    /* Host names and IP addresses are both checked against the SANs. */
    const char *hosts[] = {"localhost", "127.0.0.1"};
    for (int i = 0; i < 2; i++) {
        pair_open(&cli, &srv, ct, st, hosts[i], NULL);
        assert_int_equal(cli.rc, 0);
        assert_int_equal(srv.rc, 0);
        assert_true(baton_tls_conn_established(cli.tc));
        assert_true(baton_tls_conn_established(srv.tc));
        send_text(&cli, "GET / HTTP/1.1\r\n\r\n");
        pump(&cli, &srv);
        assert_int_equal(srv.got_len, 18);
        assert_memory_equal(srv.got, "GET / HTTP/1.1\r\n\r\n", 18);
        send_text(&srv, "HTTP/1.1 200 OK\r\n");
        pump(&cli, &srv);
        assert_memory_equal(cli.got, "HTTP/1.1 200 OK\r\n", 17);
        /* close_notify reads as the peer's EOF */
        baton_tls_conn_close_notify(cli.tc, &cli.to_peer);
        pump(&cli, &srv);
        assert_int_equal(srv.rc, 1);
        pair_close(&cli, &srv);
    }
    baton_tls_destroy(ct);
    baton_tls_destroy(st);
}

static void expect_client_failure(baton_tls_t *ct, baton_tls_t *st, const char *host,
                                  baton_tls_reason_t reason)
{
    side_t cli, srv;
    baton_tls_stats_t before, after;
    baton_tls_stats(&before);
    pair_open(&cli, &srv, ct, st, host, NULL);
    assert_int_equal(cli.rc, BATON_ETLS);
    assert_false(baton_tls_conn_established(cli.tc));
    assert_int_equal(baton_tls_conn_reason(cli.tc), reason);
    baton_tls_stats(&after);
    assert_int_equal(after.failures[BATON_TLS_CLIENT][reason],
                     before.failures[BATON_TLS_CLIENT][reason] + 1);
    pair_close(&cli, &srv);
}

static void test_verification_failures(void **state)
{
    (void)state;
    baton_tls_t *st = server_tls(), *ct = client_tls();
    expect_client_failure(ct, st, "other.example", BATON_TLS_R_CERT_WRONG_HOST);
    expect_client_failure(ct, st, "127.0.0.2", BATON_TLS_R_CERT_WRONG_HOST);
    expect_client_failure(ct, st, "::1", BATON_TLS_R_CERT_WRONG_HOST);
    baton_tls_t *expired = make_tls(BATON_TLS_SERVER, path("expired.pem"), path("srv.key"), NULL);
    expect_client_failure(ct, expired, "localhost", BATON_TLS_R_CERT_EXPIRED);
    baton_tls_t *self = make_tls(BATON_TLS_SERVER, path("self.pem"), path("srv.key"), NULL);
    expect_client_failure(ct, self, "localhost", BATON_TLS_R_CERT_UNTRUSTED);
    baton_tls_destroy(self);
    baton_tls_destroy(expired);
    baton_tls_destroy(ct);
    baton_tls_destroy(st);
}

static void test_mtls(void **state)
{
    (void)state;
    baton_tls_t *st = make_tls(BATON_TLS_SERVER, path("srv.pem"), path("srv.key"), path("ca.pem"));
    baton_tls_t *anon = client_tls();
    baton_tls_t *cert =
        make_tls(BATON_TLS_CLIENT, path("srv2.pem"), path("srv2.key"), path("ca.pem"));
    side_t cli, srv;
    pair_open(&cli, &srv, anon, st, "localhost", NULL);
    assert_int_equal(srv.rc, BATON_ETLS);
    assert_int_equal(baton_tls_conn_reason(srv.tc), BATON_TLS_R_CERT_MISSING);
    pair_close(&cli, &srv);
    pair_open(&cli, &srv, cert, st, "localhost", NULL);
    assert_int_equal(srv.rc, 0);
    assert_true(baton_tls_conn_established(srv.tc));
    pair_close(&cli, &srv);
    baton_tls_destroy(cert);
    baton_tls_destroy(anon);
    baton_tls_destroy(st);
}

static void expect_server_refusal(baton_tls_t *st, const char *bytes, size_t len,
                                  baton_tls_reason_t reason)
{
    baton_tls_conn_t *tc;
    assert_int_equal(baton_tls_conn_create(&tc, st, NULL), 0);
    baton_buf_t out = BATON_BUF_INIT;
    side_t sink = {0};
    assert_int_equal(baton_tls_conn_feed(tc, bytes, len, &out, on_plain, &sink), BATON_ETLS);
    assert_int_equal(baton_tls_conn_reason(tc), reason);
    assert_int_equal(sink.got_len, 0);
    baton_buf_free(&out);
    baton_tls_conn_free(tc);
}

static void test_bad_input(void **state)
{
    (void)state;
    baton_tls_t *st = server_tls();
    static const char http[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
    expect_server_refusal(st, http, sizeof(http) - 1, BATON_TLS_R_PLAINTEXT);
    static const char junk[] = "\x01\x02\x03garbage";
    expect_server_refusal(st, junk, sizeof(junk) - 1, BATON_TLS_R_GARBAGE);
    static const char huge[] = "\x16\x03\x01\xff\xff";
    expect_server_refusal(st, huge, 5, BATON_TLS_R_GARBAGE);
    static const char badtype[] = "\x16\x03\x01\x00\x05hello\x99\x03\x03\x00\x01x";
    baton_tls_conn_t *tc;
    assert_int_equal(baton_tls_conn_create(&tc, st, NULL), 0);
    baton_buf_t out = BATON_BUF_INIT;
    side_t sink = {0};
    assert_int_equal(baton_tls_conn_feed(tc, badtype, sizeof(badtype) - 1, &out, on_plain, &sink),
                     BATON_ETLS);
    baton_buf_free(&out);
    baton_tls_conn_free(tc);

    /* A truncated handshake: the peer's EOF before the end counts once. */
    baton_tls_stats_t before, after;
    baton_tls_stats(&before);
    assert_int_equal(baton_tls_conn_create(&tc, st, NULL), 0);
    assert_int_equal(baton_tls_conn_feed(tc, "\x16\x03\x01\x00", 4, &out, on_plain, &sink), 0);
    baton_tls_conn_eof(tc);
    baton_tls_stats(&after);
    assert_int_equal(after.failures[BATON_TLS_SERVER][BATON_TLS_R_TRUNCATED],
                     before.failures[BATON_TLS_SERVER][BATON_TLS_R_TRUNCATED] + 1);
    baton_buf_free(&out);
    baton_tls_conn_free(tc);
    /* A connection that sent nothing is a probe, not a failure. */
    assert_int_equal(baton_tls_conn_create(&tc, st, NULL), 0);
    baton_tls_conn_eof(tc);
    baton_tls_stats(&before);
    assert_int_equal(before.failures[BATON_TLS_SERVER][BATON_TLS_R_TRUNCATED],
                     after.failures[BATON_TLS_SERVER][BATON_TLS_R_TRUNCATED]);
    baton_tls_conn_free(tc);
    baton_tls_destroy(st);
}

static void test_renegotiation_refused(void **state)
{
    (void)state;
    baton_tls_t *st = server_tls(), *ct = client_tls();
    side_t cli, srv;
    pair_open(&cli, &srv, ct, st, "localhost", NULL);
    assert_true(baton_tls_conn_established(srv.tc));
    /* Any handshake record after the handshake is a renegotiation attempt. */
    baton_buf_t out = BATON_BUF_INIT;
    assert_int_equal(baton_tls_conn_feed(srv.tc, "\x16\x03\x03\x00\x04\x01\x00\x00\x00", 9, &out,
                                         on_plain, &srv),
                     BATON_ETLS);
    assert_int_equal(baton_tls_conn_reason(srv.tc), BATON_TLS_R_RENEGOTIATION);
    baton_buf_free(&out);
    pair_close(&cli, &srv);
    baton_tls_destroy(ct);
    baton_tls_destroy(st);
}

static void copy_file(const char *from, const char *to)
{
    FILE *in = fopen(path(from), "r"), *out = fopen(path(to), "w");
    assert_non_null(in);
    assert_non_null(out);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
        assert_int_equal(fwrite(buf, 1, n, out), n);
    fclose(in);
    fclose(out);
}

static void test_reload_and_resumption(void **state)
{
    (void)state;
    copy_file("srv.pem", "live.pem");
    copy_file("srv.key", "live.key");
    baton_tls_t *st = make_tls(BATON_TLS_SERVER, path("live.pem"), path("live.key"), NULL);
    baton_tls_t *ct = client_tls();
    baton_tls_session_t *sess = baton_tls_session_new();
    assert_non_null(sess);
    side_t cli, srv, cli2, srv2;
    pair_open(&cli, &srv, ct, st, "localhost", sess);
    assert_true(baton_tls_conn_established(cli.tc));
    assert_false(baton_tls_conn_resumed(cli.tc));

    /* A mismatched pair fails and keeps the old generation; a good one is taken. */
    copy_file("srv2.key", "live.key");
    char err[256] = "";
    assert_int_equal(baton_tls_reload(st, err, sizeof(err)), BATON_EINVAL);
    assert_non_null(strstr(err, "does not match"));
    copy_file("srv2.pem", "live.pem");
    assert_int_equal(baton_tls_reload(st, err, sizeof(err)), 0);

    /* The connection made before the reload goes on. */
    send_text(&cli, "still here");
    pump(&cli, &srv);
    assert_int_equal(srv.got_len, 10);
    /* A new one works with the new certificate and resumes the saved session (the ticket keys
     * survive the reload). */
    pair_open(&cli2, &srv2, ct, st, "localhost", sess);
    assert_true(baton_tls_conn_established(cli2.tc));
    assert_true(baton_tls_conn_resumed(cli2.tc));
    pair_close(&cli2, &srv2);
    pair_close(&cli, &srv);
    baton_tls_session_free(sess);
    baton_tls_destroy(ct);
    baton_tls_destroy(st);
}

static void test_bad_configuration(void **state)
{
    (void)state;
    baton_tls_t *t = NULL;
    char err[256] = "";
    baton_tls_opts_t none = {NULL, NULL, NULL};
    assert_int_equal(baton_tls_create(&t, BATON_TLS_SERVER, &none, err, sizeof(err)), BATON_EINVAL);
    baton_tls_opts_t missing = {path("nope.pem"), path("srv.key"), NULL};
    assert_int_equal(baton_tls_create(&t, BATON_TLS_SERVER, &missing, err, sizeof(err)),
                     BATON_EINVAL);
    assert_non_null(strstr(err, "nope.pem"));
    baton_tls_opts_t mismatch = {path("srv.pem"), path("srv2.key"), NULL};
    assert_int_equal(baton_tls_create(&t, BATON_TLS_SERVER, &mismatch, err, sizeof(err)),
                     BATON_EINVAL);
    assert_null(t);
    assert_string_equal(baton_tls_reason_label(BATON_TLS_R_PLAINTEXT), "plaintext_http");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handshake_and_data),
        cmocka_unit_test(test_verification_failures),
        cmocka_unit_test(test_mtls),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_renegotiation_refused),
        cmocka_unit_test(test_reload_and_resumption),
        cmocka_unit_test(test_bad_configuration),
    };
    return cmocka_run_group_tests(tests, setup_pki, teardown_pki);
}
