/* vllm_params.c — baton-worker's vLLM PD protocols on the request side: kv_transfer_params of
 * the NIXL and Mooncake connectors into rooms and bootstrap fields, and which leg a worker
 * accepts (see vllm.h). */
#include "worker/vllm.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"

static const char *const proto_names[] = {"sglang", "vllm-nixl", "vllm-mooncake"};

const char *wk_proto_name(wk_proto_t p)
{
    return (unsigned)p < 3 ? proto_names[p] : "unknown";
}

int wk_proto_parse(const char *s, wk_proto_t *p_p)
{
    for (int i = 0; i < 3; i++) {
        if (strcmp(s, proto_names[i]) == 0) {
            *p_p = (wk_proto_t)i;
            return 0;
        }
    }
    return -1;
}

uint64_t wk_vllm_room(const char *id, size_t i)
{
    uint64_t h = 14695981039346656037ull; /* FNV-1a: both sides only need the same function */
    for (const unsigned char *p = (const unsigned char *)id; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    return (h + i) & INT64_MAX; /* a room is a non-negative JSON integer elsewhere */
}

/* ---- requests ------------------------------------------------------------------------------ */

static int bad(wk_parse_err_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad(wk_parse_err_t *err, const char *fmt, ...)
{
    err->status = 400;
    err->code = "invalid_request_error";
    snprintf(err->param, sizeof(err->param), "kv_transfer_params");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    return BATON_EINVAL;
}

/* Every item gets room wk_vllm_room(id, i) and, for a decode, the prefill's bootstrap address. */
static int set_rooms(wk_request_t *req, const char *id, const char *host, size_t host_len, int port)
{
    req->has_boot = 1;
    for (size_t i = 0; i < req->n_items; i++) {
        wk_item_t *it = &req->items[i];
        it->has_boot = 1;
        it->room = wk_vllm_room(id, i);
        if (host) {
            free(it->boot_host);
            if (!(it->boot_host = strndup(host, host_len)))
                return BATON_ENOMEM;
            it->boot_port = port;
        }
    }
    return 0;
}

static const char *str_field(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_string(v) && json_string_length(v) > 0 ? json_string_value(v) : NULL;
}

/* "http://host:port" → host (pointer into s, length) and port. */
static int parse_addr(const char *s, const char **host_p, size_t *len_p, int *port_p)
{
    if (!s || strncmp(s, "http://", 7) != 0)
        return -1;
    const char *h = s + 7, *colon = strrchr(h, ':');
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || colon == h || *end != '\0' || port < 1 || port > 65535)
        return -1;
    *host_p = h;
    *len_p = (size_t)(colon - h);
    *port_p = (int)port;
    return 0;
}

int wk_vllm_parse(json_t *root, wk_request_t *req, wk_parse_err_t *err)
{
    json_t *ktp = json_object_get(root, "kv_transfer_params");
    if (!ktp || json_is_null(ktp))
        return 0;
    if (!json_is_object(ktp))
        return bad(err, "'kv_transfer_params' must be an object");
    if (req->has_boot)
        return bad(err, "kv_transfer_params (vLLM) and bootstrap fields (SGLang) do not mix");
    if (req->api == WK_API_GENERATE)
        return bad(err, "kv_transfer_params is for /v1/chat/completions and /v1/completions");
    int remote_decode = json_is_true(json_object_get(ktp, "do_remote_decode"));
    int remote_prefill = json_is_true(json_object_get(ktp, "do_remote_prefill"));
    if (remote_decode == remote_prefill)
        return remote_decode ? bad(err, "do_remote_decode and do_remote_prefill are both true")
                             : 0; /* neither: a plain request */
    const char *xfer = str_field(ktp, "transfer_id");
    if (remote_decode) { /* the prefill leg */
        if (req->stream)
            return bad(err, "a remote-decode prefill answers once: \"stream\" must be false");
        if (xfer) {
            req->vllm_leg = WK_VLLM_MOONCAKE_PREFILL;
            return set_rooms(req, xfer, NULL, 0, -1);
        }
        req->vllm_leg = WK_VLLM_NIXL_PREFILL;
        return 0;
    }
    const char *host;
    size_t host_len;
    int port;
    if (xfer) {
        if (parse_addr(str_field(ktp, "remote_bootstrap_addr"), &host, &host_len, &port) != 0)
            return bad(err, "'remote_bootstrap_addr' must be \"http://host:port\"");
        if (!str_field(ktp, "remote_engine_id"))
            return bad(err, "'remote_engine_id' is required");
        req->vllm_leg = WK_VLLM_MOONCAKE_DECODE;
        return set_rooms(req, xfer, host, host_len, port);
    }
    /* NIXL decode: vLLM requires all of these (else it recomputes locally). */
    json_t *blocks = json_object_get(ktp, "remote_block_ids");
    json_t *jport = json_object_get(ktp, "remote_port");
    const char *rid = str_field(ktp, "remote_request_id");
    host = str_field(ktp, "remote_host");
    if (!json_is_array(blocks) || json_array_size(blocks) == 0 || !rid || !host ||
        !str_field(ktp, "remote_engine_id") || !json_is_integer(jport) ||
        json_integer_value(jport) < 1 || json_integer_value(jport) > 65535)
        return bad(err, "invalid kv_transfer_params: remote_block_ids (non-empty), "
                        "remote_engine_id, remote_request_id, remote_host and remote_port are "
                        "required");
    req->vllm_leg = WK_VLLM_NIXL_DECODE;
    /* baton-worker's own field: where this decode's heartbeats renew the prefill's lease */
    json_t *lease = json_object_get(ktp, "baton_lease_port");
    if (json_is_integer(lease) && json_integer_value(lease) >= 1 &&
        json_integer_value(lease) <= 65535)
        req->lease_port = (int)json_integer_value(lease);
    if (!(req->vllm_rid = strdup(rid)))
        return BATON_ENOMEM;
    return set_rooms(req, rid, host, strlen(host), (int)json_integer_value(jport));
}

/* wk_mode_t's values (worker.h, which this request-side file does not include) */
enum { MODE_REGULAR = 0, MODE_PREFILL = 1, MODE_DECODE = 2 };

int wk_vllm_decode_alone(int protocol, int mode, const wk_request_t *req)
{
    return mode == MODE_DECODE &&
           (protocol == WK_PROTO_VLLM_NIXL || protocol == WK_PROTO_VLLM_MOONCAKE) &&
           req->vllm_leg == WK_VLLM_NONE && !req->has_boot;
}

const char *wk_vllm_refused(int protocol, int mode, const wk_request_t *req)
{
    wk_vllm_leg_t leg = req->vllm_leg;
    if (wk_vllm_decode_alone(protocol, mode, req))
        return NULL;
    if (mode == MODE_REGULAR)
        return leg != WK_VLLM_NONE ? "this worker runs in regular mode: kv_transfer_params are "
                                     "for prefill and decode workers"
                                   : NULL;
    int prefill = mode == MODE_PREFILL;
    switch (protocol) {
    case WK_PROTO_VLLM_NIXL:
        if (leg != (prefill ? WK_VLLM_NIXL_PREFILL : WK_VLLM_NIXL_DECODE))
            return prefill ? "this worker is a vllm-nixl prefill: kv_transfer_params with "
                             "\"do_remote_decode\": true are required"
                           : "this worker is a vllm-nixl decode: kv_transfer_params with "
                             "\"do_remote_prefill\": true and the prefill's remote_* fields are "
                             "required";
        return NULL;
    case WK_PROTO_VLLM_MOONCAKE:
        if (leg != (prefill ? WK_VLLM_MOONCAKE_PREFILL : WK_VLLM_MOONCAKE_DECODE))
            return prefill ? "this worker is a vllm-mooncake prefill: kv_transfer_params with "
                             "\"do_remote_decode\": true and a transfer_id are required"
                           : "this worker is a vllm-mooncake decode: kv_transfer_params with "
                             "\"do_remote_prefill\": true, transfer_id, remote_engine_id and "
                             "remote_bootstrap_addr are required";
        return NULL;
    default:
        return leg != WK_VLLM_NONE ? "this worker speaks sglang: kv_transfer_params are not "
                                     "accepted (start it with --protocol vllm-nixl or "
                                     "vllm-mooncake)"
                                   : NULL;
    }
}
