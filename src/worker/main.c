/* main.c — baton-worker's command line, signals and event loop. */
#include <errno.h>
#include <jansson.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "baton/error.h"
#include "common/fd_limit.h"
#include "common/log.h"
#include "worker/drain.h"
#include "worker/kvev.h"
#include "worker/register.h"
#include "http/tls.h"
#include "worker/vllm.h"
#include "worker/worker.h"
#include "worker/wtok.h"

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
            "  --tokenizer DIR|FILE         the model's Hugging Face tokenizer.json (a directory\n"
            "                               with it and tokenizer_config.json, or the file):\n"
            "                               prompts are counted in its tokens and chat messages\n"
            "                               rendered with its chat template (docs/TOKENIZER.md);\n"
            "                               without it, a word is a token\n"
            "  --prefill-us-per-token US    prefill cost per prompt token (default %llu)\n"
            "  --decode-us-per-token US     cost of one decode step (default %llu)\n"
            "  --max-batch N                running sequences at most (default %u)\n"
            "  --max-queue N                waiting sequences at most; more get 503 (default %u)\n"
            "  --max-body-bytes N           request body at most; larger get 413 (default 64 MiB)\n"
            "  --max-buffered-bytes N       request bodies being read plus answers queued to\n"
            "                               clients; bodies past it wait (default 256 MiB)\n"
            "  --max-connections N          HTTP connections at once; more get 503 (default 4096)\n"
            "  --bootstrap-timeout-ms MS    rendezvous deadline on both sides (default %llu)\n"
            "  --drain-timeout-ms MS        SIGTERM: time in-flight requests get to finish; new\n"
            "                               ones are refused, then exit 0 (default %llu)\n"
            "  --log-level LEVEL            debug | info | warn | error (default info)\n"
            "  --tls-cert FILE              serve HTTPS: certificate chain (PEM, leaf first)\n"
            "  --tls-key FILE               its private key (PEM); both reloaded on SIGHUP\n"
            "  --tls-client-ca FILE         require client certificates from this CA (mTLS)\n"
            "  --cache-tokens N             prefix cache capacity in tokens, every mode; 0 = off\n"
            "                               (default %llu)\n"
            "  --kv-events-endpoint EP      publish the prefix cache's pages as vLLM KV events\n"
            "                               on this ZMQ PUB endpoint (bound; tcp://H:P)\n"
            "  --kv-events-replay-endpoint EP  and answer replays on this ROUTER endpoint\n"
            "  -h, --help                   this text\n"
            "  --version                    print the version and exit\n"
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
            "\n"
            "Shared registry (several routers over etcd):\n"
            "  --register URL               etcd://host:port[,host:port...]/prefix (etcds://...\n"
            "                               for TLS): register this worker there on a lease\n"
            "                               (routers watching the prefix add it; it goes when\n"
            "                               the worker stops or dies)\n"
            "  --register-ttl S             lease TTL in seconds (default 5)\n"
            "  --register-url URL           how routers reach this worker (default\n"
            "                               http://HOST:PORT)\n"
            "  --register-user NAME         etcd user (authentication)\n"
            "  --register-password-file F   file holding that user's password\n"
            "  --register-ca FILE           etcds://: CA bundle etcd's certificate is verified\n"
            "                               against (default: the system bundle)\n"
            "  --register-cert FILE         etcds://: client certificate for etcd's\n"
            "  --register-key FILE          --client-cert-auth, and its key (SIGHUP reloads)\n"
            "\n"
            "vLLM PD protocols (docs/PROTOCOLS.md):\n"
            "  --protocol P                 sglang | vllm-nixl | vllm-mooncake: the PD fields\n"
            "                               accepted and returned (default sglang)\n"
            "  --kv-lease-ms MS             vllm-nixl: vLLM's kv_lease_duration. The prefill\n"
            "                               holds a sequence's KV this long after its answer;\n"
            "                               the decode's heartbeats (every MS/6 while it waits\n"
            "                               for the KV) extend it to 2/3 MS from then\n"
            "                               (default %llu; also --kv-hold-timeout-ms)\n"
            "\n"
            "KV bootstrap authentication (docs/SECURITY.md):\n"
            "  --kv-secret-file FILE        shared secret of the engines allowed to exchange KV\n"
            "                               (16..1024 bytes; one trailing newline ignored):\n"
            "                               HMAC challenge-response before any KV handshake\n"
            "                               (default: none; logged, a warning beyond loopback).\n"
            "                               Read at start in every mode: unreadable is an error\n"
            "  --kv-max-pending N           prefill: KV connections not through their handshake\n"
            "                               held at once; more are closed (default 512)\n"
            "  --kv-max-pending-per-addr N  the same, per peer address (default 64)\n"
            "  --kv-pending-buffer-bytes N  prefill: read buffers of those connections together\n"
            "                               (default 8388608)\n",
            wk_mode_name(d.mode), d.host, d.port, d.bootstrap_port, d.model_name,
            (unsigned long long)d.prefill_us_per_token, (unsigned long long)d.decode_us_per_token,
            d.max_batch, d.max_queue, (unsigned long long)d.bootstrap_timeout_ms,
            (unsigned long long)d.drain_timeout_ms, (unsigned long long)d.cache_tokens,
            wk_kvshape_preset_names(), WK_KV_DEFAULT_PRESET,
            (unsigned long long)WK_KV_AUTO_POOL_TOKENS,
            (unsigned long long)(WK_KV_AUTO_POOL_BYTES >> 20),
            (unsigned long long)d.kv_hold_timeout_ms);
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
    OPT_TOKENIZER,
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
    OPT_VERSION,
    /* --register */
    OPT_REGISTER,
    OPT_REGISTER_TTL,
    OPT_REGISTER_URL,
    OPT_REGISTER_USER,
    OPT_REGISTER_PASSWORD_FILE,
    OPT_REGISTER_CA,
    OPT_REGISTER_CERT,
    OPT_REGISTER_KEY,
    OPT_TLS_CERT,
    OPT_TLS_KEY,
    OPT_TLS_CLIENT_CA,
    OPT_CACHE_TOKENS,
    OPT_KV_EVENTS,
    OPT_KV_EVENTS_REPLAY,
    OPT_PROTOCOL, /* vLLM PD protocols */
    OPT_HOLD_TIMEOUT,
    OPT_KV_SECRET_FILE, /* KV bootstrap authentication */
    OPT_KV_MAX_PENDING, /* the KV listener's bounds before a handshake ends */
    OPT_KV_MAX_PENDING_ADDR,
    OPT_KV_PENDING_BYTES,
    OPT_MAX_BODY_BYTES, /* the HTTP port's bounds */
    OPT_MAX_BUFFERED_BYTES,
    OPT_MAX_CONNECTIONS,
    OPT_DRAIN_TIMEOUT,
};

