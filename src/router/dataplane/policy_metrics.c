/* policy_metrics.c — what the routing policies show: their /metrics families (choices by rule,
 * predicted hit tokens, tree memory) and each worker's cache fields in /workers. */
#include "router/dataplane/policy_metrics.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "baton/error.h"
#include "common/clock.h"
#include "router/dataplane/policy.h"

json_t *baton_policy_worker_json(const baton_worker_t *w)
{
    /* reported_load: the worker's last /get_load total while it counts (load_poll.h), else
     * null; load: what least_load ranks it by now */
    uint64_t now = baton_now_ms(), until = atomic_load(&w->reported_until_ms);
    json_t *rep =
        until != 0 && now <= until ? json_integer(atomic_load(&w->reported_load)) : json_null();
    return json_pack("{s:I, s:I, s:f, s:o, s:I}", "tree_blocks",
                     (json_int_t)atomic_load(&w->cache_tree_names), "tree_bytes",
                     (json_int_t)atomic_load(&w->cache_tree_bytes), "hit_ratio",
                     atomic_load(&w->cache_hit_ppm) / 1e6, "reported_load", rep, "load",
                     (json_int_t)baton_worker_load(w, now));
}

static int line(baton_buf_t *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int line(baton_buf_t *out, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(buf))
        return BATON_EINVAL;
    return baton_buf_append(out, buf, (size_t)n);
}

int baton_policy_metrics_append(baton_router_t *r, baton_buf_t *out)
{
    static const baton_worker_role_t roles[] = {BATON_ROLE_PREFILL, BATON_ROLE_DECODE,
                                                BATON_ROLE_REGULAR};
    baton_policy_stats_t st[3];
    const char *pol[3];
    for (int i = 0; i < 3; i++) {
        baton_policy_t *p = baton_router_policy(r, roles[i]);
        baton_policy_stats(p, &st[i]);
        pol[i] = baton_policy_name(baton_policy_kind(p));
    }
    int rc = 0;
    rc |= line(out, "# HELP baton_routing_choices_total Workers chosen, by role, policy and the "
                    "rule that chose (cache, load, session, pin, policy).\n"
                    "# TYPE baton_routing_choices_total counter\n");
    for (int i = 0; i < 3; i++)
        for (int c = 0; c < BATON_CHOICE__COUNT; c++)
            rc |= line(out,
                       "baton_routing_choices_total{role=\"%s\",policy=\"%s\",by=\"%s\"} %" PRIu64
                       "\n",
                       baton_worker_role_name(roles[i]), pol[i],
                       baton_choice_name((baton_choice_t)c), st[i].chosen[c]);
    rc |= line(out, "# HELP baton_routing_predicted_hit_tokens_total Prompt words cache_aware's "
                    "trees (tokens precise's index) matched on the chosen worker.\n"
                    "# TYPE baton_routing_predicted_hit_tokens_total counter\n");
    for (int i = 0; i < 3; i++)
        rc |= line(out, "baton_routing_predicted_hit_tokens_total{role=\"%s\"} %" PRIu64 "\n",
                   baton_worker_role_name(roles[i]), st[i].predicted_hit_words);
    rc |= line(out, "# HELP baton_routing_prompt_tokens_total Prompt words cache_aware routed.\n"
                    "# TYPE baton_routing_prompt_tokens_total counter\n");
    for (int i = 0; i < 3; i++)
        rc |= line(out, "baton_routing_prompt_tokens_total{role=\"%s\"} %" PRIu64 "\n",
                   baton_worker_role_name(roles[i]), st[i].prompt_words);
    rc |= line(out, "# HELP baton_routing_tree_bytes Memory of cache_aware's prefix trees.\n"
                    "# TYPE baton_routing_tree_bytes gauge\n");
    for (int i = 0; i < 3; i++)
        rc |= line(out, "baton_routing_tree_bytes{role=\"%s\"} %zu\n",
                   baton_worker_role_name(roles[i]), st[i].tree_bytes);
    rc |= line(out, "# HELP baton_routing_tree_blocks Prefix names in cache_aware's trees.\n"
                    "# TYPE baton_routing_tree_blocks gauge\n");
    for (int i = 0; i < 3; i++)
        rc |= line(out, "baton_routing_tree_blocks{role=\"%s\"} %zu\n",
                   baton_worker_role_name(roles[i]), st[i].tree_names);
    rc |= line(out, "# HELP baton_routing_precise_fallback_total Requests the precise policy "
                    "chose by load for want of token ids or of a KV-event index.\n"
                    "# TYPE baton_routing_precise_fallback_total counter\n");
    for (int i = 0; i < 3; i++)
        rc |= line(out, "baton_routing_precise_fallback_total{role=\"%s\"} %" PRIu64 "\n",
                   baton_worker_role_name(roles[i]), st[i].precise_fallbacks);
    rc |= line(out, "# HELP baton_routing_precise_provisional_total Choices of the precise policy "
                    "that provisional entries (blocks routed, not yet confirmed) decided.\n"
                    "# TYPE baton_routing_precise_provisional_total counter\n");
    for (int i = 0; i < 3; i++)
        rc |= line(out, "baton_routing_precise_provisional_total{role=\"%s\"} %" PRIu64 "\n",
                   baton_worker_role_name(roles[i]), st[i].precise_provisional_hits);
    rc |= line(out, "# HELP baton_routing_precise_l3_credited_total Choices of the precise policy "
                    "whose worker was credited blocks the KV store holds (L3).\n"
                    "# TYPE baton_routing_precise_l3_credited_total counter\n");
    for (int i = 0; i < 3; i++)
        rc |= line(out, "baton_routing_precise_l3_credited_total{role=\"%s\"} %" PRIu64 "\n",
                   baton_worker_role_name(roles[i]), st[i].precise_l3_credited);
    rc |= line(out, "# HELP baton_routing_precise_l3_tokens_total Prompt tokens the precise policy "
                    "credited as reachable in the KV store (L3) on the chosen worker.\n"
                    "# TYPE baton_routing_precise_l3_tokens_total counter\n");
    for (int i = 0; i < 3; i++)
        rc |= line(out, "baton_routing_precise_l3_tokens_total{role=\"%s\"} %" PRIu64 "\n",
                   baton_worker_role_name(roles[i]), st[i].precise_l3_tokens);
    return rc ? BATON_ENOMEM : 0;
}
