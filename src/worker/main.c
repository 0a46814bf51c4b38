/* main.c — baton-worker's command line, signals and event loop. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "baton/error.h"
#include "common/log.h"
#include "worker/worker.h"

#define COMP "worker"

static void usage(FILE *f)
{
    wk_config_t d;
    wk_config_default(&d);
    fprintf(f,
            "Usage: baton-worker [options]\n"
            "\n"
            "A simulated SGLang-compatible inference engine for Baton: serves /generate,\n"
            "/v1/chat/completions and /v1/completions with deterministic text (docs/WORKER.md),\n"
            "a timing model, and prefill/decode KV hand-off through libbaton.\n"
            "\n"
            "Options:\n"
            "  --mode MODE                  prefill | decode | regular (default %s)\n"
            "  --host HOST                  address to listen on (default %s)\n"
            "  --port PORT                  HTTP port, 0 = ephemeral (default %d)\n"
            "  --bootstrap-port PORT        prefill: bootstrap port, 0 = ephemeral (default %d)\n"
            "  --model-name NAME            model name to report (default %s)\n"
            "  --prefill-us-per-token US    prefill cost per prompt token (default %llu)\n"
            "  --decode-us-per-token US     cost of one decode step (default %llu)\n"
            "  --max-batch N                running sequences at most (default %u)\n"
            "  --max-queue N                waiting sequences at most; more get 503 (default %u)\n"
            "  --bootstrap-timeout-ms MS    rendezvous deadline on both sides (default %llu)\n"
            "  --log-level LEVEL            debug | info | warn | error (default info)\n"
            "  -h, --help                   this text\n"
            "\n"
            "KV cache and hand-off (prefill and decode modes):\n"
            "  --model-preset NAME          %s (default %s)\n"
            "  --layers N                   layers (overrides the preset)\n"
            "  --kv-heads N                 KV heads\n"
            "  --head-dim N                 head size\n"
            "  --dtype-bytes N              bytes per element (2 = bf16)\n"
            "  --page-tokens N              tokens per KV page\n"
            "  --kv-pool-tokens N           page pool size in tokens, 0 = auto (default 0: %llu\n"
            "                               tokens, fewer when the pool would exceed %llu MiB)\n"
            "  --transport LIST             KV transports in fallback order, from rdma, shm, tcp\n"
            "                               (default shm,tcp)\n"
            "  --layerwise on|off           prefill: write each layer as it is computed\n"
            "                               (default on)\n"
            /* --- KV bootstrap authentication (issue 11) --- */
            "  --kv-secret-file FILE        shared secret of the engines allowed to exchange KV\n"
            "                               (16..1024 bytes; one trailing newline ignored):\n"
            "                               HMAC challenge-response before any KV handshake\n"
            "                               (default: none, a warning is logged)\n",
            wk_mode_name(d.mode), d.host, d.port, d.bootstrap_port, d.model_name,
            (unsigned long long)d.prefill_us_per_token, (unsigned long long)d.decode_us_per_token,
            d.max_batch, d.max_queue, (unsigned long long)d.bootstrap_timeout_ms,
            wk_kvshape_preset_names(), WK_KV_DEFAULT_PRESET,
            (unsigned long long)WK_KV_AUTO_POOL_TOKENS,
            (unsigned long long)(WK_KV_AUTO_POOL_BYTES >> 20));
}

static int parse_u64(const char *opt, const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    if (s[0] == '-' || s[0] == '\0')
        goto bad;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < min || v > max)
        goto bad;
    *out = v;
    return 0;
bad:
    fprintf(stderr, "baton-worker: %s: expected an integer in [%llu, %llu], got '%s'\n", opt,
            (unsigned long long)min, (unsigned long long)max, s);
    return -1;
}