/* --tokenizer: loaded once by main() before the worker starts (worker/wtok.h). */
static const char *tokenizer_path;

/* --register: kept here, not in wk_config_t, since only main() uses them. */
static const char *register_etcd;
static const char *register_url;
static unsigned register_ttl_s = 5;
static const char *register_user;
static const char *register_password_file;
static baton_tls_opts_t register_tls_opts; /* etcds:// only */
static baton_tls_t *register_tls;

static const struct option long_opts[] = {
    {"mode", required_argument, NULL, OPT_MODE},
    {"host", required_argument, NULL, OPT_HOST},
    {"port", required_argument, NULL, OPT_PORT},
    {"bootstrap-port", required_argument, NULL, OPT_BOOT_PORT},
    {"model-name", required_argument, NULL, OPT_MODEL},
    {"tokenizer", required_argument, NULL, OPT_TOKENIZER},
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
    {"cache-tokens", required_argument, NULL, OPT_CACHE_TOKENS},
    {"kv-events-endpoint", required_argument, NULL, OPT_KV_EVENTS},
    {"kv-events-replay-endpoint", required_argument, NULL, OPT_KV_EVENTS_REPLAY},
    /* tests only, not in --help (docs/WORKER.md): corrupt one KV byte of every Nth room */
    {"fault-corrupt-kv-every", required_argument, NULL, OPT_FAULT_CORRUPT},
    {"register", required_argument, NULL, OPT_REGISTER},
    {"register-ttl", required_argument, NULL, OPT_REGISTER_TTL},
    {"register-url", required_argument, NULL, OPT_REGISTER_URL},
    {"register-user", required_argument, NULL, OPT_REGISTER_USER},
    {"register-password-file", required_argument, NULL, OPT_REGISTER_PASSWORD_FILE},
    {"register-ca", required_argument, NULL, OPT_REGISTER_CA},
    {"register-cert", required_argument, NULL, OPT_REGISTER_CERT},
    {"register-key", required_argument, NULL, OPT_REGISTER_KEY},
    {"tls-cert", required_argument, NULL, OPT_TLS_CERT},
    {"tls-key", required_argument, NULL, OPT_TLS_KEY},
    {"tls-client-ca", required_argument, NULL, OPT_TLS_CLIENT_CA},
    {"protocol", required_argument, NULL, OPT_PROTOCOL},
    {"kv-lease-ms", required_argument, NULL, OPT_HOLD_TIMEOUT},
    {"kv-hold-timeout-ms", required_argument, NULL, OPT_HOLD_TIMEOUT}, /* its older name */
    {"kv-secret-file", required_argument, NULL, OPT_KV_SECRET_FILE},   /* KV bootstrap auth */
    {"kv-max-pending", required_argument, NULL, OPT_KV_MAX_PENDING},
    {"kv-max-pending-per-addr", required_argument, NULL, OPT_KV_MAX_PENDING_ADDR},
    {"kv-pending-buffer-bytes", required_argument, NULL, OPT_KV_PENDING_BYTES},
    {"max-body-bytes", required_argument, NULL, OPT_MAX_BODY_BYTES},
    {"max-buffered-bytes", required_argument, NULL, OPT_MAX_BUFFERED_BYTES},
    {"max-connections", required_argument, NULL, OPT_MAX_CONNECTIONS},
    {"drain-timeout-ms", required_argument, NULL, OPT_DRAIN_TIMEOUT},
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, OPT_VERSION},
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

