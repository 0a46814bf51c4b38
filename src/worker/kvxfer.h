/* kvxfer.h — baton-worker's KV hand-off through libbaton: the decode side reserves pages and
 * offers rooms, receives and verifies the KV; the prefill side matches offers with its requests,
 * fills the KV layer by layer and writes it into the decode's pages. */
#ifndef BATON_WORKER_KVXFER_H
#define BATON_WORKER_KVXFER_H

#include <stdint.h>
#include <uv.h>

#include "baton/transfer.h"
#include "common/metrics.h"
#include "worker/kvpool.h"
#include "worker/kvshape.h"

/*
 * One wk_kv_t per PD worker, on the worker's loop; everything here runs on that loop's thread
 * (libbaton's callbacks come there too). Page filling and checking run on libuv's thread pool so
 * the loop keeps serving while hundreds of MiB are touched.
 *
 * Memory: one region from baton_xfer_mem_alloc (memfd, so shm peers can map it) laid out
 * [layer][slot][page bytes]; a room of P pages per layer uses P slots (kvpool.h). The decode's
 * pages receive the KV; the prefill's pages hold the KV it computed until the room is written.
 *
 * Callbacks follow libuv's rules: never inside the call that started the work; a call that
 * returns an error reports nothing later; a handle dropped before its callback gets none.
 *
 * Fencing: a slot goes back to the pool only after libbaton's final callback for its room
 * (decode: the offer callback; prefill: room closed) AND after the request let go of it AND after
 * any thread-pool job on it ended. Timeouts and aborts never free pages by themselves.
 */

typedef struct wk_kv_s wk_kv_t;
typedef struct wk_kv_recv_s wk_kv_recv_t; /* decode: one room */
typedef struct wk_kv_send_s wk_kv_send_t; /* prefill: one room */

/* Worker-private status codes, next to baton/error.h's (never on the wire). */
#define WK_EMISMATCH    (-29001) /* prefill and decode disagree about the room's prompt or shape */
#define WK_EUNREACHABLE (-29002) /* decode: the prefill's bootstrap port never answered */

typedef struct wk_kv_cfg_s {
    int prefill;             /* 1: prefill role (listens), 0: decode role */
    const char *listen_host; /* prefill */
    int listen_port;         /* prefill; 0 = ephemeral */
    wk_kvshape_t shape;
    uint64_t pool_tokens; /* page pool size in tokens (a whole number of pages) */
    baton_xfer_transport_t transports[BATON_XFER_MAX_TRANSPORTS];
    int n_transports;
    uint64_t timeout_ms;          /* prefill: how long an offer waits for its request (+ grace) */
    uint32_t fault_corrupt_every; /* prefill, tests only: corrupt one byte of every Nth room */
    const char *secret_file; /* the engines' shared secret (baton_xfer_config_t.secret); NULL */
    /* prefill: the listener's pending bounds (baton_xfer_config_t's; 0 keeps its default) */
    uint32_t max_pending, max_pending_per_addr;
    uint64_t pending_buffer_bytes;
} wk_kv_cfg_t;

/* The prompt of one room: token ids (copied), their count, and the text seed. */
typedef struct wk_kv_prompt_s {
    const int64_t *ids;
    uint32_t n_tokens; /* >= 1 */
    uint64_t seed;
    int want_first; /* max_tokens > 0: a first token travels with DONE */
    /* Decode: leading tokens this worker's prefix cache holds (an earlier turn's KV). Its whole
     * pages are not offered: libbaton moves only the rest, and the decode restores the cached
     * ones itself. 0 (and always on the prefill side): every page travels. */
    uint32_t cached_tokens;
    /* Decode: pull the room from a holder's export (vllm-nixl: baton_xfer_pull) instead of
     * offering it. Every page is pulled (an export has the whole prompt's shape), so
     * cached_tokens is then ignored. */
    int pull;
} wk_kv_prompt_t;

/* Creates the engine (starts listening on the prefill side, which logs `bootstrap_listening
 * addr=H:P`), the page region and the metrics. Returns 0 or an error (logged). */
int wk_kv_create(wk_kv_t **kv_p, uv_loop_t *loop, const wk_kv_cfg_t *cfg, baton_metrics_t *metrics);
int wk_kv_listen_port(const wk_kv_t *kv);
/* Reads the KV bootstrap secret file as wk_kv_create would: 0, or BATON_EINVAL (logged). The
 * worker checks it at start in every mode, so that a named secret that cannot be used stops a
 * regular worker too instead of leaving it silently without one. */
int wk_kv_secret_check(const char *path);
/* Reads it into buf (at most cap bytes): 0 and *len_p, or BATON_EINVAL (logged). */
int wk_kv_secret_read(const char *path, uint8_t *buf, size_t cap, size_t *len_p);
/* The libbaton engine's id (vLLM's remote_engine_id), "" before the engine exists. */
const char *wk_kv_engine_id(const wk_kv_t *kv);
uint32_t wk_kv_pool_slots(const wk_kv_t *kv);
/* Updates gauges and engine-fed counters before /metrics is rendered. */
void wk_kv_metrics_sync(wk_kv_t *kv);
/* Every handle must have been dropped before. Waits for thread-pool jobs, shuts the engine down,
 * then calls cb (may be NULL); kv is freed after cb returns. */