enum {
    OPT_MODE = 256,
    OPT_HOST,
    OPT_PORT,
    OPT_BOOT_PORT,
    OPT_MODEL,
    OPT_PREFILL_US,
    OPT_DECODE_US,
    OPT_MAX_BATCH,
    OPT_MAX_QUEUE,
    OPT_BOOT_TIMEOUT,
    OPT_LOG_LEVEL,
    OPT_PRESET,
    OPT_LAYERS,
    OPT_KV_HEADS,
    OPT_HEAD_DIM,
    OPT_DTYPE_BYTES,
    OPT_PAGE_TOKENS,
    OPT_POOL_TOKENS,
    OPT_TRANSPORT,
    OPT_LAYERWISE,
    OPT_FAULT_CORRUPT,
    OPT_KV_SECRET_FILE, /* KV bootstrap authentication */
};

static const struct option long_opts[] = {
    {"mode", required_argument, NULL, OPT_MODE},
    {"host", required_argument, NULL, OPT_HOST},
    {"port", required_argument, NULL, OPT_PORT},
    {"bootstrap-port", required_argument, NULL, OPT_BOOT_PORT},
    {"model-name", required_argument, NULL, OPT_MODEL},
    {"prefill-us-per-token", required_argument, NULL, OPT_PREFILL_US},
    {"decode-us-per-token", required_argument, NULL, OPT_DECODE_US},
    {"max-batch", required_argument, NULL, OPT_MAX_BATCH},
    {"max-queue", required_argument, NULL, OPT_MAX_QUEUE},
    {"bootstrap-timeout-ms", required_argument, NULL, OPT_BOOT_TIMEOUT},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"model-preset", required_argument, NULL, OPT_PRESET},
    {"layers", required_argument, NULL, OPT_LAYERS},
    {"kv-heads", required_argument, NULL, OPT_KV_HEADS},
    {"head-dim", required_argument, NULL, OPT_HEAD_DIM},
    {"dtype-bytes", required_argument, NULL, OPT_DTYPE_BYTES},
    {"page-tokens", required_argument, NULL, OPT_PAGE_TOKENS},
    {"kv-pool-tokens", required_argument, NULL, OPT_POOL_TOKENS},
    {"transport", required_argument, NULL, OPT_TRANSPORT},
    {"layerwise", required_argument, NULL, OPT_LAYERWISE},
    /* tests only, not in --help (docs/WORKER.md): corrupt one KV byte of every Nth room */
    {"fault-corrupt-kv-every", required_argument, NULL, OPT_FAULT_CORRUPT},
    {"kv-secret-file", required_argument, NULL, OPT_KV_SECRET_FILE}, /* KV bootstrap auth */
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* "shm,tcp" -> transports in order; no repeats. */
static int parse_transports(const char *s, wk_config_t *cfg)
{
    char buf[64];
    if (strlen(s) >= sizeof(buf))
        goto bad;
    snprintf(buf, sizeof(buf), "%s", s);
    cfg->n_transports = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        baton_xfer_transport_t tp;
        if (cfg->n_transports >= BATON_XFER_MAX_TRANSPORTS ||
            baton_xfer_transport_parse(t, &tp) != 0 || tp == BATON_XFER_TRANSPORT_NONE)
            goto bad;
        for (int i = 0; i < cfg->n_transports; i++)
            if (cfg->transports[i] == tp)
                goto bad;
        cfg->transports[cfg->n_transports++] = tp;
    }
    if (cfg->n_transports > 0)
        return 0;
bad:
    fprintf(stderr,
            "baton-worker: --transport: expected a comma-separated list of rdma, shm, tcp (each "
            "once), got '%s'\n",
            s);
    return -1;
}

