/* kvxfer_int.h — the KV hand-off's internals shared by kvxfer.c (engine, pool, thread-pool work),
 * kvxfer_send.c (prefill rooms), kvxfer_recv.c (decode rooms) and kvxfer_metrics.c; private to
 * them and to their unit tests. */
#ifndef BATON_WORKER_KVXFER_INT_H
#define BATON_WORKER_KVXFER_INT_H

#include <inttypes.h>
#include <stdint.h>
#include <uv.h>

#include "baton/transfer.h"
#include "common/list.h"
#include "common/phase.h"
#include "common/metrics.h"
#include "common/u64map.h"
#include "worker/kvdone.h"
#include "worker/kvpool.h"
#include "worker/kvxfer.h"

#define WK_KV_COMP "worker"

/* Threads: everything here runs on the worker loop's thread, but for the bodies of thread-pool
 * jobs (fill_work, check_work, the pre-fault), which only read a room's prompt and touch its
 * leased pages; a room is not freed while lease.work counts a job on it. */

/*
 * A prefill room's life cycle. A room is known here from whichever comes first: the decode's
 * offer (libbaton's room callback) or the request (wk_kv_send_open). Only wk__kv_send_to moves
 * a room from one phase to another, and it refuses a move this table does not list:
 *
 *   NEW -> ORPHAN | WAITING | TOMB
 *   ORPHAN    the offer is here, the request not yet      -> MATCHED | TOMB
 *   WAITING   the request is here, the offer not yet      -> MATCHED | TOMB
 *   MATCHED   both here: layers are filled and written    -> FINISHING | ENDING | DROPPED | CLOSED
 *   FINISHING compute ended: the rest goes out, then DONE -> ENDING | DROPPED | CLOSED
 *   ENDING    DONE (or an abort) went out; the request waits for the close -> DROPPED | CLOSED
 *   DROPPED   the request let go while the room was open (aborted unless ENDING) -> CLOSED
 *   CLOSED    libbaton's last word came (terminal: freed once no thread-pool job holds it)
 *   TOMB      failed or given up, remembered for a timeout period so that a late request or
 *             offer is refused at once (terminal: freed when it expires)
 *
 * The request holds the room (may call wk_kv_send_* and gets `sent`) exactly in WAITING,
 * MATCHED, FINISHING and ENDING. The other fields that keep s alive are references, not
 * phases: xroom (libbaton's room until its close), in_map, list, lease.work.
 */
typedef enum {
    WK_SEND_NEW = 0,
    WK_SEND_ORPHAN,
    WK_SEND_WAITING,
    WK_SEND_MATCHED,
    WK_SEND_FINISHING,
    WK_SEND_ENDING,
    WK_SEND_DROPPED,
    WK_SEND_CLOSED,
    WK_SEND_TOMB,
    WK_SEND_N_PHASES
} wk_kv_send_phase_t;

/*
 * A decode room's life cycle (wk__kv_recv_to, same rule):
 *
 *   NEW -> OFFERED
 *   OFFERED   the offer is out; layers land and are checked as they do -> CHECKING | ENDED |
 *             ABORTING
 *   CHECKING  DONE came and fits; the last layers are being checked     -> GOT | ENDED
 *   GOT       the KV was verified and reported; the pages are the request's -> ENDED
 *   ABORTING  the request let go before the verdict; the abort waits for the offer's end
 *             -> ENDED
 *   ENDED     nothing more is reported (terminal: freed once no thread-pool job holds it)
 *
 * The request holds the handle exactly in OFFERED, CHECKING and GOT; the offer is open exactly
 * in OFFERED and ABORTING.
 */
typedef enum {
    WK_RECV_NEW = 0,
    WK_RECV_OFFERED,
    WK_RECV_CHECKING,
    WK_RECV_GOT,
    WK_RECV_ABORTING,
    WK_RECV_ENDED,
    WK_RECV_N_PHASES
} wk_kv_recv_phase_t;

enum { WK_KV_L_NONE = 0, WK_KV_L_ORPHANS, WK_KV_L_TOMBS, WK_KV_L_MATCHED };
/* A prefill layer's KV: not computed, being filled, filled, handed to libbaton. */
enum { WK_KV_F_NONE = 0, WK_KV_F_FILLING, WK_KV_F_FILLED, WK_KV_F_WRITTEN };

/* The prompt a room carries (either side): its token ids (owned), their count, the text seed,
 * whether a first token travels with DONE, and the pages per layer it takes. */
typedef struct wk_kv_roomp_s {
    int64_t *ids;
    uint32_t n_tokens;
    uint64_t seed;
    int want_first;
    uint32_t ppl;
    uint32_t first_page; /* decode: pages [0, first_page) come from the cache, not the wire */
    uint32_t hits[3];    /* prompt tokens the prefill found in L1, L2, L3 (DONE carries them) */
    int has_hits;        /* decode: the DONE had them */
    /* prefill: pages [loaded_first, loaded_first + loaded_n) of every layer were loaded from
     * HiCache's L2 (wk_kv_send_load_pages), not filled from the definition */
    uint32_t loaded_first, loaded_n;
} wk_kv_roomp_t;

