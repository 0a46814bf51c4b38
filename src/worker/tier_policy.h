/* tier_policy.h — HiCache's policies as pure functions of their inputs and a clock the caller
 * passes in: the prefetch timeout rule, when a request may stop waiting for its L3 prefetch, the
 * minimum hit worth fetching, and where a page is written under each write policy. */
#ifndef BATON_WORKER_TIER_POLICY_H
#define BATON_WORKER_TIER_POLICY_H

#include <stdint.h>

typedef enum {
    WK_PF_BEST_EFFORT = 0, /* use what arrived by the scheduler's next step */
    WK_PF_WAIT_COMPLETE,   /* wait for the whole prefetch */
    WK_PF_TIMEOUT,         /* wait for it, at most the timeout rule's time */
} wk_pf_policy_t;

typedef enum {
    WK_WP_WRITE_THROUGH = 0,       /* every computed page to L2 and L3 at once */
    WK_WP_WRITE_THROUGH_SELECTIVE, /* only pages used more than once */
    WK_WP_WRITE_BACK,              /* to L2 at once, to L3 when L2 evicts them */
} wk_wp_policy_t;

/* SGLang's PrefetchTimeoutConfig: base + per_ki × tokens / 1024, at most max (ms here). */
typedef struct {
    uint64_t base_ms;        /* 2000 */
    uint64_t per_ki_ms;      /* 100 */
    uint64_t max_ms;         /* 30000 */
    uint32_t min_hit_tokens; /* 256: a smaller L3 hit is not fetched */
    uint64_t step_ms;        /* best_effort: one scheduler step */
} wk_pf_cfg_t;

void wk_pf_cfg_default(wk_pf_cfg_t *c);
/* Parses "best_effort" etc.; 0 or -1. */
int wk_pf_policy_parse(const char *s, wk_pf_policy_t *out);
int wk_wp_policy_parse(const char *s, wk_wp_policy_t *out);
const char *wk_pf_policy_name(wk_pf_policy_t p);
const char *wk_wp_policy_name(wk_wp_policy_t p);

/* The timeout rule for a prefetch of `tokens` tokens. */
uint64_t wk_pf_timeout_ms(const wk_pf_cfg_t *c, uint64_t tokens);
/* Whether an L3 hit of `tokens` tokens is worth fetching. */
int wk_pf_worth(const wk_pf_cfg_t *c, uint64_t tokens);

/* One prefetch's waiting rule. */
typedef struct {
    wk_pf_policy_t policy;
    uint64_t deadline_ms; /* UINT64_MAX: none */
    uint32_t want_pages;
    uint32_t done_pages; /* arrived and verified, from the first page on */
    int finished;        /* every batch ended (arrived or failed) */
} wk_pf_t;

void wk_pf_start(wk_pf_t *pf, const wk_pf_cfg_t *c, wk_pf_policy_t policy, uint64_t now_ms,
                 uint32_t want_pages, uint32_t page_tokens);
/* Whether the request may go now (with done_pages of its prefetch). */
int wk_pf_may_go(const wk_pf_t *pf, uint64_t now_ms);

/* Write policy: whether a page computed (or fetched) now, used `uses` times so far (1 the first
 * time), goes to L2 now, and to L3 now. Under write_back L3 gets it when L2 evicts it. */
int wk_wp_to_l2(wk_wp_policy_t p, uint32_t uses);
int wk_wp_to_l3(wk_wp_policy_t p, uint32_t uses);
int wk_wp_on_evict(wk_wp_policy_t p);

#endif
