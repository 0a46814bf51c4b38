/* test_metrics.c — the Prometheus registry: exact text, escaping, histograms, concurrency. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/buf.h"
#include "common/metrics.h"

static char *render(baton_metrics_t *reg)
{
    baton_buf_t b = BATON_BUF_INIT;
    assert_int_equal(baton_metrics_render(reg, &b), 0);
    char *s = baton_buf_steal(&b, NULL);
    assert_non_null(s);
    return s;
}

static void test_exact_text(void **state)
{
    baton_metrics_t *reg = baton_metrics_create();
    assert_non_null(reg);
    const char *rs[] = {"route", "status"};
    baton_metric_family_t *req = baton_metrics_counter(reg, "t_requests_total", "Requests.", 2, rs);
    baton_metric_family_t *up = baton_metrics_gauge(reg, "t_up", "Up.", 0, NULL);
    const char *rl[] = {"route"};
    const double bk[] = {0.1, 1, 2.5};
    baton_metric_family_t *dur =
        baton_metrics_histogram(reg, "t_duration_seconds", "Duration.", 1, rl, bk, 3);
    assert_non_null(req);
    assert_non_null(up);
    assert_non_null(dur);

    const char *v1[] = {"/generate", "200"};
    const char *v2[] = {"/v1/models", "404"};
    baton_counter_inc_labels(req, v1);
    baton_counter_inc_labels(req, v1);
    baton_counter_add(baton_metric_child(req, v2), 3);
    baton_gauge_set(baton_metric_child(up, NULL), 1);
    const char *d1[] = {"/generate"};
    baton_metric_child_t *h = baton_metric_child(dur, d1);
    baton_histogram_observe(h, 0.05);
    baton_histogram_observe(h, 0.1); /* le is inclusive */
    baton_histogram_observe(h, 2);
    baton_histogram_observe(h, 100);

    char *s = render(reg);
    const char *want = "# HELP t_requests_total Requests.\n"
                       "# TYPE t_requests_total counter\n"
                       "t_requests_total{route=\"/generate\",status=\"200\"} 2\n"
                       "t_requests_total{route=\"/v1/models\",status=\"404\"} 3\n"
                       "# HELP t_up Up.\n"
                       "# TYPE t_up gauge\n"
                       "t_up 1\n"
                       "# HELP t_duration_seconds Duration.\n"
                       "# TYPE t_duration_seconds histogram\n"
                       "t_duration_seconds_bucket{route=\"/generate\",le=\"0.1\"} 2\n"
                       "t_duration_seconds_bucket{route=\"/generate\",le=\"1\"} 2\n"
                       "t_duration_seconds_bucket{route=\"/generate\",le=\"2.5\"} 3\n"
                       "t_duration_seconds_bucket{route=\"/generate\",le=\"+Inf\"} 4\n"
                       "t_duration_seconds_sum{route=\"/generate\"} 102.15\n"
                       "t_duration_seconds_count{route=\"/generate\"} 4\n";
    assert_string_equal(s, want);
    free(s);
    baton_metrics_destroy(reg);
}

