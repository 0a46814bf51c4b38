/* test_router_metrics.c — the router's baton_* families, worker sync, and a strict format check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/metrics.h"
#include "router/control/registry.h"
#include "router/dataplane/router_metrics.h"

static char *render(baton_router_metrics_t *m, baton_registry_t *reg)
{
    baton_buf_t b = BATON_BUF_INIT;
    assert_int_equal(baton_router_metrics_render(m, reg, &b), 0);
    return baton_buf_steal(&b, NULL);
}

static int has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; (p = strstr(p, line)) != NULL; p++) {
        if ((p == text || p[-1] == '\n') && p[n] == '\n')
            return 1;
    }
    return 0;
}

/*
 * What `promtool check metrics` insists on, checked strictly: every sample belongs to a family
 * announced by # HELP and # TYPE (in that order, once), counters end in _total, histogram
 * samples are _bucket (with le) / _sum / _count, label values are quoted, values parse.
 */
static void check_exposition(const char *text)
{
    char fam[128] = "", type[16] = "";
    char *copy = strdup(text);
    assert_non_null(copy);
    int n_families = 0;
    for (char *line = strtok(copy, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        if (strncmp(line, "# HELP ", 7) == 0) {
            char name[128];
            assert_int_equal(sscanf(line + 7, "%127s", name), 1);
            assert_string_not_equal(name, fam); /* each family once */
            snprintf(fam, sizeof(fam), "%s", name);
            type[0] = '\0';
            assert_true(strlen(line) > 8 + strlen(name)); /* non-empty help */
            assert_true(strncmp(name, "baton_", 6) == 0);
            n_families++;
            continue;
        }
        if (strncmp(line, "# TYPE ", 7) == 0) {
            char name[128];
            assert_int_equal(sscanf(line + 7, "%127s %15s", name, type), 2);
            assert_string_equal(name, fam);
            assert_true(strcmp(type, "counter") == 0 || strcmp(type, "gauge") == 0 ||
                        strcmp(type, "histogram") == 0);
            if (strcmp(type, "counter") == 0) {
                size_t l = strlen(name);
                assert_true(l > 6 && strcmp(name + l - 6, "_total") == 0);
            }
            continue;
        }
        assert_true(line[0] != '#');
        assert_true(type[0] != '\0');
        size_t nl = strcspn(line, "{ ");
        char sname[128];
        assert_true(nl < sizeof(sname));
        memcpy(sname, line, nl);
        sname[nl] = '\0';
        if (strcmp(type, "histogram") == 0) {
            char want[160];
            int ok = 0;
            const char *sfx[] = {"_bucket", "_sum", "_count"};
            for (int i = 0; i < 3; i++) {
                snprintf(want, sizeof(want), "%s%s", fam, sfx[i]);
                ok |= strcmp(sname, want) == 0;
            }
            assert_true(ok);
            if (strstr(sname, "_bucket") != NULL)
                assert_non_null(strstr(line, "le=\""));
        } else {
            assert_string_equal(sname, fam);
        }
        const char *p = line + nl;
        if (*p == '{') {
            /* name="value" pairs, values with only escaped quotes */
            p++;
            while (*p != '}') {
                while ((*p >= 'a' && *p <= 'z') || *p == '_')
                    p++;
                assert_true(p[0] == '=' && p[1] == '"');
                p += 2;
                while (*p != '"') {
                    assert_true(*p != '\0' && *p != '\n');
                    if (*p == '\\') {
                        assert_true(p[1] == '\\' || p[1] == '"' || p[1] == 'n');
                        p++;
                    }
                    p++;
                }
                p++;
                if (*p == ',')
                    p++;
                else
                    assert_true(*p == '}');
            }
            p++;
        }
        assert_true(*p == ' ');
        char *end;
        strtod(p + 1, &end);
        assert_true(*end == '\0' && end != p + 1);
    }
    assert_int_equal(n_families, 7);
    free(copy);
}

static void test_families_and_updates(void **state)
{
    baton_metrics_t *mr = baton_metrics_create();
    baton_router_metrics_t *m;
    assert_int_equal(baton_router_metrics_create(&m, mr), 0);
    baton_router_metrics_t *m2;
    assert_int_equal(baton_router_metrics_create(&m2, mr), BATON_EEXIST);

    baton_router_metrics_request_done(m, "/v1/chat/completions", 200, 0.2, 0.01);
    baton_router_metrics_request_done(m, "/v1/chat/completions", 200, 0.3, 0.02);
    baton_router_metrics_request_done(m, "/v1/chat/completions", 502, 0.004, -1);
    baton_router_metrics_request_done(m, "/generate", 200, 700, 650); /* beyond the last bucket */
    baton_router_metrics_upstream_error(m, BATON_ROLE_PREFILL, "connect");
    baton_router_metrics_upstream_error(m, BATON_ROLE_PREFILL, "connect");
    baton_router_metrics_upstream_error(m, BATON_ROLE_DECODE,
                                        baton_router_metrics_error_kind(BATON_ETIMEOUT_IDLE));
    baton_router_metrics_model_done(m, "llama", 200);
    baton_router_metrics_model_done(m, "llama", 200);
    baton_router_metrics_model_done(m, NULL, 404);

    char *s = render(m, NULL);
    check_exposition(s);
    assert_true(
        has_line(s, "baton_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2"));
    assert_true(
        has_line(s, "baton_requests_total{route=\"/v1/chat/completions\",status=\"502\"} 1"));
    assert_true(
        has_line(s, "baton_request_duration_seconds_count{route=\"/v1/chat/completions\"} 3"));
    /* the 502 sent no byte: not in the TTFB histogram */
    assert_true(
        has_line(s, "baton_time_to_first_byte_seconds_count{route=\"/v1/chat/completions\"} 2"));
    assert_true(has_line(
        s,
        "baton_time_to_first_byte_seconds_bucket{route=\"/v1/chat/completions\",le=\"0.01\"} 1"));
    assert_true(
        has_line(s, "baton_request_duration_seconds_bucket{route=\"/generate\",le=\"600\"} 0"));
    assert_true(
        has_line(s, "baton_request_duration_seconds_bucket{route=\"/generate\",le=\"+Inf\"} 1"));
    assert_true(has_line(s, "baton_upstream_errors_total{role=\"prefill\",kind=\"connect\"} 2"));
    assert_true(has_line(s, "baton_model_requests_total{model=\"llama\",status=\"200\"} 2"));
    assert_true(has_line(s, "baton_model_requests_total{model=\"other\",status=\"404\"} 1"));
    free(s);

    /* A worker chooses the statuses passed through: unknown ones share a bucket, so the label
     * set stays bounded whatever it answers. */
    baton_router_metrics_request_done(m, "/generate", 299, 0.1, -1);
    baton_router_metrics_request_done(m, "/generate", 298, 0.1, -1);
    baton_router_metrics_request_done(m, "/generate", 599, 0.1, -1);
    baton_router_metrics_request_done(m, "/generate", 999, 0.1, -1);
    baton_router_metrics_request_done(m, "/generate", 42, 0.1, -1);
    baton_router_metrics_request_done(m, "/generate", 499, 0.1, -1);
    s = render(m, NULL);
    assert_true(has_line(s, "baton_requests_total{route=\"/generate\",status=\"2xx\"} 2"));
    assert_true(has_line(s, "baton_requests_total{route=\"/generate\",status=\"5xx\"} 1"));
    assert_true(has_line(s, "baton_requests_total{route=\"/generate\",status=\"other\"} 2"));
    assert_true(has_line(s, "baton_requests_total{route=\"/generate\",status=\"499\"} 1"));
    assert_null(strstr(s, "status=\"299\""));
    assert_true(has_line(s, "baton_upstream_errors_total{role=\"decode\",kind=\"timeout\"} 1"));
    assert_true(has_line(s, "baton_workers{role=\"prefill\"} 0"));
    assert_true(has_line(s, "baton_workers{role=\"regular\"} 0"));
    free(s);
    baton_router_metrics_destroy(m);
    baton_metrics_destroy(mr);
}

static void test_worker_sync(void **state)
{
    baton_metrics_t *mr = baton_metrics_create();
    baton_router_metrics_t *m;
    assert_int_equal(baton_router_metrics_create(&m, mr), 0);
    baton_registry_t *reg;
    assert_int_equal(baton_registry_create(&reg), 0);
    baton_worker_spec_t spec;
    baton_worker_spec_init(&spec);
    baton_worker_t *p, *d;
    spec.url = "http://127.0.0.1:30001";
    spec.role = BATON_ROLE_PREFILL;
    assert_int_equal(baton_registry_add(reg, &spec, &p, NULL, 0), 0);
    spec.url = "http://127.0.0.1:30002";
    spec.role = BATON_ROLE_DECODE;
    assert_int_equal(baton_registry_add(reg, &spec, &d, NULL, 0), 0);
    for (int i = 0; i < 3; i++)
        baton_worker_in_flight_inc(d);

    char line[256];
    char *s = render(m, reg);
    check_exposition(s);
    assert_true(has_line(s, "baton_workers{role=\"prefill\"} 1"));
    assert_true(has_line(s, "baton_workers{role=\"decode\"} 1"));
    snprintf(line, sizeof(line), "baton_worker_in_flight_requests{worker=\"%s\",role=\"decode\"} 3",
             d->id);
    assert_true(has_line(s, line));
    snprintf(line, sizeof(line),
             "baton_worker_in_flight_requests{worker=\"%s\",role=\"prefill\"} 0", p->id);
    assert_true(has_line(s, line));
    free(s);

    /* a removed worker's series disappears; the counts follow */
    assert_int_equal(baton_registry_remove(reg, d->id), 0);
    s = render(m, reg);
    check_exposition(s);
    assert_null(strstr(s, d->id));
    assert_true(has_line(s, "baton_workers{role=\"decode\"} 0"));
    free(s);

    for (int i = 0; i < 3; i++)
        baton_worker_in_flight_dec(d);
    baton_worker_unref(d);
    baton_worker_unref(p);
    baton_registry_destroy(reg);
    baton_router_metrics_destroy(m);
    baton_metrics_destroy(mr);
}

static void test_error_kinds(void **state)
{
    assert_string_equal(baton_router_metrics_error_kind(BATON_ECONNECT), "connect");
    assert_string_equal(baton_router_metrics_error_kind(BATON_ETIMEOUT_CONNECT), "timeout");
    assert_string_equal(baton_router_metrics_error_kind(BATON_ETIMEOUT_FIRST_BYTE), "timeout");
    assert_string_equal(baton_router_metrics_error_kind(BATON_ETIMEOUT_TOTAL), "timeout");
    assert_string_equal(baton_router_metrics_error_kind(BATON_EEOF), "closed");
    assert_string_equal(baton_router_metrics_error_kind(BATON_EUPSTREAM), "protocol");
    assert_string_equal(baton_router_metrics_error_kind(BATON_ECANCELED), "canceled");
    assert_string_equal(baton_router_metrics_error_kind(-12345), "other");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_families_and_updates),
        cmocka_unit_test(test_worker_sync),
        cmocka_unit_test(test_error_kinds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