struct wk_kv_send_s {
    wk_kv_t *kv;
    uint64_t room_id;
    wk_kv_send_phase_t phase;
    int in_map;
    int list;          /* WK_KV_L_*: which of kv's lists holds it */
    baton_list_t link; /* in that list */
    uint64_t expires_ms;
    baton_xfer_room_t *xroom; /* from the room callback until the room's close */

    void *data;
    wk_kv_matched_cb matched;
    wk_kv_sent_cb sent;
    wk_kv_roomp_t p;

    wk_kvlease_t lease;
    uint8_t *layer_st; /* WK_KV_F_* per layer */
    uint32_t n_written;
    uint32_t n_write_now;  /* layers asked to be written as soon as filled */
    int mismatch, corrupt; /* the verdict on the offer; a test fault */
    int counted;           /* the room's result went into the metrics */
    int32_t first_token;
    uint64_t t_first_write_ns, t_compute_end_ns;
    char *why; /* a mismatch's reason (owned) */
};

typedef struct wk_kv_ep_s wk_kv_ep_t; /* decode: a prefill endpoint's peer state */

struct wk_kv_recv_s {
    wk_kv_t *kv;
    uint64_t room_id;
    wk_kv_recv_phase_t phase;
    wk_kv_roomp_t p;
    wk_kvlease_t lease;
    wk_kv_recv_cb cb;
    void *data;
    wk_kv_ep_t *ep;
    int was_up;
    uint32_t up_seq;
    uint64_t t_offer_ns;
    /* from DONE */
    int32_t first_token;
    /* from the checks (one thread-pool job per layer, queued as libbaton reports the layer in
     * place, or at DONE for any layer it did not report) */
    uint8_t *layer_queued; /* per layer: its check was queued */
    uint32_t checks_pending;
    int check_failed;
    uint64_t diff;
    uint32_t bad_layer, bad_page;
    uint64_t bad_off;
};

/* One thread-pool job over layers [l0, l1) of a room's pages (a fill or a check). */
typedef struct wk_kv_work_s {
    uv_work_t req;
    wk_kv_t *kv;
    void *room; /* wk_kv_send_t (fill) or wk_kv_recv_t (check) */
    uint32_t l0, l1;
    /* check results (the thread writes them, the loop reads them after) */
    uint64_t diff, bad_off;
    uint32_t bad_layer, bad_page;
    /* a load from L2 (wk_kv_send_load_pages): the page objects (owned), called back after */
    const uint8_t **objs;
    wk_kv_loaded_cb loaded;
    void *loaded_arg;
    uint64_t ns; /* the thread's time on it */
} wk_kv_work_t;

struct wk_kv_s {
    uv_loop_t *loop;
    wk_kv_cfg_t cfg;
    baton_xfer_engine_t *eng;
    baton_xfer_mem_t *mem;
    uint8_t *base;
    uint64_t token_bytes, page_bytes;
    uint32_t n_slots;
    wk_kvpool_t pool;

    uv_idle_t defer;
    uv_timer_t tick;
    int handles_ok;   /* defer and tick may be started */
    int handles_open; /* while closing them */

    baton_u64map_t rooms;                 /* prefill: room id -> wk_kv_send_t */
    baton_list_t orphans, tombs, matched; /* of wk_kv_send_t.link, oldest first */
    wk_kv_ep_t *eps;                      /* decode: endpoints seen in peer events or offers */
    unsigned n_eps;

    unsigned work_inflight; /* thread-pool jobs (fills, checks, pre-faults) not finished */
    unsigned prefault_left;
    uint64_t prefault_bytes, prefault_t0;
    uint64_t fault_counter;
    int closing, destroying;
    void (*close_cb)(void *arg);
    void *close_arg;

    baton_metric_family_t *f_fail;
    baton_metric_child_t *m_ok, *m_failed, *m_bytes, *m_xfer, *m_tail, *m_up, *m_down, *m_reconn,
        *m_corrupt, *m_frames_rej, *m_writes_rej, *m_free, *m_used, *m_waiting, *m_auth_fail,
        *m_pending, *m_pending_bytes, *m_refused;
    baton_metric_child_t *m_skipped; /* pages (one layer's page each) not transferred: cached */
    baton_xfer_stats_t seen;
};

/* ---- kvxfer_metrics.c ---- */

/* Registers the series in `m` (NULL: none; every update below is then a no-op). */
void wk__kv_metrics_init(wk_kv_t *kv, baton_metrics_t *m);
/* The failure reason label of a status. */
const char *wk__kv_reason_of(int status);
void wk__kv_count_fail(wk_kv_t *kv, const char *reason);
void wk__kv_observe_since(baton_metric_child_t *h, uint64_t t0_ns);