static void test_unlabelled_histogram_and_values(void **state)
{
    baton_metrics_t *reg = baton_metrics_create();
    const double bk[] = {1, INFINITY}; /* a trailing +Inf is the implicit one */
    baton_metric_family_t *h = baton_metrics_histogram(reg, "t_h", "H.", 0, NULL, bk, 2);
    baton_metric_family_t *g = baton_metrics_gauge(reg, "t_g", "G.", 1, (const char *[]){"k"});
    assert_non_null(h);
    assert_non_null(g);
    baton_gauge_set(baton_metric_child(g, (const char *[]){"nan"}), NAN);
    baton_gauge_set(baton_metric_child(g, (const char *[]){"inf"}), INFINITY);
    baton_gauge_set(baton_metric_child(g, (const char *[]){"ninf"}), -INFINITY);
    baton_gauge_set(baton_metric_child(g, (const char *[]){"big"}), 123456789012.0);
    baton_gauge_set(baton_metric_child(g, (const char *[]){"neg"}), -2.5);
    baton_gauge_add(baton_metric_child(g, (const char *[]){"neg"}), 0.25);
    baton_gauge_set(baton_metric_child(g, (const char *[]){"tiny"}), 1e-7);
    baton_gauge_set(baton_metric_child(g, (const char *[]){"zero"}), -0.0);
    char *s = render(reg);
    const char *want = "# HELP t_h H.\n"
                       "# TYPE t_h histogram\n"
                       "t_h_bucket{le=\"1\"} 0\n"
                       "t_h_bucket{le=\"+Inf\"} 0\n"
                       "t_h_sum 0\n"
                       "t_h_count 0\n"
                       "# HELP t_g G.\n"
                       "# TYPE t_g gauge\n"
                       "t_g{k=\"nan\"} NaN\n"
                       "t_g{k=\"inf\"} +Inf\n"
                       "t_g{k=\"ninf\"} -Inf\n"
                       "t_g{k=\"big\"} 123456789012\n"
                       "t_g{k=\"neg\"} -2.25\n"
                       "t_g{k=\"tiny\"} 1e-07\n"
                       "t_g{k=\"zero\"} 0\n";
    assert_string_equal(s, want);
    free(s);
    baton_metrics_destroy(reg);
}

static void test_escaping(void **state)
{
    baton_metrics_t *reg = baton_metrics_create();
    baton_metric_family_t *c = baton_metrics_counter(
        reg, "t_esc_total", "Help with \\ and\nnewline \"q\".", 1, (const char *[]){"v"});
    assert_non_null(c);
    baton_counter_inc_labels(c, (const char *[]){"a\\b\"c\nd"});
    char *s = render(reg);
    const char *want = "# HELP t_esc_total Help with \\\\ and\\nnewline \"q\".\n"
                       "# TYPE t_esc_total counter\n"
                       "t_esc_total{v=\"a\\\\b\\\"c\\nd\"} 1\n";
    assert_string_equal(s, want);
    free(s);
    baton_metrics_destroy(reg);
}

static void test_bad_registrations(void **state)
{
    baton_metrics_t *reg = baton_metrics_create();
    assert_non_null(baton_metrics_counter(reg, "ok_total", "x", 0, NULL));
    assert_null(baton_metrics_counter(reg, "ok_total", "dup", 0, NULL));
    assert_null(baton_metrics_gauge(reg, "ok_total", "dup other type", 0, NULL));
    assert_null(baton_metrics_counter(reg, "9bad", "x", 0, NULL));
    assert_null(baton_metrics_counter(reg, "bad-name", "x", 0, NULL));
    assert_null(baton_metrics_counter(reg, "", "x", 0, NULL));
    assert_null(baton_metrics_counter(reg, "l1", "x", 1, (const char *[]){"__x"}));
    assert_null(baton_metrics_counter(reg, "l2", "x", 1, (const char *[]){"a:b"}));
    assert_null(baton_metrics_counter(reg, "l3", "x", 2, (const char *[]){"a", "a"}));
    assert_null(baton_metrics_counter(reg, "l4", "x", 1, NULL));
    assert_null(baton_metrics_histogram(reg, "h1", "x", 1, (const char *[]){"le"},
                                        baton_latency_buckets, baton_latency_buckets_n));
    assert_null(baton_metrics_histogram(reg, "h2", "x", 0, NULL, (const double[]){2, 1}, 2));
    assert_null(baton_metrics_histogram(reg, "h3", "x", 0, NULL, (const double[]){1, 1}, 2));
    assert_null(baton_metrics_histogram(reg, "h4", "x", 0, NULL, (const double[]){NAN}, 1));
    assert_non_null(baton_metrics_gauge(reg, "a:b_c", "colons are fine", 0, NULL));

    baton_metric_family_t *c = baton_metrics_counter(reg, "c_total", "x", 1, (const char *[]){"a"});
    assert_null(baton_metric_child(c, NULL));
    assert_null(baton_metric_child(c, (const char *[]){NULL}));
    baton_metric_child_t *ch = baton_metric_child(c, (const char *[]){"x"});
    baton_counter_add(ch, -5); /* ignored */
    baton_counter_add(ch, NAN);
    assert_true(baton_metric_value(ch) == 0.0);
    baton_counter_add(ch, 1.5);
    assert_true(baton_metric_value(ch) == 1.5);
    /* NULL children are no-ops, not crashes */
    baton_counter_add(NULL, 1);
    baton_gauge_set(NULL, 1);
    baton_histogram_observe(NULL, 1);
    baton_metrics_destroy(reg);
}

