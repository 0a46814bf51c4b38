/* main.c — baton-bench's command line: parse options, run, report. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "baton/error.h"
#include "bench.h"

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: baton-bench [options]\n"
            "       baton-bench --compare A.json B.json\n"
            "\n"
            "An OpenAI / SGLang HTTP load generator: TTFT, TPOT, ITL and E2E latency with the\n"
            "definitions of SGLang's bench_serving and vLLM's bench serve (docs/BENCHMARKS.md).\n"
            "\n"
            "Target:\n"
            "  --base-url URL            server to load (default http://127.0.0.1:8000)\n"
            "  --endpoint NAME           chat (/v1/chat/completions, default), completions\n"
            "                            (/v1/completions) or generate (/generate)\n"
            "  --stream                  ask for a streamed (SSE) answer\n"
            "  --model NAME              the \"model\" field (left out when not given)\n"
            "  --ignore-eos              ask the server to ignore EOS (real engines)\n"
            "  --token-ids               completions / generate: send the prompt as token ids (a\n"
            "                            hash of each word), as a client with its own tokenizer\n"
            "  --ca FILE                 https:// URLs: verify the server against this CA bundle\n"
            "                            (default: the system's)\n"
            "  --new-connection          a new connection (and TLS handshake) per request\n"
            "  --header 'NAME: VALUE'    an extra request header (repeatable, up to 8), e.g.\n"
            "                            'x-priority: bulk' or 'Authorization: Bearer KEY'\n"
            "\n"
            "Load (closed loop by default):\n"
            "  --concurrency C           closed loop: C users, each sends its next request when\n"
            "                            its previous one ends (default 1)\n"
            "  --request-rate R          open loop: R arrivals per second\n"
            "  --arrival poisson|fixed   open-loop arrival process (default poisson)\n"
            "  --max-concurrency C       open loop: at most C requests in flight (others wait)\n"
            "  --num-requests N          measured requests (default 100)\n"
            "  --duration S              or: send for S seconds (then let the last ones finish)\n"
            "  --warmup S                requests sent in the first S seconds are not measured\n"
            "  --timeout S               per-request limit, 0 = none (default 300)\n"
            "\n"
            "Prompts (lengths in words; baton-worker counts one token per word):\n"
            "  --input-len N             prompt length (default 128)\n"
            "  --input-len-range A:B     uniform in [A, B]\n"
            "  --output-len N            max_tokens (default 16)\n"
            "  --output-len-range A:B    uniform in [A, B]\n"
            "  --dataset FILE            ShareGPT-format JSON instead of random prompts\n"
            "  --multi-turn K            sessions of K turns; each turn repeats the history\n"
            "                            (each session sends \"user\": its own key)\n"
            "  --shared-prefix N[:G]     each session opens with one of G shared system\n"
            "                            prompts of N words (default G = 1)\n"
            "  --think-time S            a session waits S seconds after an answer before its\n"
            "                            next turn (default 0)\n"
            "  --seed N                  random seed (default 1)\n"
            "\n"
            "SLOs for goodput (a request is good when it meets every one given):\n"
            "  --slo-ttft-ms MS  --slo-tpot-ms MS  --slo-e2e-ms MS\n"
            "\n"
            "Output:\n"
            "  --result-json FILE        write the results as JSON\n"
            "  --plot FILE.png           latency CDFs (needs gnuplot; skipped with a message)\n"
            "  --compare A.json B.json   print B/A ratios of two result files and exit\n"
            "  --progress|--no-progress  live progress line (default: when stdout is a terminal)\n"
            "  --quiet                   no result table\n"
            "  --help\n"
            "  --version\n");
}

static int parse_double(const char *s, double lo, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo)
        return -1;
    *out = v;
    return 0;
}

static int parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end;
    errno = 0;
    if (*s == '-' || *s == '\0')
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* "N" or "A:B" with lo <= A <= B <= hi. */
static int parse_range(const char *s, uint32_t lo, uint32_t hi, uint32_t *a, uint32_t *b)
{
    char tmp[64];
    if (strlen(s) >= sizeof(tmp))
        return -1;
    strcpy(tmp, s);
    char *colon = strchr(tmp, ':');
    uint64_t x, y;
    if (colon)
        *colon = '\0';
    if (parse_u64(tmp, lo, hi, &x))
        return -1;
    y = x;
    if (colon && parse_u64(colon + 1, lo, hi, &y))
        return -1;
    if (y < x)
        return -1;
    *a = (uint32_t)x;
    *b = (uint32_t)y;
    return 0;
}

