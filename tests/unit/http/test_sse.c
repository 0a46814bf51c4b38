/* test_sse.c — SSE framing: whole bodies, data-line joining, the single-data fast path, and the
 * incremental splitter fed in every chunking. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "baton/error.h"
#include "http/sse.h"

/* Events seen, each as "<payload>|". */
static int collect_cb(const char *payload, size_t len, void *arg)
{
    baton_buf_t *out = arg;
    if (baton_buf_append(out, payload, len) || baton_buf_append(out, "|", 1))
        return BATON_ENOMEM;
    return 0;
}

static void test_each(void **state)
{
    (void)state;
    static const char body[] = "data: one\n\n"
                               ": a comment, no data\n\n"
                               "data:two\r\n\r\n"
                               "event: x\ndata: a\ndata:  b\r\ndata:\n\n"
                               "data: tail without blank line\n";
    baton_buf_t out = BATON_BUF_INIT;
    assert_int_equal(baton_sse_each(body, sizeof(body) - 1, collect_cb, &out), 0);
    assert_string_equal(out.data, "one|two|a\n b\n|");
    baton_buf_free(&out);
}

static int stop_cb(const char *payload, size_t len, void *arg)
{
    (*(int *)arg)++;
    return 7;
}

static void test_each_stops(void **state)
{
    (void)state;
    int calls = 0;
    const char *body = "data: 1\n\ndata: 2\n\n";
    assert_int_equal(baton_sse_each(body, strlen(body), stop_cb, &calls), 7);
    assert_int_equal(calls, 1);
}

static void test_single_data(void **state)
{
    (void)state;
    const char *p = NULL;
    size_t n = 0;
    const char *ev = "id: 3\r\ndata: {\"x\":1}\r\n\r\n";
    assert_int_equal(baton_sse_single_data(ev, strlen(ev), &p, &n), 1);
    assert_int_equal(n, 7);
    assert_memory_equal(p, "{\"x\":1}", 7);
    ev = "data:x\n\n";
    assert_int_equal(baton_sse_single_data(ev, strlen(ev), &p, &n), 1);
    assert_int_equal(n, 1);
    assert_memory_equal(p, "x", 1);
    ev = "data: a\ndata: b\n\n";
    assert_int_equal(baton_sse_single_data(ev, strlen(ev), &p, &n), 0);
    ev = ": keep-alive\n\n";
    assert_int_equal(baton_sse_single_data(ev, strlen(ev), &p, &n), 0);
    ev = "dat: no\n\n";
    assert_int_equal(baton_sse_single_data(ev, strlen(ev), &p, &n), 0);
}

/* The splitter hands out raw events; feeding in any chunking gives the same events. */
static void test_feed_chunked(void **state)
{
    (void)state;
    static const char stream[] = "data: {\"a\":1}\n\n"
                                 "data: b\r\n\r\n"
                                 "data: c\ndata: d\n\n"
                                 "data: partial";
    const size_t len = sizeof(stream) - 1;
    const char *want = "data: {\"a\":1}\n\n|data: b\r\n\r\n|data: c\ndata: d\n\n|";
    for (size_t chunk = 1; chunk <= len; chunk++) {
        baton_sse_splitter_t s = BATON_SSE_SPLITTER_INIT;
        baton_buf_t out = BATON_BUF_INIT;
        for (size_t off = 0; off < len; off += chunk) {
            size_t n = len - off < chunk ? len - off : chunk;
            assert_int_equal(baton_sse_feed(&s, stream + off, n, collect_cb, &out), 0);
        }
        assert_string_equal(out.data, want);
        assert_int_equal(baton_sse_pending(&s), strlen("data: partial"));
        assert_memory_equal(s.pending.data, "data: partial", baton_sse_pending(&s));
        baton_sse_splitter_free(&s);
        baton_buf_free(&out);
    }
}

static void test_error_event(void **state)
{
    (void)state;
    baton_buf_t out = BATON_BUF_INIT;
    assert_int_equal(baton_sse_error_event(&out, "bad \"x\"", NULL, "c1"), 0);
    assert_string_equal(out.data, "data: {\"error\":{\"message\":\"bad \\\"x\\\"\",\"type\":"
                                  "\"upstream_error\",\"code\":\"c1\"}}\n\ndata: [DONE]\n\n");
    baton_buf_free(&out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each),        cmocka_unit_test(test_each_stops),
        cmocka_unit_test(test_single_data), cmocka_unit_test(test_feed_chunked),
        cmocka_unit_test(test_error_event),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