static void test_child_remove(void **state)
{
    baton_metrics_t *reg = baton_metrics_create();
    baton_metric_family_t *g = baton_metrics_gauge(reg, "t_w", "W.", 1, (const char *[]){"worker"});
    baton_metric_child_t *a = baton_metric_child(g, (const char *[]){"a"});
    baton_metric_child_t *b = baton_metric_child(g, (const char *[]){"b"});
    baton_gauge_set(a, 1);
    baton_gauge_set(b, 2);
    assert_ptr_equal(baton_metric_child(g, (const char *[]){"a"}), a);
    baton_metric_child_remove(g, (const char *[]){"a"});
    baton_gauge_set(a, 5); /* stale pointer stays safe */
    char *s = render(reg);
    assert_null(strstr(s, "worker=\"a\""));
    assert_non_null(strstr(s, "t_w{worker=\"b\"} 2\n"));
    free(s);
    assert_ptr_equal(baton_metric_child(g, (const char *[]){"a"}), a); /* comes back */
    s = render(reg);
    assert_non_null(strstr(s, "t_w{worker=\"a\"} 5\n"));
    free(s);
    baton_metrics_destroy(reg);
}

static void test_many_children(void **state)
{
    baton_metrics_t *reg = baton_metrics_create();
    baton_metric_family_t *c =
        baton_metrics_counter(reg, "m_total", "x", 2, (const char *[]){"a", "b"});
    char a[16], b[16];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 500; i++) {
            snprintf(a, sizeof(a), "%d", i);
            snprintf(b, sizeof(b), "%d", i % 7);
            baton_counter_add(baton_metric_child(c, (const char *[]){a, b}), i);
        }
    }
    /* ("1","23") and ("12","3") are different series */
    baton_counter_inc_labels(c, (const char *[]){"1", "23"});
    baton_counter_inc_labels(c, (const char *[]){"12", "3"});
    for (int i = 0; i < 500; i++) {
        snprintf(a, sizeof(a), "%d", i);
        snprintf(b, sizeof(b), "%d", i % 7);
        assert_true(baton_metric_value(baton_metric_child(c, (const char *[]){a, b})) == 3.0 * i);
    }
    assert_true(baton_metric_value(baton_metric_child(c, (const char *[]){"1", "23"})) == 1);
    assert_true(baton_metric_value(baton_metric_child(c, (const char *[]){"12", "3"})) == 1);
    baton_metrics_destroy(reg);
}

/* ---- concurrency ---- */

#define THREADS 4
#define ITERS   20000

typedef struct {
    baton_metric_family_t *counter;
    baton_metric_family_t *hist;
    baton_metric_family_t *gauge;
    baton_metrics_t *reg;
    int idx;
} worker_arg_t;

static void *hammer(void *p)
{
    worker_arg_t *a = p;
    char label[8];
    for (int i = 0; i < ITERS; i++) {
        snprintf(label, sizeof(label), "%d", i % 5);
        /* a fresh lookup every time, so child creation races too */
        baton_counter_add(baton_metric_child(a->counter, (const char *[]){label}), 1);
        baton_histogram_observe(baton_metric_child(a->hist, NULL), (i % 4) * 0.5);
        baton_gauge_add(baton_metric_child(a->gauge, NULL), (i & 1) ? -1 : 1);
        if (a->idx == 0 && i % 2000 == 0) {
            baton_buf_t b = BATON_BUF_INIT;
            assert_int_equal(baton_metrics_render(a->reg, &b), 0);
            baton_buf_free(&b);
        }
    }
    return NULL;
}