void wk_kv_close(wk_kv_t *kv, void (*cb)(void *arg), void *arg);

/* Writes the transport names joined by commas ("shm,tcp") into out (always terminated). */
void wk_kv_transport_list(const baton_xfer_transport_t *t, int n, char *out, size_t cap);

/* ---- page reservations (both roles) ---- */

/* Slots (pages per layer) a prompt of n tokens needs. */
uint32_t wk_kv_slots_for(const wk_kv_t *kv, uint32_t n_tokens);

typedef struct wk_kv_resv_s wk_kv_resv_t;
typedef void (*wk_kv_resv_cb)(wk_kv_resv_t *r);
struct wk_kv_resv_s {
    wk_kvwait_t w; /* w.data is the caller's */
    wk_kv_resv_cb cb;
    wk_kv_t *kv;
};

/*
 * Reserves n slots at once into slots[0..n) (the caller's array, valid until the callback or the
 * cancel). Returns 0 (taken now, no callback), 1 (queued: cb runs once they are taken) or
 * BATON_ETOOBIG (more than the whole pool). Slots not handed to a room go back with
 * wk_kv_unreserve.
 */
int wk_kv_reserve(wk_kv_t *kv, wk_kv_resv_t *r, uint32_t n, uint32_t *slots, wk_kv_resv_cb cb,
                  void *data);
void wk_kv_reserve_cancel(wk_kv_t *kv, wk_kv_resv_t *r);
void wk_kv_unreserve(wk_kv_t *kv, const uint32_t *slots, uint32_t n);

/* ---- decode ---- */

typedef struct wk_kv_got_s {
    uint32_t prompt_tokens;
    int32_t first_token; /* -1 when none */
    uint64_t seed;       /* the generator seed, derived from the received bytes */
    int has_hits;        /* the prefill reported its tier hits: */
    uint32_t hits[3];    /* prompt tokens it found in L1, L2, L3 */
} wk_kv_got_t;

/*
 * status 0 (got valid), or: BATON_EKVCORRUPT (a received byte differs from the definition),
 * WK_EMISMATCH, BATON_EABORTED (the prefill aborted the room), BATON_EPEERDOWN (connection
 * lost), WK_EUNREACHABLE, BATON_ENOTSUP / BATON_ERKEY / BATON_ESTALE (refused), BATON_ESHUTDOWN,
 * BATON_ENOMEM. `detail` says more (valid during the call; may be "").
 * After a failure the handle is gone. After success the pages stay the request's until
 * wk_kv_recv_drop.
 */
typedef void (*wk_kv_recv_cb)(void *data, int status, const wk_kv_got_t *got, const char *detail);

/*
 * Offers `room` with the pages of `slots` (wk_kv_slots_for(n_tokens) of them; they belong to the
 * room from now on, also when this fails asynchronously) to the prefill at host:port. Returns 0
 * and *r_p, or BATON_EEXIST (room already open here), BATON_EINVAL, BATON_ENOMEM,
 * BATON_ESHUTDOWN; on a synchronous error the slots stay the caller's.
 */
int wk_kv_recv_start(wk_kv_t *kv, const char *host, int port, uint64_t room,
                     const wk_kv_prompt_t *pr, const uint32_t *slots, wk_kv_recv_cb cb, void *data,
                     wk_kv_recv_t **r_p);
/*
 * The request lets go: before the callback it aborts the room (no callback follows; `reason`, a
 * short word like "timeout" or "canceled", is counted as the room's failure); after a successful
 * callback it releases the pages (reason ignored). The pages return under the fencing rule.
 */
void wk_kv_recv_drop(wk_kv_recv_t *r, const char *reason);

/* Decode offload (offload.h): the pool region and a received room's lease (valid from the
 * successful callback until the lease is released). */
const uint8_t *wk_kv_region(const wk_kv_t *kv);
wk_kvlease_t *wk_kv_recv_lease(wk_kv_recv_t *r);
/* Drops a unit of work (hold 0) or a hold on a received room's lease; its room is freed once
 * over and idle. */
void wk_kv_recv_lease_drop(wk_kv_t *kv, wk_kvlease_t *l, unsigned hold);

/* ---- prefill ---- */

/* A request for `room` was refused before it could open it (queue full, shutting down): an
 * offer waiting for it is aborted now, a later one at once (remembered for a timeout period), so
 * the decode fails fast instead of running into its timeout. A room another request holds is
 * left alone. */
void wk_kv_send_refuse(wk_kv_t *kv, uint64_t room);

/* The room met its offer and the shapes agree: the caller may compute (wk_kv_send_slots first). */
typedef void (*wk_kv_matched_cb)(void *data);
/* The room ended: 0 = DONE went out after every write was acknowledged; WK_EMISMATCH (DONE said
 * so, nothing written), BATON_EABORTED (the decode aborted), BATON_EPEERDOWN, BATON_ESHUTDOWN...
 * `detail` says more (valid during the call; may be ""). The handle is gone after this callback.
 */
