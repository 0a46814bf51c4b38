/* policy_metrics.h — the routing policies' /metrics families and /workers cache fields. */
#ifndef BATON_ROUTER_POLICY_METRICS_H
#define BATON_ROUTER_POLICY_METRICS_H

#include <jansson.h>

#include "common/buf.h"
#include "router/dataplane/proxy.h"

/*
 * Families (appended to the router's /metrics; the values are read from the policy objects at
 * scrape time, so the request path only bumps atomics):
 *   baton_routing_choices_total{role,policy,by}      counter  by = cache|load|session|pin|policy
 *   baton_routing_predicted_hit_tokens_total{role}   counter  words cache_aware's trees matched
 *   baton_routing_prompt_tokens_total{role}          counter  words cache_aware routed
 *   baton_routing_tree_bytes{role}, baton_routing_tree_blocks{role}   gauge   tree memory
 * Threading: any thread. 0 or BATON_ENOMEM.
 */
int baton_policy_metrics_append(baton_router_t *r, baton_buf_t *out);

/* {"tree_blocks", "tree_bytes", "hit_ratio"}: the worker's cache_aware fields (registry.h), for
 * /workers. A new reference. */
json_t *baton_policy_worker_json(const baton_worker_t *w);

#endif
