/* xfer/main.c — baton-xfer-bench: options, the case list, and the run order (memcpy baseline,
 * then every transport), the JSON result and the exit status. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "xbench.h"

/* ---- small helpers shared by the parts ------------------------------------------------- */

uint64_t xb_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double xb_percentile(const double *sorted, size_t n, double p)
{
    if (n == 0)
        return 0;
    size_t rank = (size_t)((p / 100.0) * (double)n + 0.999999);
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    return sorted[rank - 1];
}

double xb_median(double *v, size_t n)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double xb_cpu_self(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

double xb_cpu_pid(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* The command name may hold spaces: fields start after the last ')'. */
    char *p = strrchr(buf, ')');
    if (p == NULL)
        return -1;
    unsigned long ut = 0, st = 0;
    /* state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

uint8_t *xb_source_new(size_t len, uint64_t seed)
{
    uint8_t *p = aligned_alloc(XB_SRC_ALIGN, len);
    if (p == NULL)
        return NULL;
    xfer_fill_source(p, len, seed);
    return p;
}

json_t *xb_machine_json(void)
{
    char model[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f != NULL) {
        char line[512];
        while (fgets(line, sizeof(line), f)) {
            if (strncmp(line, "model name", 10) == 0) {
                char *c = strchr(line, ':');
                if (c != NULL) {
                    c++;
                    while (*c == ' ' || *c == '\t')
                        c++;
                    c[strcspn(c, "\n")] = '\0';
                    snprintf(model, sizeof(model), "%s", c);
                }
                break;
            }
        }
        fclose(f);
    }
    struct utsname u;
    uname(&u);
    double mem_gib = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) / 1073741824.0;
    double load[1] = {0};
    getloadavg(load, 1);
    return json_pack("{s:i, s:s, s:f, s:s, s:f}", "nproc", (int)sysconf(_SC_NPROCESSORS_ONLN),
                     "cpu_model", model, "mem_gib", mem_gib, "kernel", u.release,
                     "loadavg_at_start", load[0]);
}

/* ---- cases ------------------------------------------------------------------------------ */

static void size_name(uint64_t b, char *buf, size_t cap)
{
    if (b >= (1ull << 30) && b % (1ull << 30) == 0)
        snprintf(buf, cap, "%" PRIu64 "GiB", b >> 30);
    else if (b >= (1ull << 20) && b % (1ull << 20) == 0)
        snprintf(buf, cap, "%" PRIu64 "MiB", b >> 20);
    else if (b >= 1024 && b % 1024 == 0)
        snprintf(buf, cap, "%" PRIu64 "KiB", b >> 10);
    else
        snprintf(buf, cap, "%" PRIu64 "B", b);
}

int xb_cases(const xb_opts_t *o, xb_case_t *cases, int cap)
{
    int n = 0;
    for (int i = 0; i < o->n_sizes && n < cap; i++) {
        xb_case_t *c = &cases[n++];
        memset(c, 0, sizeof(*c));
        size_name(o->sizes[i], c->name, sizeof(c->name));
        c->kind = "block";
        c->n_layers = 1;
        c->ppl = 1;
        c->page_len = o->sizes[i];
        c->room_bytes = o->sizes[i];
        uint64_t w = (o->window_bytes + c->room_bytes - 1) / c->room_bytes;
        /* Two rooms at least, so the next offer overlaps the current transfer. */
        c->window = (uint32_t)(w < 2 ? 2 : w > o->max_window ? o->max_window : w);
    }
    const xb_kv_shape_t *k = &o->kv;
    for (int i = 0; i < o->n_kv && n < cap; i++) {
        xb_case_t *c = &cases[n++];
        memset(c, 0, sizeof(*c));
        uint32_t t = o->kv_tokens[i];
        if (t % 1024 == 0)
            snprintf(c->name, sizeof(c->name), "kv-%" PRIu32 "k", t / 1024);
        else
            snprintf(c->name, sizeof(c->name), "kv-%" PRIu32, t);
        c->kind = "kv";
        c->tokens = t;
        c->n_layers = k->layers;
        c->ppl = 2 * ((t + k->page_tokens - 1) / k->page_tokens); /* K pages, then V pages */
        c->page_len = (uint64_t)k->page_tokens * k->kv_heads * k->head_dim * k->dtype_bytes;
        c->room_bytes = (uint64_t)c->n_layers * c->ppl * c->page_len;
        c->window = 1; /* a hand-off measured alone, as a request's TTFT sees it */
    }
    return n;
}

/* ---- options ------------------------------------------------------------------------------ */

static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s)
        return -1;
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1024;
    else if (*end == 'M' || *end == 'm')
        mul = 1024 * 1024;
    else if (*end == 'G' || *end == 'g')
        mul = 1024ull * 1024 * 1024;
    if (mul != 1) {
        end++;
        if (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0 || strcmp(end, "ib") == 0)
            end += strlen(end);
    } else if (strcmp(end, "B") == 0) {
        end++;
    }
    if (*end != '\0' || v == 0 || v > (UINT64_MAX / mul))
        return -1;
    *out = v * mul;
    return 0;
}