typedef void (*wk_kv_sent_cb)(void *data, int status, const char *detail);

/*
 * Opens the prefill side of `room` for a request (ids copied). If the decode's offer is already
 * here the match is reported soon, else when it comes. Returns 0 and *s_p, BATON_EEXIST (another
 * request has this room), BATON_EABORTED (this room was aborted within the last timeout period:
 * its decode gave up or failed), BATON_ENOMEM.
 */
int wk_kv_send_open(wk_kv_t *kv, uint64_t room, const wk_kv_prompt_t *pr, wk_kv_matched_cb matched,
                    wk_kv_sent_cb sent, void *data, wk_kv_send_t **s_p);
/* After the match: the source pages (wk_kv_slots_for slots, taken over). 0 or BATON_ENOMEM. */
int wk_kv_send_slots(wk_kv_send_t *s, const uint32_t *slots);
/* Layer `layer` was computed: fill it and, when `write_now` (layer-wise), write it at once;
 * otherwise it waits for wk_kv_send_finish, which writes the whole room in one go. */
void wk_kv_send_layer(wk_kv_send_t *s, uint32_t layer, int write_now);
/* HiCache: pages [first, first + n) of the prompt were found in L2 (or fetched from L3 into
 * it): their page objects (K half, V half; tier_l2.h) are copied into the room's pages of every
 * layer on the thread pool (megabytes a page with a large model: never on the loop), and the
 * fills that stand in for computing skip them. After wk_kv_send_slots, before the compute, which
 * must wait for cb; whole pages only. The room's slots stay out of the pool until the copy is
 * done (a unit of work on its lease), whatever happens to the request; the caller keeps the
 * objects' memory (its L2 pins) until cb, which runs on the loop with 0 (copied) or an error
 * (the fills write those pages instead), and the copy's time on its thread. 0 (cb will run),
 * BATON_EINVAL or BATON_ENOMEM (it will not). */
typedef void (*wk_kv_loaded_cb)(void *arg, int status, uint64_t copy_ns);
int wk_kv_send_load_pages(wk_kv_send_t *s, uint32_t first, uint32_t n, const uint8_t *const *objs,
                          wk_kv_loaded_cb cb, void *arg);
/* The prompt tokens the prefill found in L1, L2 and L3 (not computed): DONE tells the decode. */
void wk_kv_send_hits(wk_kv_send_t *s, uint32_t l1, uint32_t l2, uint32_t l3);
/* Every layer was computed: fill and write what is left, then DONE with the first token. */
void wk_kv_send_finish(wk_kv_send_t *s, int32_t first_token);
/* The request lets go before `sent` fired: aborts the room (the decode learns at once) or
 * remembers it as aborted so a late offer is refused. No callback follows. */
void wk_kv_send_drop(wk_kv_send_t *s, const char *reason);

/* ---- holder (pull mode, vllm-nixl prefill) ---- */

typedef struct wk_kv_export_s wk_kv_export_t;
/* The export is in place (status 0: a pull may come now) or could not be made (the fill failed,
 * BATON_ENOMEM, the engine refused it). After a failure the handle is gone. */
typedef void (*wk_kv_ready_cb)(void *data, int status);
/* The export ended: 0 = pulled (every byte acknowledged in the puller's pages before DONE),
 * BATON_ETIMEOUT = no pull within the timeout, else the pull failed (BATON_EPEERDOWN,
 * BATON_EABORTED, ...). The handle is gone after this callback; its pages went back to the pool. */
typedef void (*wk_kv_export_end_cb)(void *data, int status);

/*
 * Holds a room's KV for a later pull (libbaton's pull API): fills the pages of `slots`
 * (wk_kv_slots_for(n_tokens) of them, taken over now) with the prompt's KV on the thread pool,
 * then exports them under `key` with timeout_ms as the export timeout; `ready` reports that, then
 * `end` reports the export's end. DONE carries the same payload as a pushed room's, with
 * first_token. Returns 0 and *e_p, or BATON_ESHUTDOWN / BATON_EINVAL / BATON_ENOMEM (the slots
 * stay the caller's).
 */
int wk_kv_export_start(wk_kv_t *kv, uint64_t key, const wk_kv_prompt_t *pr, const uint32_t *slots,
                       int32_t first_token, uint32_t timeout_ms, wk_kv_ready_cb ready,
                       wk_kv_export_end_cb end, void *data, wk_kv_export_t **e_p);
/*
 * The holder lets go (an abort, a failed request, shutdown; `reason` labels an exported room's
 * failure in the metrics). Returns 0: released now, no callback follows, the pages are back (a
 * pull that comes later is refused at once). BATON_EBUSY: a pull is being served; with `detach`
 * no callback follows and the export ends by its own rules, else it stays the caller's and `end`
 * reports it.
 */
int wk_kv_export_release(wk_kv_export_t *e, int detach, const char *reason);

#endif
