/* test_auth.c — router/auth: constant-time compare, Bearer parsing, loopback detection, API keys
 * from flags and a file (re-read, and a bad re-read keeping the old keys), admin and metrics
 * tokens, the per-key rate limit table and each key's priority class. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "baton/error.h"
#include "router/auth.h"
#include "router/control/config.h"
#include "router/dataplane/priority.h"

#define SEC 1000000000ull

/* A request as the server would hand it over: one optional Authorization header. */
typedef struct {
    baton_http_req_t req;
    baton_http_header_t hdr;
} fake_req_t;

static baton_http_req_t *mkreq(fake_req_t *f, const char *auth, const char *peer)
{
    memset(f, 0, sizeof(*f));
    f->hdr = (baton_http_header_t){"authorization", auth};
    f->req.headers = auth ? &f->hdr : NULL;
    f->req.n_headers = auth ? 1 : 0;
    f->req.method = "POST";
    f->req.path = "/v1/chat/completions";
    snprintf(f->req.peer, sizeof(f->req.peer), "%s", peer);
    return &f->req;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_ct_equal(void **state)
{
    (void)state;
    assert_true(baton_auth_ct_equal("secret", 6, "secret", 6));
    assert_false(baton_auth_ct_equal("secreT", 6, "secret", 6));
    assert_false(baton_auth_ct_equal("Secret", 6, "secret", 6));
    assert_false(baton_auth_ct_equal("secret1", 7, "secret", 6));
    assert_false(baton_auth_ct_equal("secre", 5, "secret", 6));
    /* a prefix repeated to the secret's length is still a different length */
    assert_false(baton_auth_ct_equal("sec", 3, "secsec", 6));
    assert_false(baton_auth_ct_equal("", 0, "secret", 6));
    assert_true(baton_auth_ct_equal("", 0, "", 0));
    /* bytes after a NUL count */
    assert_false(baton_auth_ct_equal("ab\0d", 4, "ab\0c", 4));
}

static void test_bearer_and_loopback(void **state)
{
    (void)state;
    fake_req_t f;
    assert_string_equal(baton_auth_bearer(mkreq(&f, "Bearer k1", "1.2.3.4:5")), "k1");
    assert_string_equal(baton_auth_bearer(mkreq(&f, "bearer   k2", "1.2.3.4:5")), "k2");
    assert_null(baton_auth_bearer(mkreq(&f, "Basic abc", "1.2.3.4:5")));
    assert_null(baton_auth_bearer(mkreq(&f, "Bearer ", "1.2.3.4:5")));
    assert_null(baton_auth_bearer(mkreq(&f, NULL, "1.2.3.4:5")));
    assert_true(baton_auth_peer_is_loopback("127.0.0.1:4000"));
    assert_true(baton_auth_peer_is_loopback("127.3.2.1:4000"));
    assert_true(baton_auth_peer_is_loopback("[::1]:4000"));
    assert_true(baton_auth_peer_is_loopback("[::ffff:127.0.0.1]:4000"));
    assert_false(baton_auth_peer_is_loopback("10.0.0.1:4000"));
    assert_false(baton_auth_peer_is_loopback("[::2]:4000"));
    assert_false(baton_auth_peer_is_loopback("[::ffff:10.0.0.1]:4000"));
    assert_false(baton_auth_peer_is_loopback("1127.0.0.1:4000"));
    assert_false(baton_auth_peer_is_loopback("?:0"));
}

static void test_keys_flags_and_file(void **state)
{
    (void)state;
    char dir[] = "/tmp/baton-auth-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof(path), "%s/keys", dir);
    write_file(path, "# comment\n\n  file-key-1  \r\nfile-key-2\n");

    baton_config_t cfg;
    char err[256] = "";
    assert_int_equal(baton_config_init(&cfg), 0);
    const char *argv[] = {"baton", "--api-key", "flag-key", "--api-key-file", path};
    assert_int_equal(baton_config_from_args(&cfg, 5, (char *const *)argv, err, sizeof(err)), 0);
    baton_auth_t *a = NULL;
    assert_int_equal(baton_auth_create(&a, &cfg, err, sizeof(err)), 0);
    assert_int_equal(baton_auth_n_keys(a), 3);

    fake_req_t f;
    const baton_route_class_t inf = BATON_ROUTE_INFERENCE;
    assert_int_equal(baton_auth_check(a, mkreq(&f, "Bearer flag-key", "9.9.9.9:1"), inf),
                     BATON_AUTH_OK);
    assert_int_equal(baton_auth_check(a, mkreq(&f, "Bearer file-key-1", "9.9.9.9:1"), inf),
                     BATON_AUTH_OK);
    assert_int_equal(baton_auth_check(a, mkreq(&f, "Bearer file-key-2", "9.9.9.9:1"), inf),
                     BATON_AUTH_OK);
    assert_int_equal(baton_auth_check(a, mkreq(&f, "Bearer file-key-", "9.9.9.9:1"), inf),
                     BATON_AUTH_NO_KEY);
    assert_int_equal(baton_auth_check(a, mkreq(&f, "Bearer # comment", "9.9.9.9:1"), inf),
                     BATON_AUTH_NO_KEY);
    assert_int_equal(baton_auth_check(a, mkreq(&f, NULL, "127.0.0.1:1"), inf), BATON_AUTH_NO_KEY);
    /* open routes need nothing; metrics are open without a metrics token */
    assert_int_equal(baton_auth_check(a, mkreq(&f, NULL, "9.9.9.9:1"), BATON_ROUTE_OPEN),
                     BATON_AUTH_OK);
    assert_int_equal(baton_auth_check(a, mkreq(&f, NULL, "9.9.9.9:1"), BATON_ROUTE_METRICS),
                     BATON_AUTH_OK);

    /* SIGHUP: the file's keys are replaced, the flag's stay */
    write_file(path, "file-key-3\n");
    assert_int_equal(baton_auth_reload(a, err, sizeof(err)), 0);
    assert_int_equal(baton_auth_n_keys(a), 2);
    assert_int_equal(baton_auth_check(a, mkreq(&f, "Bearer file-key-1", "9.9.9.9:1"), inf),
                     BATON_AUTH_NO_KEY);
    assert_int_equal(baton_auth_check(a, mkreq(&f, "Bearer file-key-3", "9.9.9.9:1"), inf),
                     BATON_AUTH_OK);
    assert_int_equal(baton_auth_check(a, mkreq(&f, "Bearer flag-key", "9.9.9.9:1"), inf),
                     BATON_AUTH_OK);
    /* a file that cannot be read keeps the keys in force */
    unlink(path);
    assert_int_not_equal(baton_auth_reload(a, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "cannot read"));
    assert_int_equal(baton_auth_check(a, mkreq(&f, "Bearer file-key-3", "9.9.9.9:1"), inf),
                     BATON_AUTH_OK);
    baton_auth_free(a);
    baton_config_free(&cfg);

    /* an empty key file alone would open every route: refused at start */
    write_file(path, "# nothing\n");
    assert_int_equal(baton_config_init(&cfg), 0);
    const char *argv2[] = {"baton", "--api-key-file", path};
    assert_int_equal(baton_config_from_args(&cfg, 3, (char *const *)argv2, err, sizeof(err)), 0);
    assert_int_equal(baton_auth_create(&a, &cfg, err, sizeof(err)), BATON_EINVAL);
    assert_non_null(strstr(err, "no key"));
    baton_config_free(&cfg);
    unlink(path);
    rmdir(dir);
}

/* `KEY priority=CLASS`: the key's default class, from the file and from --api-key; a bad
 * attribute refuses the file (the keys in force stay) and names no key. */
static void test_key_priority_class(void **state)
{
    (void)state;
    char dir[] = "/tmp/baton-auth-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof(path), "%s/keys", dir);
    write_file(path, "k-sys priority=system\nk-bulk\tpriority=BULK \nk-plain\n");
    baton_config_t cfg;
    char err[256] = "";
    assert_int_equal(baton_config_init(&cfg), 0);
    const char *argv[] = {"baton", "--api-key", "k-flag priority=interactive", "--api-key-file",
                          path};
    assert_int_equal(baton_config_from_args(&cfg, 5, (char *const *)argv, err, sizeof(err)), 0);
    baton_auth_t *a = NULL;
    assert_int_equal(baton_auth_create(&a, &cfg, err, sizeof(err)), 0);
    fake_req_t f;
    const baton_route_class_t inf = BATON_ROUTE_INFERENCE;
    /* the key is the first word: attributes are not part of it */
    assert_int_equal(baton_auth_check(a, mkreq(&f, "Bearer k-sys", "9.9.9.9:1"), inf),
                     BATON_AUTH_OK);
    assert_int_equal(
        baton_auth_check(a, mkreq(&f, "Bearer k-sys priority=system", "9.9.9.9:1"), inf),
        BATON_AUTH_NO_KEY);
    assert_int_equal(baton_auth_key_class(a, mkreq(&f, "Bearer k-sys", "9.9.9.9:1")),
                     BATON_PRIO_SYSTEM);
    assert_int_equal(baton_auth_key_class(a, mkreq(&f, "Bearer k-bulk", "9.9.9.9:1")),
                     BATON_PRIO_BULK);
    assert_int_equal(baton_auth_key_class(a, mkreq(&f, "Bearer k-flag", "9.9.9.9:1")),
                     BATON_PRIO_INTERACTIVE);
    assert_int_equal(baton_auth_key_class(a, mkreq(&f, "Bearer k-plain", "9.9.9.9:1")),
                     BATON_PRIO_NONE);
    assert_int_equal(baton_auth_key_class(a, mkreq(&f, "Bearer nope", "9.9.9.9:1")),
                     BATON_PRIO_NONE);
    assert_int_equal(baton_auth_key_class(a, mkreq(&f, NULL, "9.9.9.9:1")), BATON_PRIO_NONE);
    /* a bad attribute: the reload is refused, the old classes stay */
    write_file(path, "k-secret-bad priority=urgent\n");
    assert_int_not_equal(baton_auth_reload(a, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "priority="));
    assert_null(strstr(err, "k-secret-bad"));
    assert_int_equal(baton_auth_key_class(a, mkreq(&f, "Bearer k-sys", "9.9.9.9:1")),
                     BATON_PRIO_SYSTEM);
    baton_auth_free(a);
    baton_config_free(&cfg);
    /* ... and at start, for --api-key too */
    assert_int_equal(baton_config_init(&cfg), 0);
    const char *argv2[] = {"baton", "--api-key", "k1 owner=me"};
    assert_int_equal(baton_config_from_args(&cfg, 3, (char *const *)argv2, err, sizeof(err)), 0);
    assert_int_equal(baton_auth_create(&a, &cfg, err, sizeof(err)), BATON_EINVAL);
    assert_non_null(strstr(err, "--api-key"));
    baton_config_free(&cfg);
    unlink(path);
    rmdir(dir);
}

static void test_no_keys_open(void **state)
{
    (void)state;
    baton_config_t cfg;
    char err[256] = "";
    assert_int_equal(baton_config_init(&cfg), 0);
    baton_auth_t *a = NULL;
    assert_int_equal(baton_auth_create(&a, &cfg, err, sizeof(err)), 0);
    fake_req_t f;
    assert_int_equal(baton_auth_check(a, mkreq(&f, NULL, "9.9.9.9:1"), BATON_ROUTE_INFERENCE),
                     BATON_AUTH_OK);
    /* no admin token: loopback only */
    assert_false(baton_auth_has_admin_token(a));
    assert_int_equal(baton_auth_check(a, mkreq(&f, NULL, "127.0.0.1:1"), BATON_ROUTE_ADMIN),
                     BATON_AUTH_OK);
    assert_int_equal(baton_auth_check(a, mkreq(&f, "Bearer x", "9.9.9.9:1"), BATON_ROUTE_ADMIN),
                     BATON_AUTH_NOT_LOOPBACK);
    assert_int_equal(baton_auth_check(a, mkreq(&f, NULL, "[::1]:1"), BATON_ROUTE_ADMIN),
                     BATON_AUTH_OK);
    baton_auth_free(a);
    baton_config_free(&cfg);
}

static void test_admin_and_metrics_tokens(void **state)
{
    (void)state;
    baton_config_t cfg;
    char err[256] = "";
    assert_int_equal(baton_config_init(&cfg), 0);
    const char *argv[] = {"baton", "--admin-token", "adm", "--metrics-token",
                          "met",   "--api-key",     "k"};
    assert_int_equal(baton_config_from_args(&cfg, 7, (char *const *)argv, err, sizeof(err)), 0);
    baton_auth_t *a = NULL;
    assert_int_equal(baton_auth_create(&a, &cfg, err, sizeof(err)), 0);
    fake_req_t f;
    const baton_route_class_t adm = BATON_ROUTE_ADMIN, met = BATON_ROUTE_METRICS;
    /* with a token, loopback is no excuse, and the API key is not the admin token */
    assert_int_equal(baton_auth_check(a, mkreq(&f, NULL, "127.0.0.1:1"), adm),
                     BATON_AUTH_BAD_TOKEN);
    assert_int_equal(baton_auth_check(a, mkreq(&f, "Bearer k", "127.0.0.1:1"), adm),
                     BATON_AUTH_BAD_TOKEN);
    assert_int_equal(baton_auth_check(a, mkreq(&f, "Bearer adm", "9.9.9.9:1"), adm), BATON_AUTH_OK);
    assert_int_equal(baton_auth_check(a, mkreq(&f, "Bearer adm", "9.9.9.9:1"), met),
                     BATON_AUTH_BAD_TOKEN);
    assert_int_equal(baton_auth_check(a, mkreq(&f, "Bearer met", "9.9.9.9:1"), met), BATON_AUTH_OK);
    /* the admin token is no API key either */
    assert_int_equal(
        baton_auth_check(a, mkreq(&f, "Bearer adm", "9.9.9.9:1"), BATON_ROUTE_INFERENCE),
        BATON_AUTH_NO_KEY);
    baton_auth_free(a);
    baton_config_free(&cfg);
}

static void test_rate_per_key(void **state)
{
    (void)state;
    baton_config_t cfg;
    char err[256] = "";
    assert_int_equal(baton_config_init(&cfg), 0);
    const char *argv[] = {"baton", "--api-key", "a", "--api-key", "b", "--rate-limit", "2:3"};
    assert_int_equal(baton_config_from_args(&cfg, 7, (char *const *)argv, err, sizeof(err)), 0);
    baton_auth_t *au = NULL;
    assert_int_equal(baton_auth_create(&au, &cfg, err, sizeof(err)), 0);
    fake_req_t fa, fb, fa2;
    baton_http_req_t *ra = mkreq(&fa, "Bearer a", "9.9.9.9:1");
    baton_http_req_t *ra_other_client = mkreq(&fa2, "Bearer a", "8.8.8.8:2");
    baton_http_req_t *rb = mkreq(&fb, "Bearer b", "9.9.9.9:1");
    uint64_t t = 100 * SEC;
    unsigned retry = 0;
    for (int i = 0; i < 3; i++)
        assert_int_equal(baton_auth_rate(au, ra, t, &retry), 1);
    /* the bucket is the key's, whichever client uses it */
    assert_int_equal(baton_auth_rate(au, ra_other_client, t, &retry), 0);
    assert_int_equal(retry, 1);
    /* key b has a bucket of its own */
    assert_int_equal(baton_auth_rate(au, rb, t, &retry), 1);
    /* 2 per second: one more after 500 ms */
    assert_int_equal(baton_auth_rate(au, ra, t + SEC / 2, &retry), 1);
    assert_int_equal(baton_auth_rate(au, ra, t + SEC / 2, &retry), 0);
    baton_auth_free(au);
    baton_config_free(&cfg);

    /* without keys, per client address (the port does not matter) */
    assert_int_equal(baton_config_init(&cfg), 0);
    const char *argv2[] = {"baton", "--rate-limit", "1"};
    assert_int_equal(baton_config_from_args(&cfg, 3, (char *const *)argv2, err, sizeof(err)), 0);
    assert_int_equal(baton_auth_create(&au, &cfg, err, sizeof(err)), 0);
    fake_req_t f1, f2, f3;
    assert_int_equal(baton_auth_rate(au, mkreq(&f1, NULL, "10.0.0.1:1000"), t, &retry), 1);
    assert_int_equal(baton_auth_rate(au, mkreq(&f2, NULL, "10.0.0.1:2000"), t, &retry), 0);
    assert_int_equal(baton_auth_rate(au, mkreq(&f3, NULL, "10.0.0.2:1000"), t, &retry), 1);
    /* a flood of new addresses cannot grow the table or break the limit of a busy one */
    for (int i = 0; i < 100000; i++) {
        char peer[64];
        snprintf(peer, sizeof(peer), "10.%d.%d.%d:1", (i >> 16) & 255, (i >> 8) & 255, i & 255);
        baton_auth_rate(au, mkreq(&f1, NULL, peer), t, NULL);
    }
    baton_auth_free(au);
    baton_config_free(&cfg);

    /* a bad --rate-limit is a configuration error */
    assert_int_equal(baton_config_init(&cfg), 0);
    const char *argv3[] = {"baton", "--rate-limit", "0"};
    assert_int_equal(baton_config_from_args(&cfg, 3, (char *const *)argv3, err, sizeof(err)),
                     BATON_EINVAL);
    assert_non_null(strstr(err, "--rate-limit"));
    baton_config_free(&cfg);

    /* the key sent to workers becomes a header: control bytes are refused at start-up */
    assert_int_equal(baton_config_init(&cfg), 0);
    const char *argv4[] = {"baton", "--worker-api-key", "wk\r\nX-Evil: 1"};
    assert_int_equal(baton_config_from_args(&cfg, 3, (char *const *)argv4, err, sizeof(err)), 0);
    assert_int_equal(baton_auth_create(&au, &cfg, err, sizeof(err)), BATON_EINVAL);
    assert_non_null(strstr(err, "--worker-api-key"));
    baton_config_free(&cfg);
}

static void test_config_json(void **state)
{
    (void)state;
    baton_config_t cfg;
    char err[256] = "";
    assert_int_equal(baton_config_init(&cfg), 0);
    const char *json = "{\"auth\": {\"api_key\": [\"j1\", \"j2\"], \"rate_limit\": \"5:10\", "
                       "\"forward_authorization\": true, \"worker_api_key\": \"wk\", "
                       "\"admin_token\": \"adm\", \"metrics_token\": \"met\"}, "
                       "\"limits\": {\"max_buffered_bytes\": 1048576}}";
    assert_int_equal(baton_config_load_json(&cfg, json, "test", err, sizeof(err)), 0);
    assert_int_equal(cfg.api_keys.n, 2);
    assert_string_equal(cfg.api_keys.v[1], "j2");
    assert_string_equal(cfg.rate_limit, "5:10");
    assert_int_equal(cfg.forward_authorization, 1);
    assert_string_equal(cfg.worker_api_key, "wk");
    assert_string_equal(cfg.admin_token, "adm");
    assert_string_equal(cfg.metrics_token, "met");
    assert_int_equal(cfg.limits.max_buffered_bytes, 1048576);
    /* a single string is one key; the command line adds to the file's keys */
    assert_int_equal(
        baton_config_load_json(&cfg, "{\"auth\": {\"api_key\": \"j3\"}}", "test", err, sizeof(err)),
        0);
    assert_int_equal(cfg.api_keys.n, 3);
    const char *argv[] = {"baton", "--forward-authorization=false", "--api-key=c1"};
    assert_int_equal(baton_config_from_args(&cfg, 3, (char *const *)argv, err, sizeof(err)), 0);
    assert_int_equal(cfg.forward_authorization, 0);
    assert_int_equal(cfg.api_keys.n, 4);
    /* wrong types are errors, not silently ignored */
    const char *bad[] = {"{\"auth\": {\"api_key\": [1]}}", "{\"auth\": {\"api_key\": \"\"}}",
                         "{\"auth\": {\"forward_authorization\": 1}}",
                         "{\"auth\": {\"rate_limit\": \"fast\"}}",
                         "{\"auth\": {\"api_keys\": \"x\"}}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
        assert_int_equal(baton_config_load_json(&cfg, bad[i], "test", err, sizeof(err)),
                         BATON_EINVAL);
    baton_config_free(&cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ct_equal),
        cmocka_unit_test(test_bearer_and_loopback),
        cmocka_unit_test(test_keys_flags_and_file),
        cmocka_unit_test(test_no_keys_open),
        cmocka_unit_test(test_key_priority_class),
        cmocka_unit_test(test_admin_and_metrics_tokens),
        cmocka_unit_test(test_rate_per_key),
        cmocka_unit_test(test_config_json),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
