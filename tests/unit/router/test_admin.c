/* test_admin.c — the worker registration API over a real HTTP server on loopback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <uv.h>

#include "baton/error.h"
#include "http/server.h"
#include "router/control/admin.h"
#include "router/control/registry.h"

/* ---- a server on its own loop thread ---- */

typedef struct {
    uv_loop_t loop;
    uv_async_t stop;
    baton_http_server_t *srv;
    baton_registry_t *reg;
    pthread_t thread;
    int port;
} fixture_t;

static void handler(baton_http_req_t *req, void *ctx)
{
    fixture_t *f = ctx;
    if (!baton_admin_handle(req, f->reg))
        baton_http_respond_error(req, 404, "not an admin path", "not_found", NULL, NULL);
}

static void on_server_closed(baton_http_server_t *srv) {}

static void on_stop(uv_async_t *a)
{
    fixture_t *f = a->data;
    baton_http_server_close(f->srv, on_server_closed);
    uv_close((uv_handle_t *)&f->stop, NULL);
}

static void *loop_main(void *arg)
{
    fixture_t *f = arg;
    uv_run(&f->loop, UV_RUN_DEFAULT);
    return NULL;
}

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof(*f));
    if (f == NULL || baton_registry_create(&f->reg) != 0 || uv_loop_init(&f->loop) != 0)
        return -1;
    if (baton_http_server_create(&f->srv, &f->loop, NULL, handler, f) != 0)
        return -1;
    if (baton_http_server_listen(f->srv, "127.0.0.1", 0, 0) != 0)
        return -1;
    f->port = baton_http_server_port(f->srv);
    if (uv_async_init(&f->loop, &f->stop, on_stop) != 0)
        return -1;
    f->stop.data = f;
    if (pthread_create(&f->thread, NULL, loop_main, f) != 0)
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    uv_async_send(&f->stop);
    pthread_join(f->thread, NULL);
    uv_loop_close(&f->loop);
    baton_registry_destroy(f->reg);
    free(f);
    return 0;
}

/* ---- a blocking HTTP/1.1 client ---- */

typedef struct {
    int status;
    char headers[4096];
    char body[65536];
    json_t *json;
} resp_t;

static void call(fixture_t *f, const char *method, const char *target, const char *body, resp_t *r)
{
    memset(r, 0, sizeof(*r));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct timeval tv = {10, 0}; /* bounded: a hung server fails the test instead of hanging */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)f->port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    char req[8192];
    size_t blen = body ? strlen(body) : 0;
    int n = snprintf(req, sizeof(req),
                     "%s %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     method, target, blen, body ? body : "");
    assert_int_equal(write(fd, req, (size_t)n), n);
    static char buf[80000];
    size_t len = 0;
    for (;;) {
        ssize_t got = read(fd, buf + len, sizeof(buf) - 1 - len);
        assert_true(got >= 0);
        if (got == 0)
            break;
        len += (size_t)got;
        buf[len] = '\0';
        char *hend = strstr(buf, "\r\n\r\n");
        const char *cl = hend ? strcasestr(buf, "\r\nContent-Length:") : NULL;
        if (cl != NULL && cl < hend && len >= (size_t)(hend + 4 - buf) + strtoul(cl + 17, NULL, 10))
            break;
    }
    close(fd);
    buf[len] = '\0';
    assert_int_equal(sscanf(buf, "HTTP/1.1 %d", &r->status), 1);
    char *hend = strstr(buf, "\r\n\r\n");
    assert_non_null(hend);
    size_t hl = (size_t)(hend - buf);
    assert_true(hl < sizeof(r->headers));
    memcpy(r->headers, buf, hl);
    snprintf(r->body, sizeof(r->body), "%s", hend + 4);
    r->json = json_loads(r->body, 0, NULL);
}

static void done(resp_t *r)
{
    json_decref(r->json);
    r->json = NULL;
}