static double sample_value(const char *text, const char *series)
{
    const char *p = strstr(text, series);
    assert_non_null(p);
    return strtod(p + strlen(series), NULL);
}

static void test_concurrent_updates(void **state)
{
    baton_metrics_t *reg = baton_metrics_create();
    worker_arg_t args[THREADS];
    baton_metric_family_t *c =
        baton_metrics_counter(reg, "cc_total", "x", 1, (const char *[]){"k"});
    const double bk[] = {0.5, 1};
    baton_metric_family_t *h = baton_metrics_histogram(reg, "ch", "x", 0, NULL, bk, 2);
    baton_metric_family_t *g = baton_metrics_gauge(reg, "cg", "x", 0, NULL);
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (worker_arg_t){c, h, g, reg, i};
        assert_int_equal(pthread_create(&th[i], NULL, hammer, &args[i]), 0);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    char *s = render(reg);
    for (int k = 0; k < 5; k++) {
        char series[64];
        snprintf(series, sizeof(series), "cc_total{k=\"%d\"} ", k);
        assert_true(sample_value(s, series) == THREADS * ITERS / 5);
    }
    /* values 0, 0.5, 1, 1.5 in equal shares */
    double per = THREADS * ITERS / 4;
    assert_true(sample_value(s, "ch_bucket{le=\"0.5\"} ") == 2 * per);
    assert_true(sample_value(s, "ch_bucket{le=\"1\"} ") == 3 * per);
    assert_true(sample_value(s, "ch_bucket{le=\"+Inf\"} ") == 4 * per);
    assert_true(sample_value(s, "ch_count ") == 4 * per);
    assert_true(sample_value(s, "ch_sum ") == per * 3.0);
    assert_true(sample_value(s, "cg ") == 0);
    free(s);
    baton_metrics_destroy(reg);
}

/* Every line is a comment or `name{labels} value` with a parseable value (a strict reading of
 * format 0.0.4 for what this registry emits). */
static void test_format_strict(void **state)
{
    baton_metrics_t *reg = baton_metrics_create();
    baton_metric_family_t *hst =
        baton_metrics_histogram(reg, "f_seconds", "F.", 1, (const char *[]){"r"},
                                baton_latency_buckets, baton_latency_buckets_n);
    for (int i = 0; i < 100; i++)
        baton_histogram_observe(baton_metric_child(hst, (const char *[]){"x y"}), i * 0.37);
    char *s = render(reg);
    double last = -1;
    int buckets = 0;
    for (char *line = strtok(s, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        if (line[0] == '#') {
            assert_true(strncmp(line, "# HELP f_seconds ", 17) == 0 ||
                        strcmp(line, "# TYPE f_seconds histogram") == 0);
            continue;
        }
        char *sp = strrchr(line, ' ');
        assert_non_null(sp);
        char *end;
        double v = strtod(sp + 1, &end);
        assert_true(*end == '\0');
        assert_null(strchr(sp + 1, 'e')); /* integral counts never in exponent form */
        if (strncmp(line, "f_seconds_bucket{", 17) == 0) {
            assert_true(v >= last); /* cumulative */
            last = v;
            buckets++;
        }
    }
    assert_int_equal(buckets, (int)baton_latency_buckets_n + 1);
    assert_true(last == 100);
    free(s);
    baton_metrics_destroy(reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_text),
        cmocka_unit_test(test_unlabelled_histogram_and_values),
        cmocka_unit_test(test_escaping),
        cmocka_unit_test(test_bad_registrations),
        cmocka_unit_test(test_child_remove),
        cmocka_unit_test(test_many_children),
        cmocka_unit_test(test_concurrent_updates),
        cmocka_unit_test(test_format_strict),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