/* TLS files from the command line (the configuration is built from them in main). */
static baton_tls_opts_t tls_opts;

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
        case OPT_TOKENIZER:
            if (optarg[0] == '\0') {
                fprintf(stderr, "baton-worker: --tokenizer: empty\n");
                return -1;
            }
            tokenizer_path = optarg;
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
        case OPT_PROTOCOL: {
            wk_proto_t p;
            if (wk_proto_parse(optarg, &p) != 0) {
                fprintf(stderr,
                        "baton-worker: --protocol: expected sglang, vllm-nixl or vllm-mooncake, "
                        "got '%s'\n",
                        optarg);
                return -1;
            }
            cfg->protocol = (int)p;
            break;
        }
        case OPT_HOLD_TIMEOUT:
            if (parse_u64(name, optarg, 1, 86400000ULL, &cfg->kv_hold_timeout_ms))
                return -1;
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
        case OPT_CACHE_TOKENS:
            if (parse_u64("--cache-tokens", optarg, 0, 1ull << 32, &cfg->cache_tokens))
                return -1;
            break;
        case OPT_KV_EVENTS:
            cfg->kv_events_endpoint = optarg;
            break;
        case OPT_KV_EVENTS_REPLAY:
            cfg->kv_events_replay_endpoint = optarg;
            break;
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
        case OPT_REGISTER:
            register_etcd = optarg;
            break;
        case OPT_REGISTER_TTL:
            if (parse_u64("--register-ttl", optarg, 2, 3600, &v))
                return -1;
            register_ttl_s = (unsigned)v;
            break;
        case OPT_REGISTER_URL:
            register_url = optarg;
            break;
        case OPT_REGISTER_USER:
            register_user = optarg;
            break;
        case OPT_REGISTER_PASSWORD_FILE:
            register_password_file = optarg;
            break;
        case OPT_REGISTER_CA:
            register_tls_opts.ca_file = optarg;
            break;
        case OPT_REGISTER_CERT:
            register_tls_opts.cert_file = optarg;
            break;
        case OPT_REGISTER_KEY:
            register_tls_opts.key_file = optarg;
            break;
        case OPT_TLS_CERT:
            tls_opts.cert_file = optarg;
            break;
        case OPT_TLS_KEY:
            tls_opts.key_file = optarg;
            break;
        case OPT_TLS_CLIENT_CA:
            tls_opts.ca_file = optarg;
            break;
        case OPT_KV_SECRET_FILE: /* read when the worker starts, in every mode (worker.c) */
            cfg->kv_secret_file = optarg;
            break;
        case OPT_KV_MAX_PENDING:
            if (parse_u64("--kv-max-pending", optarg, 1, 1000000, &v))
                return -1;
            cfg->kv_max_pending = (uint32_t)v;
            break;
        case OPT_KV_MAX_PENDING_ADDR:
            if (parse_u64("--kv-max-pending-per-addr", optarg, 1, 1000000, &v))
                return -1;
            cfg->kv_max_pending_per_addr = (uint32_t)v;
            break;
        case OPT_MAX_BODY_BYTES:
            if (parse_u64("--max-body-bytes", optarg, 1024, 1ULL << 40, &cfg->max_body_bytes))
                return -1;
            break;
        case OPT_MAX_BUFFERED_BYTES:
            if (parse_u64("--max-buffered-bytes", optarg, 1ULL << 20, 1ULL << 42,
                          &cfg->max_buffered_bytes))
                return -1;
            break;
        case OPT_MAX_CONNECTIONS:
            if (parse_u64("--max-connections", optarg, 1, 1000000, &v))
                return -1;
            cfg->max_connections = (unsigned)v;
            break;
        case OPT_DRAIN_TIMEOUT:
            if (parse_u64("--drain-timeout-ms", optarg, 0, 86400000ULL, &cfg->drain_timeout_ms))
                return -1;
            break;
        case OPT_KV_PENDING_BYTES:
            if (parse_u64("--kv-pending-buffer-bytes", optarg, 65536, 1ULL << 40,
                          &cfg->kv_pending_buffer_bytes))
                return -1;
            break;
        case 'h':
            usage(stdout);
            return 1;
        case OPT_VERSION:
            printf("baton-worker %s\n", BATON_VERSION_TEXT);
            return 1;
        case ':':
            fprintf(stderr, "baton-worker: %s needs a value (see --help)\n", name);
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
static uv_signal_t sig_term, sig_int, sig_hup;
static uv_timer_t hard_stop;
static wk_drain_t drain;
/* After the drain (its deadline and flush included), a close that does not end must not keep
 * the process alive. */