static const char *jstr(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* Every route's one error shape: {"error":{"message","type","param","code"}}. */
static void expect_error(resp_t *r, int status, const char *code)
{
    if (r->status != status)
        fail_msg("want %d, got %d: %s", status, r->status, r->body);
    assert_non_null(r->json);
    json_t *e = json_object_get(r->json, "error");
    assert_true(json_is_object(e));
    assert_non_null(jstr(e, "message"));
    assert_string_equal(jstr(e, "type"), status >= 500 ? "server_error" : "invalid_request_error");
    assert_true(json_is_null(json_object_get(e, "param")));
    assert_string_equal(jstr(e, "code"), code);
}

/* ---- tests ---- */

static void test_register_list_get_delete(void **state)
{
    fixture_t *f = *state;
    resp_t r;
    call(f, "POST", "/workers",
         "{\"url\":\"http://127.0.0.1:30001\",\"worker_type\":\"prefill\",\"bootstrap_port\":8998,"
         "\"api_key\":\"secret\",\"model_id\":\"m1\",\"priority\":10,\"cost\":0.5,"
         "\"labels\":{\"zone\":\"a\"}}",
         &r);
    assert_int_equal(r.status, 202);
    assert_non_null(r.json);
    const char *id = jstr(r.json, "id");
    assert_non_null(id);
    char pid[BATON_WORKER_ID_MAX + 1];
    snprintf(pid, sizeof(pid), "%s", id);
    char loc[64];
    snprintf(loc, sizeof(loc), "\r\nLocation: /workers/%s", pid);
    assert_non_null(strcasestr(r.headers, loc));
    assert_string_equal(jstr(r.json, "url"), "http://127.0.0.1:30001");
    assert_string_equal(jstr(r.json, "worker_type"), "prefill");
    done(&r);

    call(f, "POST", "/workers", "{\"url\":\"http://127.0.0.1:30002\",\"worker_type\":\"decode\"}",
         &r);
    assert_int_equal(r.status, 202);
    char did[BATON_WORKER_ID_MAX + 1];
    snprintf(did, sizeof(did), "%s", jstr(r.json, "id"));
    done(&r);
    call(f, "POST", "/workers", "{\"url\":\"http://127.0.0.1:30003\"}", &r); /* regular */
    assert_int_equal(r.status, 202);
    done(&r);

    /* duplicate URL, even spelled differently */
    call(f, "POST", "/workers", "{\"url\":\"http://127.0.0.1:30001/\",\"worker_type\":\"decode\"}",
         &r);
    expect_error(&r, 409, "WORKER_ALREADY_EXISTS");
    done(&r);

    call(f, "GET", "/workers", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(r.json);
    assert_int_equal(json_integer_value(json_object_get(r.json, "total")), 3);
    json_t *stats = json_object_get(r.json, "stats");
    assert_int_equal(json_integer_value(json_object_get(stats, "prefill_count")), 1);
    assert_int_equal(json_integer_value(json_object_get(stats, "decode_count")), 1);
    assert_int_equal(json_integer_value(json_object_get(stats, "regular_count")), 1);
    json_t *ws = json_object_get(r.json, "workers");
    assert_int_equal(json_array_size(ws), 3);
    json_t *w0 = json_array_get(ws, 0);
    assert_string_equal(jstr(w0, "id"), pid);
    assert_string_equal(jstr(w0, "worker_type"), "prefill");
    assert_int_equal(json_integer_value(json_object_get(w0, "bootstrap_port")), 8998);
    assert_string_equal(jstr(w0, "model_id"), "m1");
    assert_int_equal(json_integer_value(json_object_get(w0, "priority")), 10);
    assert_string_equal(jstr(json_object_get(w0, "labels"), "zone"), "a");
    assert_int_equal(json_integer_value(json_object_get(w0, "in_flight")), 0);
    assert_string_equal(jstr(w0, "health"), "healthy");
    assert_string_equal(jstr(w0, "breaker"), "closed");
    assert_true(json_is_false(json_object_get(w0, "draining")));
    assert_null(strstr(r.body, "secret")); /* the api_key is never shown */
    json_t *w1 = json_array_get(ws, 1);
    assert_true(json_is_null(json_object_get(w1, "bootstrap_port")));
    done(&r);

    char path[128];
    snprintf(path, sizeof(path), "/workers/%s", did);
    call(f, "GET", path, NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(jstr(r.json, "url"), "http://127.0.0.1:30002");
    assert_string_equal(jstr(r.json, "worker_type"), "decode");
    done(&r);
    /* a URL-encoded worker URL works as the id too */
    call(f, "GET", "/workers/http%3A%2F%2F127.0.0.1%3A30002", NULL, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(jstr(r.json, "id"), did);
    done(&r);

    call(f, "DELETE", path, NULL, &r);
    assert_int_equal(r.status, 202);
    assert_string_equal(jstr(r.json, "id"), did);
    done(&r);
    call(f, "GET", path, NULL, &r);
    expect_error(&r, 404, "WORKER_NOT_FOUND");
    done(&r);
    call(f, "DELETE", path, NULL, &r);
    expect_error(&r, 404, "WORKER_NOT_FOUND");
    done(&r);
    call(f, "GET", "/workers/w-00000000", NULL, &r);
    expect_error(&r, 404, "WORKER_NOT_FOUND");
    done(&r);
    assert_int_equal(baton_registry_size(f->reg), 2);
}

static void test_bad_registrations(void **state)
{
    fixture_t *f = *state;
    const char *bad[] = {
        "",
        "not json",
        "[]",
        "{}",
        "{\"url\":5}",
        "{\"url\":\"127.0.0.1:1\"}",
        "{\"url\":\"ftp://h:1\"}",
        "{\"url\":\"http://h:1\",\"worker_type\":\"big\"}",
        "{\"url\":\"http://h:1\",\"worker_type\":3}",
        "{\"url\":\"http://h:1\",\"worker_type\":\"decode\",\"bootstrap_port\":8998}",
        "{\"url\":\"http://h:1\",\"worker_type\":\"prefill\",\"bootstrap_port\":0}",
        "{\"url\":\"http://h:1\",\"worker_type\":\"prefill\",\"bootstrap_port\":\"x\"}",
        "{\"url\":\"http://h:1\",\"priority\":-3}",
        "{\"url\":\"http://h:1\",\"cost\":\"cheap\"}",
        "{\"url\":\"http://h:1\",\"labels\":[1]}",
        "{\"url\":\"http://h:1\",\"api_key\":7}",
        "{\"url\":\"http://h:1\",\"url\":\"http://h:2\"}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        resp_t r;
        call(f, "POST", "/workers", bad[i], &r);
        if (r.status != 400)
            fail_msg("body %s: want 400, got %d %s", bad[i], r.status, r.body);
        expect_error(&r, 400, "BAD_REQUEST");
        done(&r);
    }
    assert_int_equal(baton_registry_size(f->reg), 0);
    /* prefill with a null bootstrap_port is fine */
    resp_t r;
    call(f, "POST", "/workers",
         "{\"url\":\"http://h:1\",\"worker_type\":\"prefill\",\"bootstrap_port\":null}", &r);
    assert_int_equal(r.status, 202);
    done(&r);
}

static void test_legacy(void **state)
{
    fixture_t *f = *state;
    resp_t r;
    call(f, "POST",
         "/add_worker?url=http%3A%2F%2F127.0.0.1%3A9001&worker_type=prefill&bootstrap_port=8998",
         NULL, &r);
    assert_int_equal(r.status, 200);
    done(&r);
    call(f, "POST", "/add_worker?url=http://127.0.0.1:9002&worker_type=decode", NULL, &r);
    assert_int_equal(r.status, 200);
    done(&r);
    call(f, "POST", "/add_worker?url=http://127.0.0.1:9003", NULL, &r); /* regular */
    assert_int_equal(r.status, 200);
    done(&r);
    call(f, "POST", "/add_worker?url=http://127.0.0.1:9002", NULL, &r);
    expect_error(&r, 409, "WORKER_ALREADY_EXISTS");
    done(&r);
    call(f, "POST", "/add_worker?worker_type=decode", NULL, &r);
    expect_error(&r, 400, "BAD_REQUEST");
    done(&r);
    call(f, "POST", "/add_worker?url=http://h:1&worker_type=prefill&bootstrap_port=99999", NULL,
         &r);
    expect_error(&r, 400, "BAD_REQUEST");
    done(&r);
    call(f, "POST", "/add_worker?url=http%ZZ", NULL, &r);
    expect_error(&r, 400, "BAD_REQUEST");
    done(&r);

    baton_worker_t *w = baton_registry_find_url(f->reg, "http://127.0.0.1:9001");
    assert_non_null(w);
    assert_int_equal(w->role, BATON_ROLE_PREFILL);
    assert_int_equal(w->bootstrap_port, 8998);
    baton_worker_unref(w);

    call(f, "GET", "/list_workers", NULL, &r);
    assert_int_equal(r.status, 200);
    json_t *urls = json_object_get(r.json, "urls");
    assert_int_equal(json_array_size(urls), 3);
    assert_string_equal(json_string_value(json_array_get(urls, 0)), "http://127.0.0.1:9001");
    done(&r);

    call(f, "POST", "/remove_worker?url=http%3A%2F%2F127.0.0.1%3A9001", NULL, &r);
    assert_int_equal(r.status, 200);
    done(&r);
    call(f, "POST", "/remove_worker?url=http%3A%2F%2F127.0.0.1%3A9001", NULL, &r);
    expect_error(&r, 404, "WORKER_NOT_FOUND");
    done(&r);
    call(f, "POST", "/remove_worker", NULL, &r);
    expect_error(&r, 400, "BAD_REQUEST");
    done(&r);
    assert_int_equal(baton_registry_size(f->reg), 2);
}

static void test_methods_and_paths(void **state)
{
    fixture_t *f = *state;
    struct {
        const char *method, *path, *allow;
    } cases[] = {
        {"PUT", "/workers", "GET, POST"},        {"DELETE", "/workers", "GET, POST"},
        {"POST", "/workers/w-1", "GET, DELETE"}, {"GET", "/add_worker", "POST"},
        {"GET", "/remove_worker", "POST"},       {"POST", "/list_workers", "GET"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        resp_t r;
        call(f, cases[i].method, cases[i].path, NULL, &r);
        expect_error(&r, 405, "METHOD_NOT_ALLOWED");
        char allow[64];
        snprintf(allow, sizeof(allow), "\r\nAllow: %s", cases[i].allow);
        assert_non_null(strcasestr(r.headers, allow));
        done(&r);
    }
    /* not ours: the handler returns 0 and the caller answers */
    resp_t r;
    call(f, "GET", "/v1/models", NULL, &r);
    assert_int_equal(r.status, 404);
    assert_non_null(strstr(r.body, "not an admin path"));
    done(&r);
    call(f, "GET", "/workersx", NULL, &r);
    assert_int_equal(r.status, 404);
    assert_non_null(strstr(r.body, "not an admin path"));
    done(&r);
}

static void test_query_helpers(void **state)
{
    char out[64];
    assert_int_equal(baton_url_decode("a%20b+c%2F", 10, out, sizeof(out)), 0);
    assert_string_equal(out, "a b c/");
    assert_int_equal(baton_url_decode("%2", 2, out, sizeof(out)), BATON_EINVAL);
    assert_int_equal(baton_url_decode("%zz", 3, out, sizeof(out)), BATON_EINVAL);
    assert_int_equal(baton_url_decode("%00", 3, out, sizeof(out)), BATON_EINVAL);
    assert_int_equal(baton_url_decode("abcdef", 6, out, 4), BATON_EINVAL); /* too long */
    assert_int_equal(baton_url_decode("", 0, out, sizeof(out)), 0);
    assert_string_equal(out, "");

    assert_int_equal(baton_query_get("a=1&url=x%3Ay&b", "url", out, sizeof(out)), 1);
    assert_string_equal(out, "x:y");
    assert_int_equal(baton_query_get("a=1&b", "b", out, sizeof(out)), 1);
    assert_string_equal(out, "");
    assert_int_equal(baton_query_get("aurl=1", "url", out, sizeof(out)), 0);
    assert_int_equal(baton_query_get("", "url", out, sizeof(out)), 0);
    assert_int_equal(baton_query_get("url=%G0", "url", out, sizeof(out)), BATON_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_register_list_get_delete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_registrations, setup, teardown),
        cmocka_unit_test_setup_teardown(test_legacy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_methods_and_paths, setup, teardown),
        cmocka_unit_test(test_query_helpers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
