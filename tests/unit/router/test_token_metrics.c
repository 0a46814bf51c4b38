/* test_token_metrics.c — TTFT / inter-token latency from relayed SSE bytes, split anywhere. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/metrics.h"
#include "router/dataplane/token_metrics.h"

#define S(x) ((uint64_t)((x)*1e9))

/* The _count sample of a family for route r, from the rendered text. */
static double sample(baton_metrics_t *reg, const char *name)
{
    baton_buf_t b = BATON_BUF_INIT;
    assert_int_equal(baton_metrics_render(reg, &b), 0);
    const char *p = strstr(b.data, name);
    double v = p ? strtod(p + strlen(name), NULL) : -1;
    baton_buf_free(&b);
    return v;
}

static void events_split_across_reads(void **state)
{
    (void)state;
    baton_metrics_t *reg = baton_metrics_create();
    baton_token_metrics_t *m = baton_token_metrics_create(reg);
    baton_token_scan_t s;
    baton_token_scan_start(m, &s, "/v1/chat/completions", S(1));
    baton_token_scan(&s, "data: {\"a\":1}\n", 14, S(1.25));     /* no blank line yet */
    baton_token_scan(&s, "\n", 1, S(1.5));                      /* ends the first event */
    baton_token_scan(&s, "data: b\n\ndata: c\r\n\r", 19, S(2)); /* one event + half of one */
    baton_token_scan(&s, "\ndata: [DONE]\n\n", 15, S(3));       /* ends c; [DONE] is no token */
    const char *ttft = "baton_time_to_first_token_seconds_sum{route=\"/v1/chat/completions\"} ";
    const char *ttft_n = "baton_time_to_first_token_seconds_count{route=\"/v1/chat/completions\"} ";
    const char *itl = "baton_inter_token_latency_seconds_sum{route=\"/v1/chat/completions\"} ";
    const char *itl_n = "baton_inter_token_latency_seconds_count{route=\"/v1/chat/completions\"} ";
    assert_true(sample(reg, ttft) > 0.499 && sample(reg, ttft) < 0.501);
    assert_int_equal((int)sample(reg, ttft_n), 1);
    assert_int_equal((int)sample(reg, itl_n), 2); /* b at 2.0 (gap 0.5), c at 3.0 (gap 1.0) */
    assert_true(sample(reg, itl) > 1.499 && sample(reg, itl) < 1.501);
    baton_token_metrics_destroy(m);
    baton_metrics_destroy(reg);
}

static void events_in_one_read_share_its_gap(void **state)
{
    (void)state;
    baton_metrics_t *reg = baton_metrics_create();
    baton_token_metrics_t *m = baton_token_metrics_create(reg);
    baton_token_scan_t s;
    baton_token_scan_start(m, &s, "/generate", S(10));
    baton_token_scan(&s, "data: 1\n\n", 9, S(11));
    baton_token_scan(&s, "data: 2\n\ndata: 3\n\ndata: 4\n\n", 27, S(14)); /* 3 events, 3 s */
    const char *itl = "baton_inter_token_latency_seconds_sum{route=\"/generate\"} ";
    const char *itl_n = "baton_inter_token_latency_seconds_count{route=\"/generate\"} ";
    assert_int_equal((int)sample(reg, itl_n), 3);
    assert_true(sample(reg, itl) > 2.999 && sample(reg, itl) < 3.001);
    baton_token_metrics_destroy(m);
    baton_metrics_destroy(reg);
}

static void unarmed_scan_is_a_no_op(void **state)
{
    (void)state;
    baton_token_scan_t s;
    baton_token_scan_start(NULL, &s, "/x", S(1)); /* no metrics: nothing armed */
    baton_token_scan(&s, "data: 1\n\n", 9, S(2));
    assert_int_equal(s.last_ns, 0);
}

/* The reference rule, one byte at a time: a '\n' preceded by "\n" or "\n\r" ends an event,
 * "data: [DONE]" excepted (both inside one read, as the scan sees them). */
static unsigned naive_events(const char *all, size_t from, size_t to)
{
    unsigned n = 0;
    for (size_t i = from; i < to; i++) {
        if (all[i] != '\n' || i == 0)
            continue;
        int blank = all[i - 1] == '\n' || (i >= 2 && all[i - 1] == '\r' && all[i - 2] == '\n');
        int done = i - from >= 7 && memcmp(all + i - 7, "[DONE]\n", 7) == 0;
        n += blank && !done;
    }
    return n;
}