enum {
    O_BASE_URL = 256,
    O_ENDPOINT,
    O_STREAM,
    O_MODEL,
    O_IGNORE_EOS,
    O_TOKEN_IDS,
    O_CONCURRENCY,
    O_RATE,
    O_ARRIVAL,
    O_MAX_CONC,
    O_NUM,
    O_DURATION,
    O_WARMUP,
    O_TIMEOUT,
    O_IN,
    O_IN_RANGE,
    O_OUT,
    O_OUT_RANGE,
    O_DATASET,
    O_MULTI,
    O_SHARED,
    O_THINK,
    O_SEED,
    O_SLO_TTFT,
    O_SLO_TPOT,
    O_SLO_E2E,
    O_RESULT,
    O_PLOT,
    O_COMPARE,
    O_PROGRESS,
    O_NO_PROGRESS,
    O_QUIET,
    O_CA,
    O_NEW_CONN,
    O_HEADER,
    O_HELP,
    O_VERSION,
};

static const struct option opts[] = {
    {"base-url", required_argument, 0, O_BASE_URL},
    {"endpoint", required_argument, 0, O_ENDPOINT},
    {"stream", no_argument, 0, O_STREAM},
    {"model", required_argument, 0, O_MODEL},
    {"ignore-eos", no_argument, 0, O_IGNORE_EOS},
    {"token-ids", no_argument, 0, O_TOKEN_IDS},
    {"concurrency", required_argument, 0, O_CONCURRENCY},
    {"request-rate", required_argument, 0, O_RATE},
    {"arrival", required_argument, 0, O_ARRIVAL},
    {"max-concurrency", required_argument, 0, O_MAX_CONC},
    {"num-requests", required_argument, 0, O_NUM},
    {"duration", required_argument, 0, O_DURATION},
    {"warmup", required_argument, 0, O_WARMUP},
    {"timeout", required_argument, 0, O_TIMEOUT},
    {"input-len", required_argument, 0, O_IN},
    {"input-len-range", required_argument, 0, O_IN_RANGE},
    {"output-len", required_argument, 0, O_OUT},
    {"output-len-range", required_argument, 0, O_OUT_RANGE},
    {"dataset", required_argument, 0, O_DATASET},
    {"multi-turn", required_argument, 0, O_MULTI},
    {"shared-prefix", required_argument, 0, O_SHARED},
    {"think-time", required_argument, 0, O_THINK},
    {"seed", required_argument, 0, O_SEED},
    {"slo-ttft-ms", required_argument, 0, O_SLO_TTFT},
    {"slo-tpot-ms", required_argument, 0, O_SLO_TPOT},
    {"slo-e2e-ms", required_argument, 0, O_SLO_E2E},
    {"result-json", required_argument, 0, O_RESULT},
    {"plot", required_argument, 0, O_PLOT},
    {"compare", required_argument, 0, O_COMPARE},
    {"progress", no_argument, 0, O_PROGRESS},
    {"no-progress", no_argument, 0, O_NO_PROGRESS},
    {"quiet", no_argument, 0, O_QUIET},
    {"ca", required_argument, 0, O_CA},
    {"new-connection", no_argument, 0, O_NEW_CONN},
    {"header", required_argument, 0, O_HEADER},
    {"help", no_argument, 0, O_HELP},
    {"version", no_argument, 0, O_VERSION},
    {0, 0, 0, 0},
};

static int bad(const char *opt, const char *val, const char *want)
{
    fprintf(stderr, "baton-bench: --%s %s: %s (see --help)\n", opt, val ? val : "", want);
    return 2;
}

