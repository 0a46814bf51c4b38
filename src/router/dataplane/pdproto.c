/* pdproto.c — the request bodies of vLLM's NIXL and Mooncake PD protocols and SGLang's
 * DP-attention rank and room choice (pure JSON and arithmetic; see pdproto.h). */
#include "router/dataplane/pdproto.h"

#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "baton/error.h"

#define DROP_MAX 12

/* out = the client's body without drop[] (nor a client's baton_continuation) plus tail
 * (",\"k\":v,...}"), one copy; `cont`: with r->extra's members before the closing brace (a
 * stream's continuation, migrate.h: decode legs carry it, prefill legs need only the prompt). */
static int splice_into(const baton_pdreq_t *r, const char *const *drop, size_t n_drop,
                       const baton_buf_t *tail, baton_buf_t *out, int cont)
{
    const char *keys[DROP_MAX];
    if (n_drop + 1 > DROP_MAX)
        return BATON_EINVAL;
    memcpy(keys, drop, n_drop * sizeof(*keys));
    keys[n_drop] = "baton_continuation";
    baton_buf_t t = BATON_BUF_INIT;
    const baton_buf_t *use = tail;
    int rc = 0;
    if (cont && r->extra && r->extra->len) {
        rc = baton_buf_append(&t, tail->data, tail->len - 1) ||
                     baton_buf_append(&t, r->extra->data, r->extra->len) ||
                     baton_buf_append(&t, "}", 1)
                 ? BATON_ENOMEM
                 : 0;
        use = &t;
    }
    if (!rc) {
        baton_json_splice_t sp;
        rc = baton_pdreq_splice(r, keys, n_drop + 1, use->data, use->len, &sp);
        if (!rc)
            rc = baton_json_splice_flatten(&sp, out);
        baton_json_splice_free(&sp);
    }
    baton_buf_free(&t);
    return rc;
}

int baton_pdproto_prefill_body(const baton_pdreq_t *r, const char *ktp, size_t len,
                               baton_buf_t *out)
{
    /* The prefill computes the prompt's KV and one token; streaming and minimum lengths would
     * only delay its answer (vLLM's own proxies do the same). */
    static const char *const drop[] = {"stream_options",
                                       "min_tokens",
                                       "min_completion_tokens",
                                       "stream",
                                       "max_tokens",
                                       "max_completion_tokens",
                                       "max_output_tokens",
                                       "kv_transfer_params"};
    baton_buf_t tail = BATON_BUF_INIT;
    /* The Responses API names its limit max_output_tokens (and knows no max_tokens). */
    int rc = baton_buf_append_str(&tail, r->api == BATON_API_RESPONSES
                                             ? ",\"stream\":false,\"max_output_tokens\":1"
                                             : ",\"stream\":false,\"max_tokens\":1");
    if (!rc && baton_json_scan_get(&r->scan, "max_completion_tokens"))
        rc = baton_buf_append_str(&tail, ",\"max_completion_tokens\":1");
    if (!rc)
        rc = baton_buf_append_str(&tail, ",\"kv_transfer_params\":");
    if (!rc)
        rc = baton_buf_append(&tail, ktp, len);
    if (!rc)
        rc = baton_buf_append(&tail, "}", 1);
    if (!rc)
        rc = splice_into(r, drop, sizeof(drop) / sizeof(*drop), &tail, out, 0);
    baton_buf_free(&tail);
    return rc ? BATON_ENOMEM : 0;
}

int baton_pdproto_nixl_prefill(const baton_pdreq_t *r, baton_buf_t *out)
{
    static const char ktp[] =
        "{\"do_remote_decode\":true,\"do_remote_prefill\":false,\"remote_engine_id\":null,"
        "\"remote_block_ids\":null,\"remote_host\":null,\"remote_port\":null}";
    return baton_pdproto_prefill_body(r, ktp, sizeof(ktp) - 1, out);
}

static const char *const ktp_key[] = {"kv_transfer_params"};

