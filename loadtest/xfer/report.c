/* xfer/report.c — baton-xfer-bench's human tables (Markdown) printed from the JSON result. */
#include <stdio.h>
#include <string.h>

#include "xbench.h"

static double num(const json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return v != NULL && json_is_number(v) ? json_number_value(v) : -1;
}

/* v with `decimals` digits, or "-" when missing (negative). */
static void fmt(char *buf, size_t cap, double v, int decimals)
{
    if (v < 0)
        snprintf(buf, cap, "-");
    else
        snprintf(buf, cap, "%.*f", decimals, v);
}

static const json_t *find_case(const json_t *arr, const char *name)
{
    size_t i;
    json_t *c;
    json_array_foreach(arr, i, c)
    {
        const char *n = json_string_value(json_object_get(c, "case"));
        if (n != NULL && strcmp(n, name) == 0)
            return c;
    }
    return NULL;
}

void xb_print_report(const json_t *res)
{
    const json_t *m = json_object_get(res, "machine");
    printf("\n## baton-xfer-bench\n\nmachine: %d CPUs (%s), %.0f GiB RAM, Linux %s; load %.2f at "
           "start\n",
           (int)json_integer_value(json_object_get(m, "nproc")),
           json_string_value(json_object_get(m, "cpu_model")),
           json_real_value(json_object_get(m, "mem_gib")),
           json_string_value(json_object_get(m, "kernel")),
           json_real_value(json_object_get(m, "loadavg_at_start")));
    const json_t *mc = json_object_get(res, "memcpy");
    if (json_array_size(mc) > 0) {
        printf("\n### memcpy baseline (one thread, same pages and pool)\n\n"
               "| case | GB/s (median) | min..max | first touch GB/s |\n"
               "|------|--------------:|---------:|-----------------:|\n");
        size_t i;
        json_t *c;
        json_array_foreach(mc, i, c)
        {
            char a[32], b[32], d[32], e[32];
            fmt(a, sizeof(a), num(c, "gbps"), 2);
            fmt(b, sizeof(b), num(c, "gbps_min"), 2);
            fmt(d, sizeof(d), num(c, "gbps_max"), 2);
            fmt(e, sizeof(e), num(c, "first_touch_gbps"), 2);
            printf("| %s | %s | %s..%s | %s |\n", json_string_value(json_object_get(c, "case")), a,
                   b, d, e);
        }
    }
    const json_t *tps = json_object_get(res, "transports");
    size_t ti;
    json_t *t;
    json_array_foreach(tps, ti, t)
    {
        const char *name = json_string_value(json_object_get(t, "transport"));
        const char *st = json_string_value(json_object_get(t, "status"));
        if (st == NULL || strcmp(st, "unavailable") == 0) {
            printf("\n### %s: not measurable here — %s\n", name,
                   json_string_value(json_object_get(t, "error")));
            continue;
        }
        int is_shm = strcmp(name, "shm") == 0;
        printf("\n### %s%s%s\n\n", name, strcmp(st, "ok") ? " — " : "",
               strcmp(st, "ok") ? json_string_value(json_object_get(t, "error")) : "");
        printf("| case | GB/s (median) | min..max | rooms/s | latency p50 / p99 (us) | "
               "loaded p50 / p99 (us) | CPU %% driver / server | CPU s/GB |%s\n",
               is_shm ? " vs memcpy |" : "");
        printf("|------|------:|------:|------:|------:|------:|------:|------:|%s\n",
               is_shm ? "------:|" : "");
        size_t i;
        json_t *c;
        json_array_foreach(json_object_get(t, "cases"), i, c)
        {
            const char *cn = json_string_value(json_object_get(c, "case"));
            const char *err = json_string_value(json_object_get(c, "error"));
            if (err != NULL) {
                printf("| %s | error: %s | | | | | | |%s\n", cn, err, is_shm ? " |" : "");
                continue;
            }
            char g[32], lo[32], hi[32], rps[32], p50[32], p99[32], lp50[32], lp99[32], cd[32],
                cs[32], cpg[32], ratio[32] = "-";
            fmt(g, sizeof(g), num(c, "gbps"), 2);
            fmt(lo, sizeof(lo), num(c, "gbps_min"), 2);
            fmt(hi, sizeof(hi), num(c, "gbps_max"), 2);
            fmt(rps, sizeof(rps), num(c, "rooms_per_s"), 0);
            json_t *lat = json_object_get(c, "lat_us"), *ll = json_object_get(c, "loaded_lat_us");
            fmt(p50, sizeof(p50), json_is_object(lat) ? num(lat, "p50") : -1, 0);
            fmt(p99, sizeof(p99), json_is_object(lat) ? num(lat, "p99") : -1, 0);
            fmt(lp50, sizeof(lp50), json_is_object(ll) ? num(ll, "p50") : -1, 0);
            fmt(lp99, sizeof(lp99), json_is_object(ll) ? num(ll, "p99") : -1, 0);
            json_t *cpu = json_object_get(c, "cpu_pct");
            fmt(cd, sizeof(cd), num(cpu, "driver"), 0);
            fmt(cs, sizeof(cs), num(cpu, "server"), 0);
            fmt(cpg, sizeof(cpg), num(c, "cpu_s_per_gb"), 3);
            if (is_shm) {
                const json_t *b = find_case(mc, cn);
                if (b != NULL && num(b, "gbps") > 0 && num(c, "gbps") >= 0)
                    snprintf(ratio, sizeof(ratio), "%.0f%%", 100 * num(c, "gbps") / num(b, "gbps"));
            }
            printf("| %s | %s | %s..%s | %s | %s / %s | %s / %s | %s / %s | %s |%s%s%s\n", cn, g,
                   lo, hi, rps, p50, p99, lp50, lp99, cd, cs, cpg, is_shm ? " " : "",
                   is_shm ? ratio : "", is_shm ? " |" : "");
        }
    }
    printf("\nverified: %lld rooms, %.1f MiB; corrupt rooms: %lld\n",
           (long long)json_integer_value(json_object_get(res, "verified_rooms")),
           (double)json_integer_value(json_object_get(res, "verified_bytes")) / 1048576.0,
           (long long)json_integer_value(json_object_get(res, "corrupt_rooms")));
    fflush(stdout);
}
