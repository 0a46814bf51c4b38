/* bootstrap.h — the PD rendezvous between a prefill and a decode worker, keyed by room. */
#ifndef BATON_WORKER_BOOTSTRAP_H
#define BATON_WORKER_BOOTSTRAP_H

#include <stdint.h>
#include <uv.h>

/*
 * The prefill worker listens on its bootstrap port. A decode worker connects to it (one TCP
 * connection per prefill peer, reused and multiplexed by room) and sends WAIT(room); once the
 * prefill side has computed the room's prompt it answers DONE(room, prompt tokens, first token).
 * Either side may send ABORT(room). Frames: frame.h.
 *
 * This is the seam where the KV transfer engine (include/baton/transfer.h) plugs in later: a
 * wait becomes "offer my pages for the room", a publish becomes "write the room's pages, then
 * complete it with this payload". The payload stays the same.
 *
 * Rules (libuv's): the caller allocates wk_boot_pub_t / wk_boot_wait_t and keeps them valid
 * until their callback ran or they were cancelled. A callback never runs inside the call that
 * started the work; a call that fails synchronously (negative return) reports nothing later.
 * Cancel is synchronous: no callback follows it. Every callback runs on the loop's thread;
 * everything here must be called on that thread.
 *
 * Timeouts (the `timeout_ms` given at create):
 *   - decode: a wait whose DONE has not come fails with BATON_ETIMEOUT (and ABORT is sent);
 *   - prefill: a published room no decode asked for fails with BATON_ETIMEOUT; a room a decode
 *     asked for but prefill never published is dropped. An aborted room is remembered for one
 *     timeout period, so a late publish or WAIT for it fails at once with BATON_EABORTED.
 */

typedef struct wk_boot_s wk_boot_t;

typedef struct wk_boot_result_s {
    uint32_t prompt_tokens;
    int32_t first_token; /* -1 when max_tokens was 0 */
} wk_boot_result_t;

/* An intrusive deadline-ordered list node (private). */
typedef struct wk_boot_tnode_s {
    struct wk_boot_tnode_s *prev, *next;
    uint64_t deadline_ms;
    int linked;
} wk_boot_tnode_t;

/* ---- prefill side ---- */

typedef struct wk_boot_pub_s wk_boot_pub_t;
/* status: 0 = DONE written to the decode peer; BATON_ETIMEOUT, BATON_EABORTED (decode sent
 * ABORT), BATON_ESHUTDOWN, or a libuv write error. */
typedef void (*wk_boot_pub_cb)(wk_boot_pub_t *pub, int status);

struct wk_boot_pub_s {
    void *data; /* caller's */
    /* private */
    wk_boot_t *boot;
    uint64_t room;
    wk_boot_result_t res;
    wk_boot_pub_cb cb;
    void *entry; /* the room entry while published and unclaimed */
    void *wr;    /* the DONE write in flight */
};

/*
 * Publishes the room's result. Returns 0 (the callback will run), BATON_EEXIST (the room is
 * already published), BATON_EABORTED (the decode side aborted it already) or BATON_ENOMEM.
 */
int wk_boot_publish(wk_boot_t *b, wk_boot_pub_t *pub, uint64_t room, const wk_boot_result_t *res,
                    wk_boot_pub_cb cb);
/* Withdraws a publish (e.g. the prefill request was aborted): the room is remembered as aborted
 * and a decode waiting for it, now or later in the timeout period, gets ABORT. */
void wk_boot_publish_cancel(wk_boot_pub_t *pub);

/* Marks a room this prefill will never publish (its request failed or was aborted before the
 * prefill finished): a decode waiting for it now, or asking within the timeout period, gets
 * ABORT(reason) at once instead of running into its own timeout. A room published by a live
 * wk_boot_pub_t is left alone (use wk_boot_publish_cancel for that). */
void wk_boot_abort(wk_boot_t *b, uint64_t room, int reason);

/* ---- decode side ---- */

typedef struct wk_boot_wait_s wk_boot_wait_t;
/* status 0 with *res, or BATON_ETIMEOUT, BATON_EABORTED (prefill aborted the room),
 * BATON_EPEERDOWN (connection lost), BATON_EPROTO, a libuv connect / resolve error,
 * BATON_ESHUTDOWN. res is NULL unless status is 0. */
typedef void (*wk_boot_wait_cb)(wk_boot_wait_t *w, int status, const wk_boot_result_t *res);

struct wk_boot_wait_s {
    void *data; /* caller's */
    /* private */
    wk_boot_t *boot;
    void *peer;
    wk_boot_wait_t *prev, *next; /* in the peer's list */
    wk_boot_tnode_t tn;
    uint64_t room;
    wk_boot_wait_cb cb;
    int sent; /* WAIT written */
};

/*
 * Waits for the room at the prefill bootstrap endpoint host:port (IP literal or name). Returns 0,
 * BATON_EEXIST (this room is being waited for already), BATON_EINVAL or BATON_ENOMEM.
 */
int wk_boot_wait(wk_boot_t *b, wk_boot_wait_t *w, const char *host, int port, uint64_t room,
                 wk_boot_wait_cb cb);
/* Stops waiting; ABORT(room) is sent to the prefill peer. */
void wk_boot_wait_cancel(wk_boot_wait_t *w);

/* ---- the module ---- */

typedef struct wk_boot_stats_s {
    uint64_t rooms_done;   /* prefill: DONE written; decode: DONE received */
    uint64_t rooms_failed; /* timeouts, aborts, peer loss */
    uint64_t proto_errors; /* connections closed for a malformed frame */
    unsigned connections;  /* open bootstrap connections (either side) */
} wk_boot_stats_t;

int wk_boot_create(wk_boot_t **b_p, uv_loop_t *loop, uint64_t timeout_ms);
/* Prefill: listen for decode peers. port 0 = ephemeral; wk_boot_port() tells which. */
int wk_boot_listen(wk_boot_t *b, const char *host, int port);
int wk_boot_port(const wk_boot_t *b);
void wk_boot_get_stats(const wk_boot_t *b, wk_boot_stats_t *out);
/*
 * Fails every remaining publish and wait with BATON_ESHUTDOWN, closes every handle, and calls
 * close_cb (may be NULL) once they are closed; the module is freed after close_cb returns.
 */
void wk_boot_close(wk_boot_t *b, void (*close_cb)(void *arg), void *arg);

#endif
