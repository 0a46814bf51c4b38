/* pdproto.c — the request bodies of vLLM's NIXL and Mooncake PD protocols and SGLang's
 * DP-attention rank and room choice (pure JSON and arithmetic; see pdproto.h). */
#include "router/pdproto.h"

#include <stdio.h>
#include <string.h>

#include "baton/error.h"
#include "router/pdreq.h"

/* Serializes root with `key` set to `val` (stolen), then takes the key out again (or puts the
 * client's own value back) so root stays the client's body. */
static int dump_with(json_t *root, const char *key, json_t *val, baton_buf_t *out)
{
    json_t *old = json_object_get(root, key);
    json_incref(old);
    int rc = val && json_object_set_new(root, key, val) == 0 ? baton_pdreq_dump(root, out)
                                                             : BATON_ENOMEM;
    if (old)
        json_object_set_new(root, key, old);
    else
        json_object_del(root, key);
    return rc;
}

int baton_pdproto_prefill_body(const json_t *root, json_t *kv_transfer_params, baton_buf_t *out)
{
    json_t *c = json_copy((json_t *)root); /* shallow: only top-level keys change */
    int rc = BATON_ENOMEM;
    if (!c || !kv_transfer_params)
        goto out;
    /* The prefill computes the prompt's KV and one token; streaming and minimum lengths would
     * only delay its answer (vLLM's own proxies do the same). */
    json_object_del(c, "stream_options");
    json_object_del(c, "min_tokens");
    json_object_del(c, "min_completion_tokens");
    if (json_object_set_new(c, "stream", json_false()) ||
        json_object_set_new(c, "max_tokens", json_integer(1)) ||
        (json_object_get(c, "max_completion_tokens") &&
         json_object_set_new(c, "max_completion_tokens", json_integer(1))))
        goto out;
    rc = json_object_set(c, "kv_transfer_params", kv_transfer_params) ? BATON_ENOMEM
                                                                      : baton_pdreq_dump(c, out);
out:
    json_decref(kv_transfer_params);
    json_decref(c);
    return rc;
}

int baton_pdproto_nixl_prefill(const json_t *root, baton_buf_t *out)
{
    json_t *ktp =
        json_pack("{s:b, s:b, s:n, s:n, s:n, s:n}", "do_remote_decode", 1, "do_remote_prefill", 0,
                  "remote_engine_id", "remote_block_ids", "remote_host", "remote_port");
    return baton_pdproto_prefill_body(root, ktp, out);
}

int baton_pdproto_nixl_decode(json_t *root, const char *body, size_t len, baton_buf_t *out,
                              char *rid, size_t ridlen, char *why, size_t whylen)
{
    json_error_t jerr;
    json_t *ans = json_loadb(body, len, 0, &jerr);
    json_t *ktp = json_is_object(ans) ? json_object_get(ans, "kv_transfer_params") : NULL;
    if (!json_is_object(ktp)) {
        /* vLLM's decode would log "Got invalid KVTransferParams" and recompute the prompt on
         * its own: a silent cost the operator must see as an error instead. */
        snprintf(why, whylen, "%s",
                 !json_is_object(ans) ? "prefill's answer is not a JSON object"
                 : ktp == NULL        ? "prefill's answer has no kv_transfer_params"
                                      : "prefill's kv_transfer_params is not an object");
        json_decref(ans);
        return BATON_EUPSTREAM;
    }
    const char *r = json_string_value(json_object_get(ktp, "remote_request_id"));
    rid[0] = '\0';
    if (r && strlen(r) < ridlen)
        memcpy(rid, r, strlen(r) + 1);
    int rc = dump_with(root, "kv_transfer_params", json_incref(ktp), out);
    json_decref(ans);
    return rc;
}

int baton_pdproto_mooncake(json_t *root, const char *transfer_id, const char *engine_id,
                           const char *bootstrap_addr, baton_buf_t *prefill_out,
                           baton_buf_t *decode_out)
{
    json_t *pk = json_pack("{s:b, s:b, s:s}", "do_remote_decode", 1, "do_remote_prefill", 0,
                           "transfer_id", transfer_id);
    int rc = baton_pdproto_prefill_body(root, pk, prefill_out);
    if (rc)
        return rc;
    json_t *dk = json_pack("{s:b, s:b, s:s, s:s, s:s}", "do_remote_decode", 0, "do_remote_prefill",
                           1, "transfer_id", transfer_id, "remote_engine_id", engine_id,
                           "remote_bootstrap_addr", bootstrap_addr);
    return dump_with(root, "kv_transfer_params", dk, decode_out);
}

/* ---- SGLang DP attention ---- */

static int gcd(int a, int b)
{
    while (b) {
        int t = a % b;
        a = b;
        b = t;
    }
    return a;
}

int baton_pdproto_dp_decode_rank(int dp_p, int rank_p, int dp_d, unsigned turn)
{
    if (dp_d <= 1)
        return 0;
    if (dp_p <= 1) {
        dp_p = 1;
        rank_p = 0;
    }
    int g = gcd(dp_p, dp_d);
    int n = dp_d / g; /* candidates rank_p % g, + g, + 2g, ... below dp_d */
    return rank_p % g + (int)(turn % (unsigned)n) * g;
}

uint64_t baton_pdproto_dp_room(uint64_t random, int dp_p, int rank_p, int dp_d, int rank_d)
{
    uint64_t mp = dp_p > 1 ? (uint64_t)dp_p : 1, md = dp_d > 1 ? (uint64_t)dp_d : 1;
    uint64_t rp = dp_p > 1 ? (uint64_t)rank_p : 0, rd = dp_d > 1 ? (uint64_t)rank_d : 0;
    uint64_t l = mp / (uint64_t)gcd((int)mp, (int)md) * md; /* <= 2^20: dp sizes <= 1024 */
    /* The residue mod lcm that agrees with both: at most md candidates to try. */
    uint64_t res = rp;
    for (uint64_t k = 0; k < md && res % md != rd; k++)
        res += mp;
    random &= INT64_MAX;
    uint64_t room = random - random % l + res;
    if (room > (uint64_t)INT64_MAX)
        room -= l; /* stays >= 0: random - random % l >= l here */
    return room;
}

int baton_pdproto_dp_body(json_t *root, int routed_rank, int prefill_rank, baton_buf_t *out)
{
    if (json_object_set_new(root, "routed_dp_rank", json_integer(routed_rank)) ||
        (prefill_rank >= 0 &&
         json_object_set_new(root, "disagg_prefill_dp_rank", json_integer(prefill_rank))))
        return BATON_ENOMEM;
    int rc = baton_pdreq_dump(root, out);
    json_object_del(root, "routed_dp_rank");
    json_object_del(root, "disagg_prefill_dp_rank");
    return rc;
}