#define CLOSE_GRACE_MS 5000
static wk_register_t *registration;

/* The router's POST /workers body for this worker, and the key name it goes under. */
static int start_registration(uv_loop_t *loop, const wk_config_t *cfg)
{
    char url[300], err[256] = "";
    if (register_url != NULL)
        snprintf(url, sizeof(url), "%s", register_url);
    else if (strchr(cfg->host, ':') != NULL)
        snprintf(url, sizeof(url), "http://[%s]:%d", cfg->host, worker.http_port);
    else
        snprintf(url, sizeof(url), "http://%s:%d", cfg->host, worker.http_port);
    json_t *boot = cfg->mode == WK_MODE_PREFILL && worker.kv
                       ? json_integer(wk_kv_listen_port(worker.kv))
                       : json_null();
    json_t *j =
        json_pack("{s:s, s:s, s:o, s:s}", "url", url, "worker_type", wk_mode_name(cfg->mode),
                  "bootstrap_port", boot, "model_id", cfg->model_name);
    /* KV-event endpoints as the router connects to them: as bound (a wildcard port resolved),
     * a wildcard address named by this worker's host. */
    const char *kv_keys[2] = {"kv_events_endpoint", "kv_events_replay_endpoint"};
    for (int k = 0; j && worker.kvev && k < 2; k++) {
        const char *bound = wk_kvev_endpoint(worker.kvev, k);
        if (!bound[0])
            continue;
        char ep[300];
        const char *port = NULL;
        if (strncmp(bound, "tcp://0.0.0.0:", 14) == 0)
            port = bound + 14;
        else if (strncmp(bound, "tcp://[::]:", 11) == 0)
            port = bound + 11;
        if (port)
            snprintf(ep, sizeof(ep), strchr(cfg->host, ':') ? "tcp://[%s]:%s" : "tcp://%s:%s",
                     cfg->host, port);
        else
            snprintf(ep, sizeof(ep), "%s", bound);
        json_object_set_new(j, kv_keys[k], json_string(ep));
    }
    char *value = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    if (value == NULL)
        return BATON_ENOMEM;
    /* One key per worker URL: the URL without its scheme, '/' made safe. */
    char name[300];
    snprintf(name, sizeof(name), "%s", url + strlen("http://"));
    for (char *p = name; *p; p++)
        if (*p == '/')
            *p = '_';
    char password[256] = "";
    if (register_password_file != NULL) {
        FILE *f = fopen(register_password_file, "r");
        const char *why = f == NULL ? strerror(errno) : "empty file";
        int ok = f != NULL && fgets(password, sizeof(password), f) != NULL;
        if (f)
            fclose(f);
        if (!ok) {
            free(value);
            log_error(COMP, "register_failed reason=\"cannot read %s: %s\"", register_password_file,
                      why);
            return BATON_EINVAL;
        }
        password[strcspn(password, "\r\n")] = '\0';
    }
    int rc = wk_register_start(&registration, loop, register_etcd, register_user, password,
                               register_tls, register_ttl_s, name, value, err, sizeof(err));
    free(value);
    if (rc != 0)
        log_error(COMP, "register_failed reason=\"%s\"", err[0] ? err : baton_strerror(rc));
    return rc;
}

