/* tier_policy.c — HiCache's prefetch and write policies (see tier_policy.h). */
#include "worker/tier_policy.h"

#include <string.h>

void wk_pf_cfg_default(wk_pf_cfg_t *c)
{
    c->base_ms = 2000;
    c->per_ki_ms = 100;
    c->max_ms = 30000;
    c->min_hit_tokens = 256;
    c->step_ms = 2;
}

static const char *const pf_names[] = {"best_effort", "wait_complete", "timeout"};
static const char *const wp_names[] = {"write_through", "write_through_selective", "write_back"};

int wk_pf_policy_parse(const char *s, wk_pf_policy_t *out)
{
    for (int i = 0; i < 3; i++)
        if (strcmp(s, pf_names[i]) == 0) {
            *out = (wk_pf_policy_t)i;
            return 0;
        }
    return -1;
}

int wk_wp_policy_parse(const char *s, wk_wp_policy_t *out)
{
    for (int i = 0; i < 3; i++)
        if (strcmp(s, wp_names[i]) == 0) {
            *out = (wk_wp_policy_t)i;
            return 0;
        }
    return -1;
}

const char *wk_pf_policy_name(wk_pf_policy_t p)
{
    return (unsigned)p < 3 ? pf_names[p] : "?";
}

const char *wk_wp_policy_name(wk_wp_policy_t p)
{
    return (unsigned)p < 3 ? wp_names[p] : "?";
}

uint64_t wk_pf_timeout_ms(const wk_pf_cfg_t *c, uint64_t tokens)
{
    uint64_t t = c->base_ms + c->per_ki_ms * tokens / 1024;
    return t < c->max_ms ? t : c->max_ms;
}

int wk_pf_worth(const wk_pf_cfg_t *c, uint64_t tokens)
{
    return tokens > 0 && tokens >= c->min_hit_tokens;
}

void wk_pf_start(wk_pf_t *pf, const wk_pf_cfg_t *c, wk_pf_policy_t policy, uint64_t now_ms,
                 uint32_t want_pages, uint32_t page_tokens)
{
    memset(pf, 0, sizeof(*pf));
    pf->policy = policy;
    pf->want_pages = want_pages;
    switch (policy) {
    case WK_PF_BEST_EFFORT:
        pf->deadline_ms = now_ms + c->step_ms;
        break;
    case WK_PF_TIMEOUT:
        pf->deadline_ms = now_ms + wk_pf_timeout_ms(c, (uint64_t)want_pages * page_tokens);
        break;
    default:
        pf->deadline_ms = UINT64_MAX;
    }
}

int wk_pf_may_go(const wk_pf_t *pf, uint64_t now_ms)
{
    return pf->finished || pf->done_pages >= pf->want_pages || now_ms >= pf->deadline_ms;
}

int wk_wp_to_l2(wk_wp_policy_t p, uint32_t uses)
{
    return p != WK_WP_WRITE_THROUGH_SELECTIVE || uses > 1;
}

int wk_wp_to_l3(wk_wp_policy_t p, uint32_t uses)
{
    return p == WK_WP_WRITE_THROUGH || (p == WK_WP_WRITE_THROUGH_SELECTIVE && uses > 1);
}

int wk_wp_on_evict(wk_wp_policy_t p)
{
    return p == WK_WP_WRITE_BACK;
}
