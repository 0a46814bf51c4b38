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

static const baton_worker_role_t roles[3] = {BATON_ROLE_PREFILL, BATON_ROLE_DECODE,
                                             BATON_ROLE_REGULAR};

/* One family with a sample per role: HELP, TYPE, then role="prefill|decode|regular" lines. */
static int role_family(baton_buf_t *out, const char *name, const char *type, const char *help,
                       const uint64_t v[3])
{
    int rc = line(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    for (int i = 0; i < 3; i++)
        rc |= line(out, "%s{role=\"%s\"} %" PRIu64 "\n", name, baton_worker_role_name(roles[i]),
                   v[i]);
    return rc;
}
#define ROLE_FAMILY(name, type, help, field)                                                       \
    role_family(out, name, type, help, (const uint64_t[3]){st[0].field, st[1].field, st[2].field})

int baton_policy_metrics_append(baton_router_t *r, baton_buf_t *out)
{
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
    rc |= ROLE_FAMILY("baton_routing_predicted_hit_tokens_total", "counter",
                      "Prompt words cache_aware's "
                      "trees (tokens precise's index) matched on the chosen worker.",
                      predicted_hit_words);
    rc |= ROLE_FAMILY("baton_routing_prompt_tokens_total", "counter",
                      "Prompt words cache_aware routed.", prompt_words);
    rc |= ROLE_FAMILY("baton_routing_tree_bytes", "gauge", "Memory of cache_aware's prefix trees.",
                      tree_bytes);
    rc |= ROLE_FAMILY("baton_routing_tree_blocks", "gauge", "Prefix names in cache_aware's trees.",
                      tree_names);
    rc |= ROLE_FAMILY("baton_routing_precise_fallback_total", "counter",
                      "Requests the precise policy "
                      "chose by load for want of token ids or of a KV-event index.",
                      precise_fallbacks);
    rc |= ROLE_FAMILY("baton_routing_precise_provisional_total", "counter",
                      "Choices of the precise policy "
                      "that provisional entries (blocks routed, not yet confirmed) decided.",
                      precise_provisional_hits);
    rc |= ROLE_FAMILY("baton_routing_precise_l3_credited_total", "counter",
                      "Choices of the precise policy "
                      "whose worker was credited blocks the KV store holds (L3).",
                      precise_l3_credited);
    rc |= ROLE_FAMILY("baton_routing_precise_l3_tokens_total", "counter",
                      "Prompt tokens the precise policy "
                      "credited as reachable in the KV store (L3) on the chosen worker.",
                      precise_l3_tokens);
    return rc ? BATON_ENOMEM : 0;
}