static void on_worker_closed(wk_worker_t *w)
{
    uv_close((uv_handle_t *)&sig_term, NULL);
    uv_close((uv_handle_t *)&sig_int, NULL);
    uv_close((uv_handle_t *)&sig_hup, NULL);
    uv_close((uv_handle_t *)&hard_stop, NULL);
}

static void hard_stop_cb(uv_timer_t *t)
{
    log_warn(COMP, "shutdown_slow exiting_anyway=1");
    exit(0);
}

static void on_signal(uv_signal_t *h, int signum)
{
    const wk_config_t *cfg = h->data;
    const char *name = signum == SIGTERM ? "SIGTERM" : "SIGINT";
    if (worker.shutting_down) {
        log_warn(COMP, "signal signal=%s action=exit_now", name);
        exit(0);
    }
    if (worker.draining) {
        /* Another signal: do not wait for the rest of the drain. */
        log_info(COMP, "signal signal=%s action=stop_now", name);
        wk_drain_hurry(&drain);
        return;
    }
    log_info(COMP, "shutdown signal=%s drain_timeout_ms=%llu in_flight=%u", name,
             (unsigned long long)cfg->drain_timeout_ms, worker.n_jobs);
    /* the timer itself holds nothing open */
    uv_timer_start(&hard_stop, hard_stop_cb,
                   cfg->drain_timeout_ms + WK_DRAIN_FLUSH_MS + CLOSE_GRACE_MS, 0);
    uv_unref((uv_handle_t *)&hard_stop);
    /* Routers watching the registry stop sending here while the requests in flight finish. */
    wk_register_stop(registration, NULL, NULL);
    registration = NULL;
    int rc = wk_drain_start(&drain, &worker, cfg->drain_timeout_ms, on_worker_closed);
    if (rc != 0) {
        log_error(COMP, "drain_failed err=%s action=stop_now", baton_strerror(rc));
        wk_worker_shutdown(&worker, on_worker_closed);
    }
}

/* SIGHUP: certificates and keys from the same files (the HTTP port's, and etcd's for
 * --register etcds://); open connections keep theirs. */
static void on_sighup(uv_signal_t *h, int signum)
{
    (void)signum;
    wk_config_t *cfg = h->data;
    baton_tls_t *cfgs[2] = {cfg->tls, register_tls};
    const char *names[2] = {"http", "register"};
    if (cfg->tls == NULL && register_tls == NULL) {
        log_info(COMP, "signal signal=SIGHUP action=none (no TLS configured)");
        return;
    }
    for (int i = 0; i < 2; i++) {
        char err[512] = "";
        if (cfgs[i] == NULL)
            continue;
        if (baton_tls_reload(cfgs[i], err, sizeof(err)) == 0)
            log_info(COMP, "tls_reloaded which=%s", names[i]);
        else
            log_error(COMP, "tls_reload_failed which=%s reason=\"%s\" (previous kept)", names[i],
                      err);
    }
}