static void events_counted_per_read_at_every_split(void **state)
{
    (void)state;
    /* LF and CRLF events, empty lines, a comment, runs of blank lines, [DONE]. */
    static const char stream[] = "data: {\"a\":1}\n\ndata: b\r\n\r\n: keep-alive\n\n"
                                 "event: x\ndata: c\ndata: d\n\n\n\ndata: e\r\n\r\n\r\n"
                                 "data: [DONE]\n\n";
    const size_t len = sizeof(stream) - 1;
    baton_metrics_t *reg = baton_metrics_create();
    baton_token_metrics_t *m = baton_token_metrics_create(reg);
    for (size_t a = 1; a < len; a++) {
        for (size_t b = a; b < len; b++) { /* three reads: [0,a) [a,b) [b,len) */
            baton_token_scan_t s;
            baton_token_scan_start(m, &s, "/v1/completions", S(1));
            size_t cut[] = {0, a, b, len};
            for (int k = 0; k < 3; k++) {
                unsigned got = baton_token_scan_events(&s, stream + cut[k], cut[k + 1] - cut[k]);
                assert_int_equal(got, naive_events(stream, cut[k], cut[k + 1]));
            }
        }
    }
    baton_token_scan_t s;
    baton_token_scan_start(m, &s, "/v1/completions", S(1));
    /* In one read: every blank line but the one after [DONE] (runs of them count each). */
    assert_int_equal(baton_token_scan_events(&s, stream, len), 8);
    baton_token_metrics_destroy(m);
    baton_metrics_destroy(reg);
}

static void observe_half_records_only_events(void **state)
{
    (void)state;
    baton_metrics_t *reg = baton_metrics_create();
    baton_token_metrics_t *m = baton_token_metrics_create(reg);
    baton_token_scan_t s;
    baton_token_scan_start(m, &s, "/generate", S(10));
    assert_int_equal(baton_token_scan_events(&s, "data: 1\n", 8), 0);
    baton_token_scan_observe(&s, 0, S(11)); /* no event: no sample, no clock kept */
    assert_int_equal(s.last_ns, 0);
    assert_int_equal(baton_token_scan_events(&s, "\n", 1), 1);
    baton_token_scan_observe(&s, 1, S(12));
    assert_int_equal(s.last_ns, S(12));
    const char *ttft = "baton_time_to_first_token_seconds_sum{route=\"/generate\"} ";
    const char *ttft_n = "baton_time_to_first_token_seconds_count{route=\"/generate\"} ";
    assert_int_equal((int)sample(reg, ttft_n), 1);
    assert_true(sample(reg, ttft) > 1.999 && sample(reg, ttft) < 2.001);
    baton_token_metrics_destroy(m);
    baton_metrics_destroy(reg);
}

/* The per-thread route cache must not hand a new metrics set the children of a destroyed one
 * (a new set may well be allocated at the old one's address), nor mix up two live sets. */
static void route_cache_keeps_sets_apart(void **state)
{
    (void)state;
    static const char route[] = "/v1/chat/completions";
    const char *n = "baton_time_to_first_token_seconds_count{route=\"/v1/chat/completions\"} ";
    for (int round = 0; round < 3; round++) {
        baton_metrics_t *reg1 = baton_metrics_create(), *reg2 = baton_metrics_create();
        baton_token_metrics_t *m1 = baton_token_metrics_create(reg1);
        baton_token_metrics_t *m2 = baton_token_metrics_create(reg2);
        for (int i = 0; i < 3; i++) { /* m1: 3 streams, m2: 2, interleaved */
            baton_token_scan_t s;
            baton_token_scan_start(m1, &s, route, S(1));
            baton_token_scan(&s, "data: 1\n\n", 9, S(2));
            if (i < 2) {
                baton_token_scan_start(m2, &s, route, S(1));
                baton_token_scan(&s, "data: 1\n\n", 9, S(2));
            }
        }
        assert_int_equal((int)sample(reg1, n), 3);
        assert_int_equal((int)sample(reg2, n), 2);
        baton_token_metrics_destroy(m1);
        baton_token_metrics_destroy(m2);
        baton_metrics_destroy(reg1);
        baton_metrics_destroy(reg2);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(events_split_across_reads),
        cmocka_unit_test(events_in_one_read_share_its_gap),
        cmocka_unit_test(unarmed_scan_is_a_no_op),
        cmocka_unit_test(events_counted_per_read_at_every_split),
        cmocka_unit_test(observe_half_records_only_events),
        cmocka_unit_test(route_cache_keeps_sets_apart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