static int parse_list(const char *arg, uint64_t *out, int cap, int *n_p, int sizes)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", arg);
    int n = 0;
    if (strcmp(buf, "none") == 0) {
        *n_p = 0;
        return 0;
    }
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        if (n >= cap)
            return -1;
        if (sizes) {
            if (parse_size(t, &v) != 0)
                return -1;
        } else {
            char *end;
            errno = 0;
            unsigned long long x = strtoull(t, &end, 10);
            if (errno != 0 || end == t || x == 0)
                return -1;
            if (*end == 'k' || *end == 'K') {
                x *= 1024;
                end++;
            }
            if (*end != '\0' || x > UINT32_MAX)
                return -1;
            v = x;
        }
        out[n++] = v;
    }
    *n_p = n;
    return n > 0 ? 0 : -1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: baton-xfer-bench [options]          (driver: measures, starts its server)\n"
            "       baton-xfer-bench --serve [options]  (the prefill side only)\n"
            "\n"
            "driver:\n"
            "  --transports LIST     tcp,shm,rdma (default; an unusable one is reported as such)\n"
            "  --sizes LIST          block sizes, e.g. 4K,16K,...,64M (default: 4K to 64M, x4)\n"
            "  --kv-tokens LIST      KV hand-offs in tokens, e.g. 4k,16k (default; 'none' skips)\n"
            "  --kv-shape L,H,D,B,P  layers, KV heads, head dim, dtype bytes, page tokens\n"
            "                        (default 64,8,128,2,64)\n"
            "  --runs N              measured runs per block size (default 5)\n"
            "  --kv-runs N           measured runs per KV hand-off (default 5)\n"
            "  --warmup N            warm-up rooms per case (default 8, at least one window)\n"
            "  --run-ms N            throughput run length (default 600)\n"
            "  --run-mb N            ...or this many MiB, whichever first (default 1024)\n"
            "  --lat-ms N            latency run length, one room at a time (default 300)\n"
            "  --lat-rooms N         at most this many rooms per latency run (default 200)\n"
            "  --window-mb N         bytes in flight in throughput runs (default 64)\n"
            "  --max-window N        rooms in flight at most (default 64)\n"
            "  --verify MODE         all | sample (default: warm-up rooms and the last room of\n"
            "                        every slot after each run, untimed) | none\n"
            "  --no-memcpy           skip the memcpy baseline\n"
            "  --connect H:P         use a server already running there (one transport)\n"
            "  --json FILE           write the result as JSON ('-': stdout, no tables)\n"
            "  --smoke               a second or two with small sizes, every byte verified\n"
            "  --quiet               no tables\n"
            "both:\n"
            "  --slice BYTES         engine slice size (default: the engine's, 64 KiB)\n"
            "  --lanes N             tcp lanes per peer (default: the engine's, 4)\n"
            "  --src-mb N            source pattern buffer (default 256)\n"
            "  --seed N              pattern seed (default 1)\n"
            "  --log-level L         libbaton log level (default warn)\n"
            "server:\n"
            "  --serve --transports T --listen H:P [--notify-fd FD]\n");
}