/* out = the client's body with kv_transfer_params set to the JSON text in `ktp` ("{...}"). */
static int with_ktp(const baton_pdreq_t *r, const baton_buf_t *ktp, baton_buf_t *out)
{
    baton_buf_t tail = BATON_BUF_INIT;
    int rc = baton_buf_append_str(&tail, ",\"kv_transfer_params\":");
    if (!rc)
        rc = baton_buf_append(&tail, ktp->data, ktp->len);
    if (!rc)
        rc = baton_buf_append(&tail, "}", 1);
    if (!rc)
        rc = splice_into(r, ktp_key, 1, &tail, out, 1);
    baton_buf_free(&tail);
    return rc ? BATON_ENOMEM : 0;
}

int baton_pdproto_nixl_decode(const baton_pdreq_t *r, const char *body, size_t len,
                              baton_buf_t *out, char *rid, size_t ridlen, char *why, size_t whylen)
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
    const char *id = json_string_value(json_object_get(ktp, "remote_request_id"));
    rid[0] = '\0';
    if (id && strlen(id) < ridlen)
        memcpy(rid, id, strlen(id) + 1);
    baton_buf_t text = BATON_BUF_INIT;
    int rc = baton_pdreq_dump(ktp, &text);
    if (!rc)
        rc = with_ktp(r, &text, out);
    baton_buf_free(&text);
    json_decref(ans);
    return rc;
}

/* Appends ,"key":"value" (value escaped). */
static int put_str(baton_buf_t *b, const char *key, const char *value)
{
    if (baton_buf_printf(b, ",\"%s\":", key))
        return BATON_ENOMEM;
    return baton_buf_append_json_string(b, value, strlen(value));
}

int baton_pdproto_mooncake(const baton_pdreq_t *r, const char *transfer_id, const char *engine_id,
                           const char *bootstrap_addr, baton_buf_t *prefill_out,
                           baton_buf_t *decode_out)
{
    baton_buf_t k = BATON_BUF_INIT;
    int rc = baton_buf_append_str(&k, "{\"do_remote_decode\":true,\"do_remote_prefill\":false");
    if (!rc && !(rc = put_str(&k, "transfer_id", transfer_id)) &&
        !(rc = baton_buf_append(&k, "}", 1)))
        rc = baton_pdproto_prefill_body(r, k.data, k.len, prefill_out);
    baton_buf_reset(&k);
    if (!rc)
        rc = baton_buf_append_str(&k, "{\"do_remote_decode\":false,\"do_remote_prefill\":true");
    if (!rc && !(rc = put_str(&k, "transfer_id", transfer_id)) &&
        !(rc = put_str(&k, "remote_engine_id", engine_id)) &&
        !(rc = put_str(&k, "remote_bootstrap_addr", bootstrap_addr)) &&
        !(rc = baton_buf_append(&k, "}", 1)))
        rc = with_ktp(r, &k, decode_out);
    baton_buf_free(&k);
    return rc ? BATON_ENOMEM : 0;
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

int baton_pdproto_dp_body(const baton_pdreq_t *r, const char *bootstrap, int routed_rank,
                          int prefill_rank, baton_buf_t *out)
{
    static const char *const drop[] = {"routed_dp_rank", "disagg_prefill_dp_rank", "bootstrap_host",
                                       "bootstrap_port", "bootstrap_room"};
    baton_buf_t tail = BATON_BUF_INIT;
    int rc =
        bootstrap ? baton_buf_append(&tail, ",", 1) || baton_buf_append_str(&tail, bootstrap) : 0;
    if (!rc)
        rc = baton_buf_printf(&tail, ",\"routed_dp_rank\":%d", routed_rank);
    if (!rc && prefill_rank >= 0)
        rc = baton_buf_printf(&tail, ",\"disagg_prefill_dp_rank\":%d", prefill_rank);
    if (!rc)
        rc = baton_buf_append(&tail, "}", 1);
    if (!rc)
        rc = splice_into(r, drop, bootstrap ? 5 : 2, &tail, out, 1);
    baton_buf_free(&tail);
    return rc ? BATON_ENOMEM : 0;
}
