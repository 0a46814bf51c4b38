/* tier_opts.h — HiCache's command-line options for main.c: the long-option table entries,
 * parsing, checks and help text. */
#ifndef BATON_WORKER_TIER_OPTS_H
#define BATON_WORKER_TIER_OPTS_H

#include "worker/tier.h"

enum {
    WK_TIER_OPT_BASE = 0x1000,
    WK_TIER_OPT_L2_BYTES = WK_TIER_OPT_BASE,
    WK_TIER_OPT_STORE_MASTER,
    WK_TIER_OPT_STORE_REGISTRY,
    WK_TIER_OPT_STORE_NS,
    WK_TIER_OPT_TP_RANK,
    WK_TIER_OPT_WRITE_POLICY,
    WK_TIER_OPT_PREFETCH_POLICY,
    WK_TIER_OPT_MIN_TOKENS,
    WK_TIER_OPT_TIMEOUT_BASE,
    WK_TIER_OPT_TIMEOUT_PER_KI,
    WK_TIER_OPT_TIMEOUT_MAX,
    WK_TIER_OPT_DECODE_OFFLOAD,
    WK_TIER_OPT_END
};

/* Entries of main.c's struct option table. */
/* clang-format off */
#define WK_TIER_LONG_OPTS                                                                          \
    {"l2-bytes", required_argument, NULL, WK_TIER_OPT_L2_BYTES},                                   \
    {"store-master", required_argument, NULL, WK_TIER_OPT_STORE_MASTER},                           \
    {"store-registry", required_argument, NULL, WK_TIER_OPT_STORE_REGISTRY},                       \
    {"store-namespace", required_argument, NULL, WK_TIER_OPT_STORE_NS},                            \
    {"tp-rank", required_argument, NULL, WK_TIER_OPT_TP_RANK},                                     \
    {"hicache-write-policy", required_argument, NULL, WK_TIER_OPT_WRITE_POLICY},                   \
    {"hicache-storage-prefetch-policy", required_argument, NULL, WK_TIER_OPT_PREFETCH_POLICY},      \
    {"prefetch-min-tokens", required_argument, NULL, WK_TIER_OPT_MIN_TOKENS},                      \
    {"prefetch-timeout-base-ms", required_argument, NULL, WK_TIER_OPT_TIMEOUT_BASE},               \
    {"prefetch-timeout-per-ki-ms", required_argument, NULL, WK_TIER_OPT_TIMEOUT_PER_KI},           \
    {"prefetch-timeout-max-ms", required_argument, NULL, WK_TIER_OPT_TIMEOUT_MAX},                 \
    {"disaggregation-decode-enable-offload-kvcache", no_argument, NULL,                            \
     WK_TIER_OPT_DECODE_OFFLOAD}
/* clang-format on */

void wk_tier_cfg_default(wk_tier_cfg_t *c);
/* One option (opt in [WK_TIER_OPT_BASE, WK_TIER_OPT_END)); `name` for the error line. 0 or -1
 * (a line on stderr said why). */
int wk_tier_opt(int opt, const char *name, const char *val, wk_tier_cfg_t *c);
/* After every option: 0 or -1 (a line said why). */
int wk_tier_cfg_check(const wk_tier_cfg_t *c, const char *model_name);
const char *wk_tier_usage(void);

#endif