static void defaults(xb_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->src_bytes = 256u << 20;
    o->seed = 1;
    o->log_lvl = "warn";
    o->listen_host = "127.0.0.1";
    o->notify_fd = -1;
    o->tps[0] = BATON_XFER_TRANSPORT_TCP;
    o->tps[1] = BATON_XFER_TRANSPORT_SHM;
    o->tps[2] = BATON_XFER_TRANSPORT_RDMA;
    o->n_tps = 3;
    o->n_sizes = 0;
    for (uint64_t s = 4096; s <= (64u << 20); s *= 4)
        o->sizes[o->n_sizes++] = s;
    o->kv_tokens[0] = 4096;
    o->kv_tokens[1] = 16384;
    o->n_kv = 2;
    o->kv = (xb_kv_shape_t){64, 8, 128, 2, 64};
    o->runs = 5;
    o->kv_runs = 5;
    o->warmup_rooms = 8;
    o->run_ms = 600;
    o->run_bytes = 1024ull << 20;
    o->lat_ms = 300;
    o->lat_rooms = 200;
    o->window_bytes = 64u << 20;
    o->max_window = 64;
    o->verify = XB_VERIFY_SAMPLE;
    o->memcpy_baseline = 1;
}

static void smoke(xb_opts_t *o)
{
    o->n_sizes = 3;
    o->sizes[0] = 4096;
    o->sizes[1] = 64 * 1024;
    o->sizes[2] = 1024 * 1024;
    o->n_kv = 1;
    o->kv_tokens[0] = 128; /* 64 layers x 4 pages x 128 KiB = 32 MiB */
    o->runs = 2;
    o->kv_runs = 2;
    o->warmup_rooms = 2;
    o->run_ms = 60;
    o->run_bytes = 16u << 20;
    o->lat_ms = 30;
    o->lat_rooms = 20;
    o->window_bytes = 4u << 20;
    o->max_window = 8;
    o->src_bytes = 16u << 20;
    o->verify = XB_VERIFY_ALL;
}

static int parse_tps(const char *arg, xb_opts_t *o)
{
    char buf[64];
    snprintf(buf, sizeof(buf), "%s", arg);
    o->n_tps = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (o->n_tps >= XB_MAX_TP || baton_xfer_transport_parse(t, &o->tps[o->n_tps]) != 0)
            return -1;
        o->n_tps++;
    }
    return o->n_tps > 0 ? 0 : -1;
}

static int split_hostport(char *arg, const char **host, int *port)
{
    char *colon = strrchr(arg, ':');
    if (colon == NULL)
        return -1;
    *colon = '\0';
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end != '\0' || p < 0 || p > 65535 || arg[0] == '\0')
        return -1;
    *host = arg;
    *port = (int)p;
    return 0;
}

static unsigned long num(const char *s, int *bad)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0')
        *bad = 1;
    return v;
}

