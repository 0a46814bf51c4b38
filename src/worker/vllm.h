/* vllm.h — baton-worker as a vLLM disaggregated-prefill engine: the
 * kv_transfer_params of the NixlConnector and MooncakeConnector protocols, and the NIXL prefill's
 * held KV pages (kept until the decode pulls them, a timeout or an abort releases them). */
#ifndef BATON_WORKER_VLLM_H
#define BATON_WORKER_VLLM_H

#include <stdint.h>

#include <jansson.h>
#include <uv.h>

#include "common/buf.h"
#include "common/metrics.h"
#include "worker/request.h"

/*
 * Everything here runs on the worker's loop thread.
 *
 * Requests (wk_vllm_parse, called by request.c): a body's kv_transfer_params decides the leg.
 *   vllm-nixl prefill   {"do_remote_decode": true, ...}: computed like a plain request
 *                       (one token); each sequence's KV is exported (libbaton pull mode, key
 *                       wk_vllm_room(id, i)) and the answer's kv_transfer_params name it:
 *                       remote_engine_id (the libbaton engine), remote_block_ids (the pages),
 *                       remote_host / remote_port (its bootstrap address); held until the
 *                       decode's pull, the export's timeout, or POST /abort_requests.
 *   vllm-nixl decode    {"do_remote_prefill": true, remote_host, remote_port,
 *                       remote_request_id, remote_block_ids (non-empty), remote_engine_id}:
 *                       pulls key wk_vllm_room(remote_request_id, i) from remote_host:port.
 *   vllm-mooncake       {"transfer_id": X, ...}: the SGLang flow with room wk_vllm_room(X, i)
 *                       (prefill) and remote_bootstrap_addr "http://host:port" (decode).
 * A decode leg that lacks a field vLLM requires is refused with 400 (vLLM itself would
 * recompute the prompt locally and only log it; a test bed must not hide that).
 *
 * Pull is decode-initiated (baton_xfer_pull): the holder's engine serves it from the export with
 * no call from this worker, and the decode verifies every byte as in the SGLang flow; see
 * docs/PROTOCOLS.md for how this relates to NIXL's RDMA READ.
 */

typedef enum {
    WK_PROTO_SGLANG = 0,
    WK_PROTO_VLLM_NIXL = 1,
    WK_PROTO_VLLM_MOONCAKE = 2,
} wk_proto_t;

/* "sglang", "vllm-nixl", "vllm-mooncake"; parse: 0 or -1. */
const char *wk_proto_name(wk_proto_t p);
int wk_proto_parse(const char *s, wk_proto_t *p_p);

/* The room of sequence i of the request named `id` (both sides compute it). */
uint64_t wk_vllm_room(const char *id, size_t i);

/* Reads root's kv_transfer_params into req (req->vllm, item rooms and bootstrap fields).
 * 0 (also when absent), BATON_EINVAL with err filled, BATON_ENOMEM. */
int wk_vllm_parse(json_t *root, wk_request_t *req, wk_parse_err_t *err);

/* Why this worker (its protocol, and mode: a wk_mode_t value, 0 regular / 1 prefill /
 * 2 decode) refuses req's leg, or NULL. */
const char *wk_vllm_refused(int protocol, int mode, const wk_request_t *req);
/* 1 when a vLLM decode worker computes this request alone, as vLLM does a request without
 * kv_transfer_params (no prefill leg: a router found the prompt already in this worker's cache,
 * or nearly): neither kv_transfer_params nor SGLang's bootstrap fields. An SGLang decode never
 * does (its requests need a bootstrap). */
int wk_vllm_decode_alone(int protocol, int mode, const wk_request_t *req);

typedef struct wk_vllm_s wk_vllm_t;
struct wk_worker_s;

/* 0 or BATON_ENOMEM; registers baton_worker_kv_holds (gauge),
 * baton_worker_kv_holds_released_total{result} (pulled | timeout | aborted | failed |
 * shutdown) and baton_worker_kv_lease_renewals_total. lease_ms: vLLM's kv_lease_duration. */
int wk_vllm_create(wk_vllm_t **v_p, struct wk_worker_s *w, uint64_t lease_ms);
/* Drops every hold (their rooms are aborted, pages given back); before the KV hand-off closes. */
void wk_vllm_close(wk_vllm_t *v);

/*
 * A NIXL prefill's held pages, one hold per sequence: reserved when the sequence was computed,
 * filled with its KV and exported through libbaton's pull API (key wk_vllm_room(id, i)), so that
 * the answer names pages a pull can fetch at once. Each hold has a lease, as vLLM's NixlConnector
 * (kv_lease_duration): lease_ms from its export, granted again at the answer, extended to 2/3 of
 * lease_ms from now by each heartbeat (POST /kv_lease) of a decode that waits for it. The request
 * owns its holds until wk_vllm_answer; from then on they live on their own until the decode's
 * pull completes, the lease runs out, or POST /abort_requests releases them.
 */
typedef struct wk_vllm_hold_s wk_vllm_hold_t;
/* 0: exported (the answer may name it); else the hold is gone (BATON_ENOMEM, ...). */
typedef void (*wk_vllm_ready_cb)(void *data, int status);

/* Starts the hold of sequence i of request `id`. 0 and *h_p (ready follows, never inside this
 * call), or BATON_EBUSY / BATON_ETOOBIG (no pages free now: the caller answers 503),
 * BATON_ENOMEM, BATON_ESHUTDOWN. */
int wk_vllm_hold_start(wk_vllm_t *v, const char *id, const wk_request_t *req, size_t i,
                       wk_vllm_ready_cb ready, void *data, wk_vllm_hold_t **h_p);
/* The request failed or left before its answer: the hold is released now (counted as `result`);
 * no callback follows. */
void wk_vllm_hold_drop(wk_vllm_hold_t *h, const char *result);
/* Adds the top-level kv_transfer_params naming the n holds of request `id` (every one exported)
 * to the answer `body` (the rendered JSON object) and hands the holds over. 0, BATON_ETIMEOUT (a
 * hold's export timed out before the answer: nothing is handed over, the request drops them),
 * or BATON_ENOMEM. */
int wk_vllm_answer(wk_vllm_t *v, const char *id, size_t n, baton_buf_t *body);

/* POST /abort_requests {"request_ids": [...]}: releases the holds of those ids. */
struct baton_http_req_s; /* http/server.h: the jobs library's, not the request parser's */
void wk_vllm_handle_abort(wk_vllm_t *v, struct baton_http_req_s *http);
/* POST /kv_lease {"request_ids": [...]}: a decode's heartbeat, renewing those ids' holds. */
void wk_vllm_handle_lease(wk_vllm_t *v, struct baton_http_req_s *http);

/*
 * The decode's side of the lease: from a vllm-nixl decode leg's arrival until its KV is in (or
 * it ends), POST http://host:port/kv_lease {"request_ids": [request_id]} every lease_ms / 6
 * (host: the prefill's remote_host, port: its answer's baton_lease_port). A heartbeat that fails
 * is only logged (debug): the lease outlasts several.
 */
typedef struct wk_vllm_hb_s wk_vllm_hb_t;
/* 0 and *hb_p, BATON_EINVAL (an id that cannot be sent as is), BATON_ENOMEM. */
int wk_vllm_hb_start(wk_vllm_hb_t **hb_p, uv_loop_t *loop, const char *host, int port,
                     const char *request_id, uint64_t lease_ms);
/* Stops the heartbeats and frees them (a request in flight is cancelled). NULL: nothing. */
void wk_vllm_hb_stop(wk_vllm_hb_t *hb);

#endif