/* Returns 0 to run, 1 to exit 0 (--help), -1 on a usage error. */
static int parse_args(int argc, char **argv, wk_config_t *cfg)
{
    int c;
    uint64_t v;
    /* shape fields given one by one override the preset, whatever the order on the line */
    uint64_t shape_v[5];
    int shape_set[5] = {0};
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
        const char *name = optind > 0 && optind <= argc ? argv[optind - 1] : "?";
        switch (c) {
        case OPT_MODE:
            if (strcmp(optarg, "prefill") == 0)
                cfg->mode = WK_MODE_PREFILL;
            else if (strcmp(optarg, "decode") == 0)
                cfg->mode = WK_MODE_DECODE;
            else if (strcmp(optarg, "regular") == 0)
                cfg->mode = WK_MODE_REGULAR;
            else {
                fprintf(stderr,
                        "baton-worker: --mode: expected prefill, decode or regular, got "
                        "'%s'\n",
                        optarg);
                return -1;
            }
            break;
        case OPT_HOST:
            if (optarg[0] == '\0') {
                fprintf(stderr, "baton-worker: --host: empty\n");
                return -1;
            }
            cfg->host = optarg;
            break;
        case OPT_PORT:
            if (parse_u64("--port", optarg, 0, 65535, &v))
                return -1;
            cfg->port = (int)v;
            break;
        case OPT_BOOT_PORT:
            if (parse_u64("--bootstrap-port", optarg, 0, 65535, &v))
                return -1;
            cfg->bootstrap_port = (int)v;
            break;
        case OPT_MODEL:
            if (optarg[0] == '\0' || strlen(optarg) > 200) {
                fprintf(stderr, "baton-worker: --model-name: 1 to 200 characters\n");
                return -1;
            }
            cfg->model_name = optarg;
            break;
        case OPT_PREFILL_US:
            if (parse_u64("--prefill-us-per-token", optarg, 0, 10000000,
                          &cfg->prefill_us_per_token))
                return -1;
            break;
        case OPT_DECODE_US:
            if (parse_u64("--decode-us-per-token", optarg, 0, 60000000, &cfg->decode_us_per_token))
                return -1;
            break;
        case OPT_MAX_BATCH:
            if (parse_u64("--max-batch", optarg, 1, 65536, &v))
                return -1;
            cfg->max_batch = (unsigned)v;
            break;
        case OPT_MAX_QUEUE:
            if (parse_u64("--max-queue", optarg, 1, 10000000, &v))
                return -1;
            cfg->max_queue = (unsigned)v;
            break;
        case OPT_BOOT_TIMEOUT:
            if (parse_u64("--bootstrap-timeout-ms", optarg, 1, 86400000ULL,
                          &cfg->bootstrap_timeout_ms))
                return -1;
            break;
        case OPT_LOG_LEVEL: {
            baton_log_level_t lvl;
            if (baton_log_parse_level(optarg, &lvl) != 0) {
                fprintf(stderr, "baton-worker: --log-level: expected debug, info, warn or error\n");
                return -1;
            }
            baton_log_set_level(lvl);
            break;
        }
        case OPT_PRESET:
            if (wk_kvshape_preset(optarg, &cfg->shape) != 0) {
                fprintf(stderr, "baton-worker: --model-preset: expected one of %s, got '%s'\n",
                        wk_kvshape_preset_names(), optarg);
                return -1;
            }
            cfg->preset = optarg;
            break;
        case OPT_LAYERS:
        case OPT_KV_HEADS:
        case OPT_HEAD_DIM:
        case OPT_DTYPE_BYTES:
        case OPT_PAGE_TOKENS: {
            static const char *const names[] = {"--layers", "--kv-heads", "--head-dim",
                                                "--dtype-bytes", "--page-tokens"};
            static const uint64_t max[] = {WK_KV_MAX_LAYERS, WK_KV_MAX_HEADS, WK_KV_MAX_HEAD_DIM,
                                           WK_KV_MAX_DTYPE_BYTES, WK_KV_MAX_PAGE_TOKENS};
            int k = c - OPT_LAYERS;
            if (parse_u64(names[k], optarg, 1, max[k], &shape_v[k]))
                return -1;
            shape_set[k] = 1;
            break;
        }
        case OPT_POOL_TOKENS:
            if (parse_u64("--kv-pool-tokens", optarg, 0, 1ull << 32, &cfg->kv_pool_tokens))
                return -1;
            break;
        case OPT_TRANSPORT:
            if (parse_transports(optarg, cfg) != 0)
                return -1;
            break;
        case OPT_LAYERWISE:
            if (strcmp(optarg, "on") == 0 || strcmp(optarg, "1") == 0)
                cfg->layerwise = 1;
            else if (strcmp(optarg, "off") == 0 || strcmp(optarg, "0") == 0)
                cfg->layerwise = 0;
            else {
                fprintf(stderr, "baton-worker: --layerwise: expected on or off, got '%s'\n",
                        optarg);
                return -1;
            }
            break;
        case OPT_FAULT_CORRUPT:
            if (parse_u64("--fault-corrupt-kv-every", optarg, 0, UINT32_MAX, &v))
                return -1;
            cfg->fault_corrupt_kv_every = (uint32_t)v;
            break;
        case OPT_KV_SECRET_FILE: /* read when the KV engine starts (kvxfer.c) */
            cfg->kv_secret_file = optarg;
            break;
        case 'h':
            usage(stdout);
            return 1;
        case ':':
            fprintf(stderr, "baton-worker: %s needs a value\n", name);
            return -1;
        default:
            fprintf(stderr, "baton-worker: unknown option '%s' (see --help)\n", name);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "baton-worker: unexpected argument '%s' (see --help)\n", argv[optind]);
        return -1;
    }
    uint32_t *fields[5] = {&cfg->shape.layers, &cfg->shape.kv_heads, &cfg->shape.head_dim,
                           &cfg->shape.dtype_bytes, &cfg->shape.page_tokens};
    for (int k = 0; k < 5; k++) {
        if (shape_set[k]) {
            *fields[k] = (uint32_t)shape_v[k];
            cfg->preset = NULL; /* a custom shape now */
        }
    }
    const char *why = NULL;
    if (wk_kvshape_check(&cfg->shape, &why) != 0) {
        fprintf(stderr, "baton-worker: model shape: %s\n", why);
        return -1;
    }
    if (cfg->kv_pool_tokens != 0 && cfg->kv_pool_tokens < cfg->shape.page_tokens) {
        fprintf(stderr, "baton-worker: --kv-pool-tokens: at least one page (%u tokens)\n",
                cfg->shape.page_tokens);
        return -1;
    }
    return 0;
}