/* ---- kvxfer.c: shared by both sides ---- */
/* Runs the deferred work (matched callbacks, pool waiters) on a later loop turn. */
void wk__kv_kick(wk_kv_t *kv);
/* Drops a hold / a unit of work; when that returned the slots, waiters may be served. */
void wk__kv_lease_drop(wk_kv_t *kv, wk_kvlease_t *l, unsigned hold);
void wk__kv_lease_work_done(wk_kv_t *kv, wk_kvlease_t *l);
uint8_t *wk__kv_page_addr(const wk_kv_t *kv, uint32_t layer, uint32_t slot);
uint64_t wk__kv_page_len(const wk_kv_t *kv, uint32_t n_tokens, uint32_t page);
/* The pages of layers [l0, l1) of a room (ppl slots, n_tokens), layer after layer. */
void wk__kv_room_iov(const wk_kv_t *kv, const uint32_t *slots, uint32_t ppl, uint32_t n_tokens,
                     uint32_t l0, uint32_t l1, baton_xfer_iov_t *iov);
int64_t *wk__kv_copy_ids(const wk_kv_prompt_t *pr);
/* Writes the KV of `layer` of a room's prompt into its pages (thread-pool jobs call it). */
void wk__kv_fill_layer(const wk_kv_t *kv, const uint32_t *slots, const wk_kv_roomp_t *p,
                       uint32_t layer);
/* The DONE payload (kvdone.h) describing a room's prompt and this worker's model shape. */
void wk__kv_done_encode(const wk_kv_t *kv, const wk_kv_roomp_t *p, uint8_t out[WK_KVDONE_LEN]);
/* Queues `work` over layers [l0, l1) of `room`, counted on `lease` and in work_inflight; `after`
 * must end with wk__kv_work_end. 0, BATON_ENOMEM or a libuv error. */
int wk__kv_queue_work(wk_kv_t *kv, wk_kvlease_t *lease, void *room, uint32_t l0, uint32_t l1,
                      uv_work_cb work, uv_after_work_cb after);
/* The same with the job's other fields (objs, loaded...) from `init`. */
int wk__kv_queue_work_init(wk_kv_t *kv, wk_kvlease_t *lease, void *room, uint32_t l0, uint32_t l1,
                           const wk_kv_work_t *init, uv_work_cb work, uv_after_work_cb after);
/* The loop side of a finished job: frees it and drops its work count on `lease`. */
void wk__kv_work_end(wk_kv_work_t *w, wk_kvlease_t *lease);
/* Shuts the engine down once closing and no thread-pool job runs. */
void wk__kv_maybe_destroy_engine(wk_kv_t *kv);

/* A side's phase table (common/phase.h); the two below are the tests' names for its calls. */
typedef baton_phase_table_t wk_kv_phases_t;

static inline int wk__kv_phase_legal(const wk_kv_phases_t *t, unsigned from, unsigned to)
{
    return baton_phase_legal(t, from, to);
}
static inline const char *wk__kv_phase_name(const wk_kv_phases_t *t, unsigned p)
{
    return baton_phase_name(t, p);
}

/* ---- kvxfer_send.c: the prefill side ---- */

extern const wk_kv_phases_t wk__kv_send_phases;
/* The one place a room changes phase: 0, or BATON_EINVAL (logged, phase unchanged). */
int wk__kv_send_to(wk_kv_send_t *s, wk_kv_send_phase_t to);
void wk__kv_send_on_room(baton_xfer_engine_t *eng, baton_xfer_room_t *room, void *data);
void wk__kv_send_on_room_closed(baton_xfer_engine_t *eng, baton_xfer_room_t *room, int status,
                                void *data);
/* Delivers the pending matched callbacks (the deferred-work handle). */
void wk__kv_send_deliver_matched(wk_kv_t *kv);
/* Expires orphans and tombstones (the tick timer). */
void wk__kv_send_expire(wk_kv_t *kv, uint64_t now_ms);
/* wk_kv_close: aborts the offers that wait for a request. */
void wk__kv_send_shutdown(wk_kv_t *kv);
/* The engine is gone: frees the tombstones and orphans left. */
void wk__kv_send_engine_closed(wk_kv_t *kv);

/* ---- kvxfer_recv.c: the decode side ---- */

extern const wk_kv_phases_t wk__kv_recv_phases;
int wk__kv_recv_to(wk_kv_recv_t *r, wk_kv_recv_phase_t to);
/* A peer event (decode): remembers the endpoint's state, to tell an unreachable prefill. */
void wk__kv_recv_peer_event(wk_kv_t *kv, const baton_xfer_peer_info_t *info);
void wk__kv_recv_free_eps(wk_kv_t *kv);

#endif