/* As many descriptors as allowed: every connection is one. */
static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int main(int argc, char **argv)
{
    bb_config_t cfg = {0};
    cfg.base_url = "http://127.0.0.1:8000";
    cfg.endpoint = BB_EP_CHAT;
    cfg.in_lo = cfg.in_hi = 128;
    cfg.out_lo = cfg.out_hi = 16;
    cfg.multi_turn = 1;
    cfg.seed = 1;
    cfg.timeout_s = 300;
    int progress = -1, quiet = 0, conc_given = 0;
    const char *result_json = NULL, *plot = NULL, *dataset = NULL, *compare_a = NULL;
    uint64_t u;

    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        const char *name = NULL;
        for (const struct option *o = opts; o->name; o++)
            if (o->val == c)
                name = o->name;
        switch (c) {
        case O_BASE_URL:
            cfg.base_url = optarg;
            break;
        case O_ENDPOINT:
            if (!strcmp(optarg, "chat"))
                cfg.endpoint = BB_EP_CHAT;
            else if (!strcmp(optarg, "completions"))
                cfg.endpoint = BB_EP_COMPLETIONS;
            else if (!strcmp(optarg, "generate"))
                cfg.endpoint = BB_EP_GENERATE;
            else
                return bad(name, optarg, "want chat, completions or generate");
            break;
        case O_STREAM:
            cfg.stream = 1;
            break;
        case O_MODEL:
            cfg.model = optarg;
            break;
        case O_IGNORE_EOS:
            cfg.ignore_eos = 1;
            break;
        case O_TOKEN_IDS:
            cfg.token_ids = 1;
            break;
        case O_CONCURRENCY:
            if (parse_u64(optarg, 1, 1000000, &u))
                return bad(name, optarg, "want an integer in [1, 1000000]");
            cfg.concurrency = (unsigned)u;
            conc_given = 1;
            break;
        case O_RATE:
            if (parse_double(optarg, 0, &cfg.request_rate) || cfg.request_rate <= 0)
                return bad(name, optarg, "want a number of requests per second > 0");
            break;
        case O_ARRIVAL:
            if (!strcmp(optarg, "poisson"))
                cfg.arrival = BB_ARRIVAL_POISSON;
            else if (!strcmp(optarg, "fixed"))
                cfg.arrival = BB_ARRIVAL_FIXED;
            else
                return bad(name, optarg, "want poisson or fixed");
            break;
        case O_MAX_CONC:
            if (parse_u64(optarg, 1, 1000000, &u))
                return bad(name, optarg, "want an integer in [1, 1000000]");
            cfg.max_concurrency = (unsigned)u;
            break;
        case O_NUM:
            if (parse_u64(optarg, 1, UINT64_MAX / 2, &cfg.num_requests))
                return bad(name, optarg, "want an integer >= 1");
            break;
        case O_DURATION:
            if (parse_double(optarg, 0, &cfg.duration_s) || cfg.duration_s <= 0 ||
                cfg.duration_s > 1e7)
                return bad(name, optarg, "want seconds > 0");
            break;
        case O_WARMUP:
            if (parse_double(optarg, 0, &cfg.warmup_s) || cfg.warmup_s > 1e6)
                return bad(name, optarg, "want seconds >= 0");
            break;
        case O_TIMEOUT:
            if (parse_double(optarg, 0, &cfg.timeout_s) || cfg.timeout_s > 1e7)
                return bad(name, optarg, "want seconds >= 0 (0 = none)");
            break;
        case O_IN:
        case O_IN_RANGE:
            if (parse_range(optarg, 1, 100000000, &cfg.in_lo, &cfg.in_hi))
                return bad(name, optarg, "want N or A:B with 1 <= A <= B");
            break;
        case O_OUT:
        case O_OUT_RANGE:
            if (parse_range(optarg, 1, 1 << 20, &cfg.out_lo, &cfg.out_hi))
                return bad(name, optarg, "want N or A:B with 1 <= A <= B <= 1048576");
            cfg.out_given = 1;
            break;
        case O_DATASET:
            dataset = optarg;
            break;
        case O_MULTI:
            if (parse_u64(optarg, 1, 1000, &u))
                return bad(name, optarg, "want an integer in [1, 1000]");
            cfg.multi_turn = (unsigned)u;
            break;
        case O_SHARED: {
            uint32_t n, g = 1;
            char *colon = strchr(optarg, ':');
            if (colon) {
                *colon = '\0';
                uint64_t gv;
                int bad_g = parse_u64(colon + 1, 1, 100000, &gv);
                *colon = ':';
                if (bad_g)
                    return bad(name, optarg, "want N or N:G with N >= 1, 1 <= G <= 100000");
                g = (uint32_t)gv;
            }
            uint64_t nv;
            if (colon)
                *colon = '\0';
            int bad_n = parse_u64(optarg, 1, 1000000, &nv);
            if (colon)
                *colon = ':';
            if (bad_n)
                return bad(name, optarg, "want N or N:G with N >= 1, 1 <= G <= 100000");
            n = (uint32_t)nv;
            cfg.shared_prefix_words = n;
            cfg.shared_prefix_groups = g;
            break;
        }
        case O_THINK:
            if (parse_double(optarg, 0, &cfg.think_s) || cfg.think_s > 1e6)
                return bad(name, optarg, "want seconds >= 0");
            break;
        case O_SEED:
            if (parse_u64(optarg, 0, UINT64_MAX, &cfg.seed))
                return bad(name, optarg, "want an unsigned integer");
            break;
        case O_SLO_TTFT:
            if (parse_double(optarg, 0, &cfg.slo_ttft_ms) || cfg.slo_ttft_ms <= 0)
                return bad(name, optarg, "want milliseconds > 0");
            break;
        case O_SLO_TPOT:
            if (parse_double(optarg, 0, &cfg.slo_tpot_ms) || cfg.slo_tpot_ms <= 0)
                return bad(name, optarg, "want milliseconds > 0");
            break;
        case O_SLO_E2E:
            if (parse_double(optarg, 0, &cfg.slo_e2e_ms) || cfg.slo_e2e_ms <= 0)
                return bad(name, optarg, "want milliseconds > 0");
            break;
        case O_RESULT:
            result_json = optarg;
            break;
        case O_PLOT:
            if (strchr(optarg, '\'') || strchr(optarg, '\n'))
                return bad(name, optarg, "the file name may not contain quotes or newlines");
            plot = optarg;
            break;
        case O_COMPARE:
            compare_a = optarg;
            break;
        case O_PROGRESS:
            progress = 1;
            break;
        case O_NO_PROGRESS:
            progress = 0;
            break;
        case O_QUIET:
            quiet = 1;
            break;
        case O_CA:
            cfg.ca_file = optarg;
            break;
        case O_NEW_CONN:
            cfg.new_connection = 1;
            break;
        case O_HEADER: {
            const char *colon = strchr(optarg, ':');
            if (!colon || colon == optarg || strpbrk(optarg, "\r\n"))
                return bad(name, optarg, "want 'NAME: VALUE' on one line");
            if (cfg.n_headers == BB_MAX_HEADERS)
                return bad(name, optarg, "at most 8 headers");
            cfg.headers[cfg.n_headers++] = optarg;
            break;
        }
        case 'h':
        case O_HELP:
            usage(stdout);
            return 0;
        case O_VERSION:
            printf("baton-bench %s\n", BATON_VERSION_TEXT);
            return 0;
        case '?':
        default:
            if (optopt && optopt < 256)
                fprintf(stderr, "baton-bench: unknown option -%c (see --help)\n", optopt);
            else if (optopt)
                fprintf(stderr, "baton-bench: option %s needs a value (see --help)\n",
                        argv[optind - 1]);
            else
                fprintf(stderr, "baton-bench: unknown option %s (see --help)\n", argv[optind - 1]);
            return 2;
        }
    }
    if (compare_a) {
        if (optind != argc - 1) {
            fprintf(stderr, "baton-bench: --compare needs two files: --compare A.json B.json\n");
            return 2;
        }
        return bb_compare(compare_a, argv[optind]);
    }
    if (optind < argc) {
        fprintf(stderr, "baton-bench: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
    if (cfg.request_rate > 0 && conc_given) {
        fprintf(stderr, "baton-bench: --concurrency (closed loop) and --request-rate (open loop) "
                        "exclude each other; use --max-concurrency to cap an open loop\n");
        return 2;
    }
    if (cfg.max_concurrency && cfg.request_rate <= 0) {
        fprintf(stderr, "baton-bench: --max-concurrency applies to --request-rate only\n");
        return 2;
    }
    if (cfg.num_requests && cfg.duration_s > 0) {
        fprintf(stderr, "baton-bench: give --num-requests or --duration, not both\n");
        return 2;
    }
    if (!cfg.num_requests && cfg.duration_s <= 0)
        cfg.num_requests = 100;
    if (!cfg.concurrency)
        cfg.concurrency = 1;
    if (baton_url_parse(cfg.base_url, &cfg.url) != 0) {
        fprintf(stderr, "baton-bench: --base-url %s: want http://HOST[:PORT][/PREFIX]\n",
                cfg.base_url);
        return 2;
    }
    cfg.progress = progress >= 0 ? progress : isatty(STDOUT_FILENO);

    bb_dataset_t ds = {0};
    if (dataset) {
        char err[512];
        int rc = bb_dataset_load_sharegpt(&ds, dataset, err, sizeof(err));
        if (rc) {
            fprintf(stderr, "baton-bench: --dataset: %s\n",
                    rc == BATON_ENOMEM ? "out of memory" : err);
            return 2;
        }
        cfg.dataset = &ds;
    }

    signal(SIGPIPE, SIG_IGN);
    raise_nofile();
    bb_results_t res;
    int rc = bb_run(&cfg, &res);
    if (rc < 0) {
        bb_dataset_free(&ds);
        return 1;
    }
    bb_results_summarize(&res);
    if (!quiet)
        bb_report_print(&cfg, &res);
    int status = res.completed > 0 ? 0 : 1;
    if (res.completed == 0)
        fprintf(stderr, "baton-bench: no request succeeded\n");
    if (result_json && bb_report_json(&cfg, &res, result_json) != 0)
        status = 1;
    if (plot && bb_plot(&res, plot) != 0)
        status = 1;
    bb_results_free(&res);
    bb_dataset_free(&ds);
    return res.interrupted ? 130 : status;
}
