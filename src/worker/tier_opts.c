/* tier_opts.c — HiCache's command-line options: defaults, parsing, the start-up checks and the
 * help text (main.c hands them the options in WK_TIER_LONG_OPTS). */
#include "worker/tier_opts.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/store.h"
#include "worker/tier_key.h"

void wk_tier_cfg_default(wk_tier_cfg_t *c)
{
    memset(c, 0, sizeof(*c));
    c->write_policy = WK_WP_WRITE_THROUGH;
    c->prefetch_policy = WK_PF_BEST_EFFORT;
    wk_pf_cfg_default(&c->pf);
}

/* N with an optional K, M or G (binary) suffix. */
static int parse_size(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    if (*s == '-' || *s == '\0')
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1ull << 10, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1ull << 20, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1ull << 30, end++;
    if (errno || *end != '\0' || v > max / mul)
        return -1;
    *out = v * mul;
    return 0;
}

int wk_tier_opt(int opt, const char *name, const char *val, wk_tier_cfg_t *c)
{
    uint64_t v = 0;
    int bad = 0;
    switch (opt) {
    case WK_TIER_OPT_L2_BYTES:
        bad = parse_size(val, 1ull << 44, &c->l2_bytes);
        break;
    case WK_TIER_OPT_STORE_MASTER:
    case WK_TIER_OPT_STORE_REGISTRY:
        bad = c->store != NULL || *val == '\0' ||
              (opt == WK_TIER_OPT_STORE_REGISTRY && strncmp(val, "etcd://", 7) != 0) ||
              (opt == WK_TIER_OPT_STORE_MASTER && strchr(val, ':') == NULL);
        c->store = val;
        break;
    case WK_TIER_OPT_STORE_NS:
        bad = *val == '\0' || strlen(val) > BATON_STORE_NAMESPACE_MAX;
        c->store_ns = val;
        break;
    case WK_TIER_OPT_TP_RANK:
        bad = parse_size(val, 65535, &v);
        c->tp_rank = (unsigned)v;
        break;
    case WK_TIER_OPT_WRITE_POLICY:
        bad = wk_wp_policy_parse(val, &c->write_policy);
        break;
    case WK_TIER_OPT_PREFETCH_POLICY:
        bad = wk_pf_policy_parse(val, &c->prefetch_policy);
        break;
    case WK_TIER_OPT_MIN_TOKENS:
        bad = parse_size(val, UINT32_MAX, &v);
        c->pf.min_hit_tokens = (uint32_t)v;
        break;
    case WK_TIER_OPT_TIMEOUT_BASE:
        bad = parse_size(val, 3600000, &c->pf.base_ms);
        break;
    case WK_TIER_OPT_TIMEOUT_PER_KI:
        bad = parse_size(val, 3600000, &c->pf.per_ki_ms);
        break;
    case WK_TIER_OPT_TIMEOUT_MAX:
        bad = parse_size(val, 3600000, &c->pf.max_ms);
        break;
    case WK_TIER_OPT_DECODE_OFFLOAD:
        c->decode_offload = 1;
        break;
    default:
        bad = 1;
    }
    if (bad) {
        fprintf(stderr, "baton-worker: %s: bad value '%s' (see --help)\n", name, val);
        return -1;
    }
    return 0;
}

int wk_tier_cfg_check(const wk_tier_cfg_t *c, const char *model_name)
{
    if (c->decode_offload && c->l2_bytes == 0) {
        fprintf(stderr, "baton-worker: --disaggregation-decode-enable-offload-kvcache needs "
                        "--l2-bytes (the pages are offloaded into L2, and from there to L3)\n");
        return -1;
    }
    if (c->store && c->l2_bytes == 0) {
        fprintf(stderr, "baton-worker: --store-master / --store-registry need --l2-bytes (the "
                        "store reads into and writes from L2 pages)\n");
        return -1;
    }
    char name[BATON_STORE_KEY_MAX + 1];
    wk_tier_key_t k;
    memset(k.hex, '0', WK_TIER_KEY_HEX);
    k.hex[WK_TIER_KEY_HEX] = '\0';
    if (c->store && wk_tier_object_name(name, sizeof(name), model_name, &k, c->tp_rank, 'k') < 0) {
        fprintf(stderr,
                "baton-worker: --model-name is too long for the store's object names "
                "(%d bytes at most with the page key)\n",
                BATON_STORE_KEY_MAX);
        return -1;
    }
    return 0;
}

const char *wk_tier_usage(void)
{
    return "\n"
           "HiCache tiers (docs/WORKER.md \"HiCache tiers\"):\n"
           "  --l2-bytes N                 L2 host page pool size (K/M/G suffixes); 0 = off\n"
           "  --store-master H:P           L3: baton-store's master (needs --l2-bytes)\n"
           "  --store-registry URL         L3: etcd://h:p[,h:p]/prefix, the elected master\n"
           "  --store-namespace NS         the store namespace of the pages (default)\n"
           "  --tp-rank N                  tensor-parallel rank in the object names (0)\n"
           "  --hicache-write-policy P     write_through | write_through_selective |\n"
           "                               write_back (default write_through)\n"
           "  --hicache-storage-prefetch-policy P  best_effort | wait_complete | timeout\n"
           "                               (default best_effort)\n"
           "  --prefetch-min-tokens N      smallest L3 hit worth fetching (default 256)\n"
           "  --prefetch-timeout-base-ms MS, --prefetch-timeout-per-ki-ms MS,\n"
           "  --prefetch-timeout-max-ms MS the timeout rule: base + per-ki x tokens / 1024,\n"
           "                               at most max (default 2000, 100, 30000)\n"
           "  --disaggregation-decode-enable-offload-kvcache\n"
           "                               decode: offload every request's KV (prompt and\n"
           "                               generated tokens) to L2 / L3 while it decodes\n";
}
