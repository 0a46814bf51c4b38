/* report.c — baton-bench output: the result table, the JSON result file, --compare, --plot. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "bench.h"

void bb_results_summarize(bb_results_t *res)
{
    bb_summarize(res->ttft_ms.v, res->ttft_ms.n, &res->ttft);
    bb_summarize(res->tpot_ms.v, res->tpot_ms.n, &res->tpot);
    bb_summarize(res->itl_ms.v, res->itl_ms.n, &res->itl);
    bb_summarize(res->e2e_ms.v, res->e2e_ms.n, &res->e2e);
}

static double per_s(double x, double dur)
{
    return dur > 0 ? x / dur : 0;
}

static void load_desc(const bb_config_t *cfg, char *out, size_t n)
{
    if (cfg->request_rate > 0) {
        int k = snprintf(out, n, "open loop, %s arrivals at %.6g req/s",
                         cfg->arrival == BB_ARRIVAL_FIXED ? "fixed-rate" : "Poisson",
                         cfg->request_rate);
        if (cfg->max_concurrency && k > 0 && (size_t)k < n)
            snprintf(out + k, n - (size_t)k, ", at most %u in flight", cfg->max_concurrency);
    } else {
        snprintf(out, n, "closed loop, concurrency %u", cfg->concurrency);
    }
}

static void row(const char *name, const bb_summary_t *s)
{
    if (s->n == 0) {
        printf("%-6s %10s %10s %10s %10s %10s %10s\n", name, "-", "-", "-", "-", "-", "-");
        return;
    }
    printf("%-6s %10.3f %10.3f %10.3f %10.3f %10.3f %10zu\n", name, s->mean, s->p50, s->p90, s->p99,
           s->max, s->n);
}

void bb_report_print(const bb_config_t *cfg, const bb_results_t *res)
{
    char load[160];
    load_desc(cfg, load, sizeof(load));
    double d = res->duration_s;
    printf("================ baton-bench result ================\n");
    printf("%-34s %s\n", "Target:", cfg->base_url);
    printf("%-34s %s, %s\n", "Endpoint:", bb_endpoint_name(cfg->endpoint),
           cfg->stream ? "streaming" : "not streaming");
    printf("%-34s %s\n", "Load:", load);
    printf("%-34s %llu\n", "Successful requests:", (unsigned long long)res->completed);
    printf("%-34s %llu\n", "Failed requests:", (unsigned long long)res->failed);
    for (int k = 1; k < BB_ERR_COUNT; k++) {
        if (!res->errors[k])
            continue;
        printf("  %-32s %llu  (first: %s)\n", bb_err_kind_name(k),
               (unsigned long long)res->errors[k], res->first_error[k]);
    }
    if (res->warmup_requests)
        printf("%-34s %llu\n",
               "Warm-up requests (not counted):", (unsigned long long)res->warmup_requests);
    printf("%-34s %.3f\n", "Duration (s):", d);
    printf("%-34s %llu\n", "Total input tokens:", (unsigned long long)res->total_input_tokens);
    printf("%-34s %llu\n", "Total output tokens:", (unsigned long long)res->total_output_tokens);
    if (res->usage_prompt_tokens)
        printf("%-34s %llu (%.1f%% of %llu prompt tokens)\n",
               "Server-reported cached tokens:", (unsigned long long)res->cached_tokens,
               100.0 * (double)res->cached_tokens / (double)res->usage_prompt_tokens,
               (unsigned long long)res->usage_prompt_tokens);
    printf("%-34s %.2f\n", "Request throughput (req/s):", per_s((double)res->completed, d));
    printf("%-34s %.2f\n",
           "Input token throughput (tok/s):", per_s((double)res->total_input_tokens, d));
    printf("%-34s %.2f\n",
           "Output token throughput (tok/s):", per_s((double)res->total_output_tokens, d));
    if (cfg->slo_ttft_ms || cfg->slo_tpot_ms || cfg->slo_e2e_ms)
        printf("%-34s %.2f  (%llu within SLO)\n", "Goodput (req/s):", per_s((double)res->good, d),
               (unsigned long long)res->good);
    printf("%-34s %.1f\n", "Bench CPU (% of one core):", 100.0 * per_s(res->bench_cpu_s, d));
    if (cfg->request_rate > 0 && !cfg->max_concurrency)
        printf("%-34s %.3f\n", "Max arrival lag (ms):", res->max_lag_ms);
    printf("%-34s %llu\n", "Connections opened:", (unsigned long long)res->connections_opened);
    printf("----------------------------------------------------------------------\n");
    printf("%-6s %10s %10s %10s %10s %10s %10s\n", "(ms)", "mean", "p50", "p90", "p99", "max",
           "samples");
    row("TTFT", &res->ttft);
    row("TPOT", &res->tpot);
    row("ITL", &res->itl);
    row("E2E", &res->e2e);
    printf("======================================================================\n");
    fflush(stdout);
}

static json_t *summary_json(const bb_summary_t *s)
{
    if (s->n == 0)
        return json_pack("{s:I}", "n", (json_int_t)0);
    return json_pack("{s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:f}", "n", (json_int_t)s->n, "mean", s->mean,
                     "std", s->std, "min", s->min, "p50", s->p50, "p90", s->p90, "p99", s->p99,
                     "max", s->max);
}

int bb_report_json(const bb_config_t *cfg, const bb_results_t *res, const char *path)
{
    double d = res->duration_s;
    const char *load = cfg->request_rate <= 0             ? "closed"
                       : cfg->arrival == BB_ARRIVAL_FIXED ? "fixed"
                                                          : "poisson";
    json_t *conf = json_pack(
        "{s:s,s:s,s:b,s:s,s:I,s:f,s:I,s:I,s:f,s:f,s:[I,I],s:[I,I],s:I,s:I,s:f,s:f,s:f,s:f}",
        "base_url", cfg->base_url, "endpoint", bb_endpoint_name(cfg->endpoint), "stream",
        cfg->stream, "load", load, "concurrency", (json_int_t)cfg->concurrency, "request_rate",
        cfg->request_rate, "max_concurrency", (json_int_t)cfg->max_concurrency, "num_requests",
        (json_int_t)cfg->num_requests, "duration_s", cfg->duration_s, "warmup_s", cfg->warmup_s,
        "input_len", (json_int_t)cfg->in_lo, (json_int_t)cfg->in_hi, "output_len",
        (json_int_t)cfg->out_lo, (json_int_t)cfg->out_hi, "multi_turn", (json_int_t)cfg->multi_turn,
        "seed", (json_int_t)cfg->seed, "slo_ttft_ms", cfg->slo_ttft_ms, "slo_tpot_ms",
        cfg->slo_tpot_ms, "slo_e2e_ms", cfg->slo_e2e_ms, "timeout_s", cfg->timeout_s);
    if (conf) { /* the workload knobs of a cache-routing run */
        json_object_set_new(conf, "shared_prefix_words",
                            json_integer((json_int_t)cfg->shared_prefix_words));
        json_object_set_new(conf, "shared_prefix_groups",
                            json_integer((json_int_t)cfg->shared_prefix_groups));
        json_object_set_new(conf, "think_time_s", json_real(cfg->think_s));
    }
    json_t *errors = json_object();
    json_t *statuses = json_object();
    json_t *first = json_object();
    json_t *root = NULL;
    int rc = -1;
    if (!conf || !errors || !statuses || !first)
        goto out;
    if (cfg->dataset)
        json_object_set_new(conf, "dataset_items", json_integer((json_int_t)cfg->dataset->n));
    for (int k = 1; k < BB_ERR_COUNT; k++) {
        if (!res->errors[k])
            continue;
        json_object_set_new(errors, bb_err_kind_name(k), json_integer((json_int_t)res->errors[k]));
        json_object_set_new(first, bb_err_kind_name(k), json_string(res->first_error[k]));
    }
    for (int s = 0; s < 600; s++) {
        if (!res->http_status[s])
            continue;
        char key[8];
        snprintf(key, sizeof(key), "%d", s);
        json_object_set_new(statuses, key, json_integer((json_int_t)res->http_status[s]));
    }
    root = json_pack(
        "{s:i,s:O,s:I,s:I,s:I,s:O,s:O,s:O,s:f,s:I,s:I,s:f,s:f,s:f,s:f,s:I,s:o,s:o,"
        "s:o,s:o,s:f,s:I,s:f,s:f,s:b}",
        "baton_bench_version", 1, "config", conf, "completed", (json_int_t)res->completed, "failed",
        (json_int_t)res->failed, "warmup_requests", (json_int_t)res->warmup_requests, "errors",
        errors, "http_status", statuses, "first_error", first, "duration_s", d,
        "total_input_tokens", (json_int_t)res->total_input_tokens, "total_output_tokens",
        (json_int_t)res->total_output_tokens, "request_throughput",
        per_s((double)res->completed, d), "input_throughput",
        per_s((double)res->total_input_tokens, d), "output_throughput",
        per_s((double)res->total_output_tokens, d), "goodput", per_s((double)res->good, d),
        "good_requests", (json_int_t)res->good, "ttft_ms", summary_json(&res->ttft), "tpot_ms",
        summary_json(&res->tpot), "itl_ms", summary_json(&res->itl), "e2e_ms",
        summary_json(&res->e2e), "max_lag_ms", res->max_lag_ms, "connections_opened",
        (json_int_t)res->connections_opened, "bench_cpu_s", res->bench_cpu_s, "bench_cpu_util",
        per_s(res->bench_cpu_s, d), "interrupted", res->interrupted);
    if (root) /* what the server said it found in its prefix cache */
        json_object_set_new(
            root, "cache",
            json_pack("{s:I,s:I,s:f}", "usage_prompt_tokens", (json_int_t)res->usage_prompt_tokens,
                      "cached_tokens", (json_int_t)res->cached_tokens, "hit_ratio",
                      res->usage_prompt_tokens
                          ? (double)res->cached_tokens / (double)res->usage_prompt_tokens
                          : 0.0));
    if (!root)
        goto out;
    if (json_dump_file(root, path, JSON_INDENT(2) | JSON_REAL_PRECISION(10)) != 0) {
        fprintf(stderr, "baton-bench: cannot write %s: %s\n", path, strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (rc && !root)
        fprintf(stderr, "baton-bench: out of memory writing %s\n", path);
    json_decref(root);
    json_decref(conf);
    json_decref(errors);
    json_decref(statuses);
    json_decref(first);
    return rc;
}

/* ---- --compare ---- */

static int get_num(json_t *root, const char *a, const char *b, double *out)
{
    json_t *v = json_object_get(root, a);
    if (b)
        v = json_object_get(v, b);
    if (!json_is_number(v))
        return 0;
    *out = json_number_value(v);
    return 1;
}

int bb_compare(const char *a_path, const char *b_path)
{
    json_error_t e;
    json_t *a = json_load_file(a_path, 0, &e);
    if (!a) {
        fprintf(stderr, "baton-bench: %s: %s\n", a_path, e.text);
        return 1;
    }
    json_t *b = json_load_file(b_path, 0, &e);
    if (!b) {
        fprintf(stderr, "baton-bench: %s: %s\n", b_path, e.text);
        json_decref(a);
        return 1;
    }
    static const char *const scalars[] = {"request_throughput", "input_throughput",
                                          "output_throughput",  "goodput",
                                          "completed",          "failed"};
    static const char *const dists[] = {"ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"};
    static const char *const stats[] = {"mean", "p50", "p90", "p99", "max"};
    printf("A = %s\nB = %s\n", a_path, b_path);
    printf("%-24s %14s %14s %10s\n", "metric", "A", "B", "B/A");
    for (size_t i = 0; i < sizeof(scalars) / sizeof(*scalars); i++) {
        double x, y;
        if (!get_num(a, scalars[i], NULL, &x) || !get_num(b, scalars[i], NULL, &y))
            continue;
        if (x != 0)
            printf("%-24s %14.3f %14.3f %10.3f\n", scalars[i], x, y, y / x);
        else
            printf("%-24s %14.3f %14.3f %10s\n", scalars[i], x, y, "-");
    }
    for (size_t i = 0; i < sizeof(dists) / sizeof(*dists); i++) {
        for (size_t j = 0; j < sizeof(stats) / sizeof(*stats); j++) {
            double x, y;
            if (!get_num(a, dists[i], stats[j], &x) || !get_num(b, dists[i], stats[j], &y))
                continue;
            char name[48];
            snprintf(name, sizeof(name), "%s.%s", dists[i], stats[j]);
            if (x != 0)
                printf("%-24s %14.3f %14.3f %10.3f\n", name, x, y, y / x);
            else
                printf("%-24s %14.3f %14.3f %10s\n", name, x, y, "-");
        }
    }
    json_decref(a);
    json_decref(b);
    return 0;
}

/* ---- --plot ---- */

static int have_program(const char *name)
{
    const char *path = getenv("PATH");
    if (!path)
        path = "/usr/bin:/bin";
    char buf[4096];
    while (*path) {
        const char *colon = strchr(path, ':');
        size_t len = colon ? (size_t)(colon - path) : strlen(path);
        if (len && snprintf(buf, sizeof(buf), "%.*s/%s", (int)len, path, name) < (int)sizeof(buf) &&
            access(buf, X_OK) == 0)
            return 1;
        path += len + (colon ? 1 : 0);
    }
    return 0;
}

/* Writes the sorted samples with their cumulative fraction; 0 when there are none. */
static int write_cdf(const char *dir, const char *name, const bb_vec_t *v)
{
    if (v->n == 0)
        return 0;
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s.dat", dir, name);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    /* At most ~2000 points per curve: enough for a picture, small for gnuplot. */
    size_t step = v->n > 2000 ? v->n / 2000 : 1;
    for (size_t i = 0; i < v->n; i += step)
        fprintf(f, "%.6f %.6f\n", v->v[i] > 1e-3 ? v->v[i] : 1e-3, (double)(i + 1) / (double)v->n);
    fprintf(f, "%.6f 1\n", v->v[v->n - 1] > 1e-3 ? v->v[v->n - 1] : 1e-3);
    fclose(f);
    return 1;
}

int bb_plot(const bb_results_t *res, const char *png_path)
{
    if (!have_program("gnuplot")) {
        printf("plot skipped: gnuplot is not installed (apt-get install gnuplot-nox, or run "
               "scripts/install-bench-deps.sh)\n");
        return 0;
    }
    char dir[] = "/tmp/baton-bench-plot-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "baton-bench: plot: mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    const struct {
        const char *name;
        const bb_vec_t *v;
    } curves[] = {{"TTFT", &res->ttft_ms},
                  {"TPOT", &res->tpot_ms},
                  {"ITL", &res->itl_ms},
                  {"E2E", &res->e2e_ms}};
    char script[4200];
    snprintf(script, sizeof(script), "%s/cdf.gp", dir);
    FILE *f = fopen(script, "w");
    int rc = -1;
    int n_curves = 0;
    if (!f)
        goto cleanup;
    fprintf(f, "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
               "  set terminal pngcairo size 1000,650\n"
               "} else {\n"
               "  set terminal png size 1000,650\n"
               "}\n");
    fprintf(f,
            "set output '%s'\nset logscale x\nset grid\nset key bottom right\n"
            "set format x '%%g'\n"
            "set xlabel 'latency (ms, log scale; values under 1 us drawn at 1 us)'\nset ylabel "
            "'fraction of samples'\n"
            "set yrange [0:1]\nset title 'baton-bench latency CDFs'\n",
            png_path);
    for (size_t i = 0; i < sizeof(curves) / sizeof(*curves); i++) {
        int w = write_cdf(dir, curves[i].name, curves[i].v);
        if (w < 0) {
            fclose(f);
            goto cleanup;
        }
        if (!w)
            continue;
        fprintf(f, "%s '%s/%s.dat' using 1:2 with lines lw 2 title '%s'",
                n_curves ? ", \\\n  " : "plot ", dir, curves[i].name, curves[i].name);
        n_curves++;
    }
    fprintf(f, "\n");
    fclose(f);
    if (!n_curves) {
        printf("plot skipped: no latency samples\n");
        rc = 0;
        goto cleanup;
    }
    char cmd[4400];
    snprintf(cmd, sizeof(cmd), "gnuplot '%s'", script);
    int st = system(cmd);
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "baton-bench: gnuplot failed (status %d)\n", st);
    } else {
        printf("plot written: %s\n", png_path);
        rc = 0;
    }
cleanup:;
    /* Remove the temporary files whatever happened. */
    const char *names[] = {"TTFT.dat", "TPOT.dat", "ITL.dat", "E2E.dat", "cdf.gp"};
    for (size_t i = 0; i < sizeof(names) / sizeof(*names); i++) {
        char p[4200];
        snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
    return rc;
}
