/* pdproto.h — the request bodies of vLLM's PD protocols (NIXL two-phase, Mooncake transfer_id)
 * and SGLang's DP-attention rank/room choice, as plain JSON transformations. */
#ifndef BATON_ROUTER_PDPROTO_H
#define BATON_ROUTER_PDPROTO_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "router/dataplane/pdreq.h"

/*
 * Plain data: no loop, no locks. `r` is a client body parsed by pdreq.c; each body here is a
 * splice of the client's bytes (pdreq.h): the top-level members a protocol replaces are left out
 * (every duplicate) and its own appended, so `r` never changes and a retry builds the next
 * attempt's bodies from it. Nested values are copied byte for byte. With r->priority_set
 * (--priority-to-workers) every vLLM leg carries "priority": r->priority in place of the
 * client's own. Each function writes into
 * `out` (replacing what was there) and returns 0, BATON_ENOMEM, or the error named.
 */

/* The prefill leg shared by both vLLM protocols: "stream": false, "max_tokens": 1 (and
 * "max_completion_tokens": 1 when the client sent it), "stream_options", "min_tokens" and
 * "min_completion_tokens" removed, and "kv_transfer_params" set to the JSON text ktp[0..len). */
int baton_pdproto_prefill_body(const baton_pdreq_t *r, const char *ktp, size_t len,
                               baton_buf_t *out);

/* vllm-nixl phase 1: the prefill leg with {"do_remote_decode": true, "do_remote_prefill": false,
 * "remote_engine_id": null, "remote_block_ids": null, "remote_host": null, "remote_port": null}. */
int baton_pdproto_nixl_prefill(const baton_pdreq_t *r, baton_buf_t *out);

/*
 * vllm-nixl phase 2: prefill's answer body[0..len) must be a JSON object with an object
 * `kv_transfer_params` (read with jansson: a small answer, and a tree is natural there); the
 * decode leg is the client's body with that object set (compact). BATON_EUPSTREAM when the answer
 * is not JSON or has no such object (why names the reason). rid[0..ridlen) receives its
 * remote_request_id ("" when absent or too long): the prefill's own name for the request, which
 * a release must use.
 */
int baton_pdproto_nixl_decode(const baton_pdreq_t *r, const char *body, size_t len,
                              baton_buf_t *out, char *rid, size_t ridlen, char *why, size_t whylen);

/* vllm-mooncake: both legs of one attempt. The prefill leg as baton_pdproto_prefill_body with
 * {"do_remote_decode": true, "do_remote_prefill": false, "transfer_id": X}; the decode leg the
 * client's body with {"do_remote_decode": false, "do_remote_prefill": true, "transfer_id": X,
 * "remote_engine_id": E, "remote_bootstrap_addr": A}. */
int baton_pdproto_mooncake(const baton_pdreq_t *r, const char *transfer_id, const char *engine_id,
                           const char *bootstrap_addr, baton_buf_t *prefill_out,
                           baton_buf_t *decode_out);

/* ---- SGLang DP attention ---- */

/*
 * A decode rank that can share one bootstrap_room with prefill rank rank_p: a room r with
 * r % dp_p == rank_p and r % dp_d == rank_d exists iff rank_d ≡ rank_p (mod gcd(dp_p, dp_d)).
 * `turn` picks among the dp_d / gcd candidates (round robin when it counts up). dp sizes of 0
 * or 1 mean "not data-parallel" (rank 0).
 */
int baton_pdproto_dp_decode_rank(int dp_p, int rank_p, int dp_d, unsigned turn);

/*
 * Turns `random` (a room drawn uniformly from [0, 2^63-1]) into the nearest-below room that
 * agrees with both ranks (room % dp == rank on each side), keeping it in [0, 2^63-1]. The
 * ranks must be compatible (baton_pdproto_dp_decode_rank). Older SGLang versions derive the
 * rank from the room, newer ones read routed_dp_rank: with both agreeing, either kind works.
 */
uint64_t baton_pdproto_dp_room(uint64_t random, int dp_p, int rank_p, int dp_d, int rank_d);

/*
 * The client's body with routed_dp_rank (and disagg_prefill_dp_rank when prefill_rank >= 0: the
 * decode leg) set — the client's own values of both left out — into out. `bootstrap` (NULL: keep
 * the client's) is the injected bootstrap members' text (baton_pdreq_bootstrap_members), which
 * then replace the client's. A batch gets the same ranks for every element (one pair serves the
 * whole batch).
 */
int baton_pdproto_dp_body(const baton_pdreq_t *r, const char *bootstrap, int routed_rank,
                          int prefill_rank, baton_buf_t *out);

#endif