int main(int argc, char **argv)
{
    xb_opts_t o;
    defaults(&o);
    enum {
        O_SERVE = 1,
        O_TPS,
        O_LISTEN,
        O_NOTIFY,
        O_CONNECT,
        O_SIZES,
        O_KV,
        O_KVSHAPE,
        O_RUNS,
        O_KVRUNS,
        O_WARMUP,
        O_RUNMS,
        O_RUNMB,
        O_LATMS,
        O_LATROOMS,
        O_WINMB,
        O_MAXWIN,
        O_VERIFY,
        O_NOMEMCPY,
        O_JSON,
        O_SMOKE,
        O_QUIET,
        O_SLICE,
        O_LANES,
        O_SRCMB,
        O_SEED,
        O_LOG,
    };
    static const struct option lo[] = {{"serve", 0, 0, O_SERVE},
                                       {"transports", 1, 0, O_TPS},
                                       {"listen", 1, 0, O_LISTEN},
                                       {"notify-fd", 1, 0, O_NOTIFY},
                                       {"connect", 1, 0, O_CONNECT},
                                       {"sizes", 1, 0, O_SIZES},
                                       {"kv-tokens", 1, 0, O_KV},
                                       {"kv-shape", 1, 0, O_KVSHAPE},
                                       {"runs", 1, 0, O_RUNS},
                                       {"kv-runs", 1, 0, O_KVRUNS},
                                       {"warmup", 1, 0, O_WARMUP},
                                       {"run-ms", 1, 0, O_RUNMS},
                                       {"run-mb", 1, 0, O_RUNMB},
                                       {"lat-ms", 1, 0, O_LATMS},
                                       {"lat-rooms", 1, 0, O_LATROOMS},
                                       {"window-mb", 1, 0, O_WINMB},
                                       {"max-window", 1, 0, O_MAXWIN},
                                       {"verify", 1, 0, O_VERIFY},
                                       {"no-memcpy", 0, 0, O_NOMEMCPY},
                                       {"json", 1, 0, O_JSON},
                                       {"smoke", 0, 0, O_SMOKE},
                                       {"quiet", 0, 0, O_QUIET},
                                       {"slice", 1, 0, O_SLICE},
                                       {"lanes", 1, 0, O_LANES},
                                       {"src-mb", 1, 0, O_SRCMB},
                                       {"seed", 1, 0, O_SEED},
                                       {"log-level", 1, 0, O_LOG},
                                       {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
    /* --smoke first, so explicit options given with it still override its values. */
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--smoke") == 0)
            smoke(&o);
    int ch, bad = 0;
    while ((ch = getopt_long(argc, argv, "h", lo, NULL)) != -1 && !bad) {
        switch (ch) {
        case O_SERVE:
            o.serve = 1;
            break;
        case O_TPS:
            bad = parse_tps(optarg, &o) != 0;
            break;
        case O_LISTEN:
            bad = split_hostport(optarg, &o.listen_host, &o.listen_port) != 0;
            break;
        case O_NOTIFY:
            o.notify_fd = (int)num(optarg, &bad);
            break;
        case O_CONNECT:
            bad = split_hostport(optarg, &o.connect_host, &o.connect_port) != 0 ||
                  o.connect_port == 0;
            break;
        case O_SIZES:
            bad = parse_list(optarg, o.sizes, XB_MAX_SIZES, &o.n_sizes, 1) != 0;
            break;
        case O_KV: {
            uint64_t v[XB_MAX_SIZES];
            bad = parse_list(optarg, v, XB_MAX_SIZES, &o.n_kv, 0) != 0;
            for (int i = 0; i < o.n_kv; i++)
                o.kv_tokens[i] = (uint32_t)v[i];
            break;
        }
        case O_KVSHAPE: {
            unsigned a, b, c, d, e;
            char extra;
            if (sscanf(optarg, "%u,%u,%u,%u,%u%c", &a, &b, &c, &d, &e, &extra) != 5 || !a || !b ||
                !c || !d || !e)
                bad = 1;
            else
                o.kv = (xb_kv_shape_t){a, b, c, d, e};
            break;
        }
        case O_RUNS:
            o.runs = (uint32_t)num(optarg, &bad);
            break;
        case O_KVRUNS:
            o.kv_runs = (uint32_t)num(optarg, &bad);
            break;
        case O_WARMUP:
            o.warmup_rooms = (uint32_t)num(optarg, &bad);
            break;
        case O_RUNMS:
            o.run_ms = (uint32_t)num(optarg, &bad);
            break;
        case O_RUNMB:
            o.run_bytes = (uint64_t)num(optarg, &bad) << 20;
            break;
        case O_LATMS:
            o.lat_ms = (uint32_t)num(optarg, &bad);
            break;
        case O_LATROOMS:
            o.lat_rooms = (uint32_t)num(optarg, &bad);
            break;
        case O_WINMB:
            o.window_bytes = (uint64_t)num(optarg, &bad) << 20;
            break;
        case O_MAXWIN:
            o.max_window = (uint32_t)num(optarg, &bad);
            break;
        case O_VERIFY:
            if (strcmp(optarg, "all") == 0)
                o.verify = XB_VERIFY_ALL;
            else if (strcmp(optarg, "sample") == 0)
                o.verify = XB_VERIFY_SAMPLE;
            else if (strcmp(optarg, "none") == 0)
                o.verify = XB_VERIFY_NONE;
            else
                bad = 1;
            break;
        case O_NOMEMCPY:
            o.memcpy_baseline = 0;
            break;
        case O_JSON:
            o.json_path = optarg;
            break;
        case O_SMOKE:
            break; /* applied above */
        case O_QUIET:
            o.quiet = 1;
            break;
        case O_SLICE: {
            uint64_t v;
            bad = parse_size(optarg, &v) != 0 || v > (16u << 20);
            o.slice = (uint32_t)v;
            break;
        }
        case O_LANES:
            o.lanes = (uint32_t)num(optarg, &bad);
            bad |= o.lanes > 16;
            break;
        case O_SRCMB:
            o.src_bytes = (size_t)num(optarg, &bad) << 20;
            break;
        case O_SEED:
            o.seed = num(optarg, &bad);
            break;
        case O_LOG:
            o.log_lvl = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            bad = 1;
        }
    }
    if (bad || optind != argc) {
        if (optind > 0 && optind <= argc)
            fprintf(stderr, "baton-xfer-bench: bad option or value near '%s'\n", argv[optind - 1]);
        usage(stderr);
        return 2;
    }
    baton_log_level_t lvl;
    if (baton_log_parse_level(o.log_lvl, &lvl) != 0) {
        fprintf(stderr, "baton-xfer-bench: bad --log-level %s\n", o.log_lvl);
        return 2;
    }
    baton_log_set_level(lvl);
    signal(SIGPIPE, SIG_IGN);

    if (o.serve) {
        if (o.src_bytes < XB_SRC_ALIGN || o.src_bytes % XB_SRC_ALIGN != 0) {
            fprintf(stderr, "baton-xfer-bench: bad --src-mb\n");
            return 2;
        }
        return xb_serve(&o); /* pages larger than the source are refused per room */
    }

    uint64_t max_page = 0;
    for (int i = 0; i < o.n_sizes; i++)
        max_page = o.sizes[i] > max_page ? o.sizes[i] : max_page;
    uint64_t kv_page =
        (uint64_t)o.kv.page_tokens * o.kv.kv_heads * o.kv.head_dim * o.kv.dtype_bytes;
    if (o.n_kv > 0 && kv_page > max_page)
        max_page = kv_page;
    if (o.src_bytes < XB_SRC_ALIGN || o.src_bytes % XB_SRC_ALIGN != 0 || o.src_bytes < max_page) {
        fprintf(stderr,
                "baton-xfer-bench: --src-mb must hold the largest page (%" PRIu64 " bytes)\n",
                max_page);
        return 2;
    }
    if (max_page > UINT32_MAX) {
        fprintf(stderr, "baton-xfer-bench: a page is at most 4 GiB - 1 bytes\n");
        return 2;
    }

    if (o.runs == 0 || o.kv_runs == 0 || o.max_window == 0 || o.n_tps == 0 ||
        (o.n_sizes == 0 && o.n_kv == 0)) {
        fprintf(stderr, "baton-xfer-bench: nothing to measure\n");
        return 2;
    }
    if (o.connect_host != NULL && o.n_tps != 1) {
        fprintf(stderr, "baton-xfer-bench: --connect measures one transport (--transports T)\n");
        return 2;
    }
    xb_case_t cases[2 * XB_MAX_SIZES];
    int n_cases = xb_cases(&o, cases, 2 * XB_MAX_SIZES);
    for (int i = 0; i < n_cases; i++) {
        if ((uint64_t)cases[i].n_layers * cases[i].ppl > 131072) {
            fprintf(stderr, "baton-xfer-bench: case %s has more pages than an offer may carry\n",
                    cases[i].name);
            return 2;
        }
    }
    uint8_t *src = xb_source_new(o.src_bytes, o.seed);
    if (src == NULL) {
        fprintf(stderr, "baton-xfer-bench: cannot allocate the source buffer\n");
        return 1;
    }

    json_t *result = json_object();
    json_t *cfg = json_pack(
        "{s:I, s:I, s:I, s:I, s:i, s:i, s:I, s:I, s:I, s:I, s:s, s:{s:i, s:i, s:i, s:i, s:i}}",
        "slice_bytes", (json_int_t)(o.slice ? o.slice : 65536), "lanes",
        (json_int_t)(o.lanes ? o.lanes : 4), "src_bytes", (json_int_t)o.src_bytes, "seed",
        (json_int_t)o.seed, "runs", (int)o.runs, "kv_runs", (int)o.kv_runs, "run_ms",
        (json_int_t)o.run_ms, "run_bytes", (json_int_t)o.run_bytes, "lat_ms", (json_int_t)o.lat_ms,
        "window_bytes", (json_int_t)o.window_bytes, "verify",
        o.verify == XB_VERIFY_ALL      ? "all"
        : o.verify == XB_VERIFY_SAMPLE ? "sample"
                                       : "none",
        "kv_shape", "layers", (int)o.kv.layers, "kv_heads", (int)o.kv.kv_heads, "head_dim",
        (int)o.kv.head_dim, "dtype_bytes", (int)o.kv.dtype_bytes, "page_tokens",
        (int)o.kv.page_tokens);
    char cmdline[2048] = "";
    size_t off = 0;
    for (int i = 0; i < argc && off < sizeof(cmdline) - 1; i++)
        off +=
            (size_t)snprintf(cmdline + off, sizeof(cmdline) - off, "%s%s", i ? " " : "", argv[i]);
    json_object_set_new(result, "tool", json_string("baton-xfer-bench"));
    json_object_set_new(result, "format", json_integer(1));
    json_object_set_new(result, "command", json_string(cmdline));
    json_object_set_new(result, "machine", xb_machine_json());
    json_object_set_new(result, "config", cfg);
    json_t *mc = json_array();
    json_t *tps = json_array();
    json_object_set_new(result, "memcpy", mc);
    json_object_set_new(result, "transports", tps);

    int status = 0;
    if (o.memcpy_baseline) {
        int rc = xb_memcpy_baseline(&o, cases, n_cases, src, mc);
        if (rc != 0)
            status = rc;
    }
    for (int i = 0; i < o.n_tps; i++) {
        int rc = xb_drive_transport(&o, o.tps[i], cases, n_cases, src, tps);
        if (rc != 0 && (status == 0 || rc == 3))
            status = rc;
    }
    uint64_t vbytes = 0, vrooms = 0, corrupt = 0;
    size_t ti;
    json_t *t;
    json_array_foreach(tps, ti, t)
    {
        vbytes += (uint64_t)json_integer_value(json_object_get(t, "verified_bytes"));
        vrooms += (uint64_t)json_integer_value(json_object_get(t, "verified_rooms"));
        corrupt += (uint64_t)json_integer_value(json_object_get(t, "corrupt_rooms"));
    }
    json_object_set_new(result, "verified_bytes", json_integer((json_int_t)vbytes));
    json_object_set_new(result, "verified_rooms", json_integer((json_int_t)vrooms));
    json_object_set_new(result, "corrupt_rooms", json_integer((json_int_t)corrupt));
    json_object_set_new(result, "status", json_integer(status));
    if (corrupt > 0)
        status = 3;

    int to_stdout = o.json_path != NULL && strcmp(o.json_path, "-") == 0;
    if (!o.quiet && !to_stdout)
        xb_print_report(result);
    if (o.json_path != NULL) {
        int rc = to_stdout ? json_dumpf(result, stdout, JSON_INDENT(2))
                           : json_dump_file(result, o.json_path, JSON_INDENT(2));
        if (to_stdout)
            fputc('\n', stdout);
        if (rc != 0) {
            fprintf(stderr, "baton-xfer-bench: cannot write %s\n", o.json_path);
            status = status ? status : 1;
        }
    }
    json_decref(result);
    free(src);
    return status;
}