/* --register etcds://: the client TLS configuration of the registration's etcd connections.
 * The TLS options with a plaintext etcd:// URL are an error, not silently unused. */
static int create_register_tls(void)
{
    const baton_tls_opts_t *o = &register_tls_opts;
    int given = o->ca_file || o->cert_file || o->key_file;
    int tls = register_etcd != NULL && strncmp(register_etcd, "etcds://", 8) == 0;
    char err[512] = "";
    if (given && !tls) {
        fprintf(stderr, "baton-worker: --register-ca/-cert/-key need --register etcds://...\n");
        return -1;
    }
    if (tls && (o->cert_file == NULL) != (o->key_file == NULL)) {
        fprintf(stderr, "baton-worker: --register-cert and --register-key go together\n");
        return -1;
    }
    if (tls && baton_tls_create(&register_tls, BATON_TLS_CLIENT, o, err, sizeof(err)) != 0) {
        fprintf(stderr, "baton-worker: register tls: %s\n", err);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    wk_config_t cfg;
    wk_config_default(&cfg);
    int rc = parse_args(argc, argv, &cfg);
    if (rc != 0) /* a usage error was one line naming the flag; --help has the rest */
        return rc > 0 ? 0 : 2;
    signal(SIGPIPE, SIG_IGN);
    /* Descriptors: the KV bootstrap port and the HTTP port share them; the KV listener caps
     * what it holds for peers not through their handshake (--kv-max-pending). */
    baton_fd_limit_t fl;
    if (baton_fd_limit_raise(&fl) == 0)
        log_info(COMP, "fd_limit soft_before=%llu soft=%llu hard=%llu",
                 (unsigned long long)fl.before, (unsigned long long)fl.soft,
                 (unsigned long long)fl.hard);
    else
        log_warn(COMP, "fd_limit_unknown");
    if (tls_opts.cert_file || tls_opts.key_file || tls_opts.ca_file) {
        char err[512] = "";
        if (baton_tls_create(&cfg.tls, BATON_TLS_SERVER, &tls_opts, err, sizeof(err)) != 0) {
            fprintf(stderr, "baton-worker: tls: %s\n", err);
            return 2;
        }
    }
    if (tokenizer_path) {
        char err[512] = "";
        if (wk_tok_load(tokenizer_path, err, sizeof(err)) != 0) {
            fprintf(stderr, "baton-worker: --tokenizer %s: %s\n", tokenizer_path, err);
            baton_tls_destroy(cfg.tls);
            return 2;
        }
        log_info(COMP, "tokenizer path=%s chat_template=%s", tokenizer_path,
                 wk_tok_has_template() ? "yes" : "no");
    }
    if (create_register_tls() != 0) {
        baton_tls_destroy(cfg.tls);
        return 2;
    }
    uv_loop_t *loop = uv_default_loop();
    uv_signal_init(loop, &sig_term);
    uv_signal_init(loop, &sig_int);
    uv_timer_init(loop, &hard_stop);
    sig_term.data = sig_int.data = &cfg;
    uv_signal_start(&sig_term, on_signal, SIGTERM);
    uv_signal_start(&sig_int, on_signal, SIGINT);
    uv_signal_init(loop, &sig_hup);
    sig_hup.data = &cfg;
    uv_signal_start(&sig_hup, on_sighup, SIGHUP);
    rc = wk_worker_start(&worker, loop, &cfg);
    if (rc != 0) {
        log_error(COMP, "exiting err=%s", baton_strerror(rc));
        return 1;
    }
    if (register_etcd != NULL && start_registration(loop, &cfg) != 0)
        return 2;
    uv_run(loop, UV_RUN_DEFAULT);
    uv_loop_close(loop);
    baton_tls_destroy(cfg.tls);
    baton_tls_destroy(register_tls); /* the registration, its user, ended with the loop */
    wk_tok_unload();
    return 0;
}