static wk_worker_t worker;
static uv_signal_t sig_term, sig_int;
static uv_timer_t hard_stop;

static void on_worker_closed(wk_worker_t *w)
{
    uv_close((uv_handle_t *)&sig_term, NULL);
    uv_close((uv_handle_t *)&sig_int, NULL);
    uv_close((uv_handle_t *)&hard_stop, NULL);
}

static void hard_stop_cb(uv_timer_t *t)
{
    log_warn(COMP, "shutdown_slow exiting_anyway=1");
    exit(0);
}

static void on_signal(uv_signal_t *h, int signum)
{
    if (worker.shutting_down) {
        log_warn(COMP, "second_signal signal=%d exiting_now=1", signum);
        exit(0);
    }
    log_info(COMP, "signal signal=%s", signum == SIGTERM ? "SIGTERM" : "SIGINT");
    /* a stuck close must not keep the process alive; the timer itself holds nothing open */
    uv_timer_start(&hard_stop, hard_stop_cb, 5000, 0);
    uv_unref((uv_handle_t *)&hard_stop);
    wk_worker_shutdown(&worker, on_worker_closed);
}

int main(int argc, char **argv)
{
    wk_config_t cfg;
    wk_config_default(&cfg);
    int rc = parse_args(argc, argv, &cfg);
    if (rc != 0) {
        if (rc < 0)
            usage(stderr);
        return rc > 0 ? 0 : 2;
    }
    signal(SIGPIPE, SIG_IGN);
    uv_loop_t *loop = uv_default_loop();
    uv_signal_init(loop, &sig_term);
    uv_signal_init(loop, &sig_int);
    uv_timer_init(loop, &hard_stop);
    uv_signal_start(&sig_term, on_signal, SIGTERM);
    uv_signal_start(&sig_int, on_signal, SIGINT);
    rc = wk_worker_start(&worker, loop, &cfg);
    if (rc != 0) {
        log_error(COMP, "exiting err=%s", baton_strerror(rc));
        return 1;
    }
    uv_run(loop, UV_RUN_DEFAULT);
    uv_loop_close(loop);
    return 0;
}
