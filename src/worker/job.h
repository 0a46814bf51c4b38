/* job.h — one generation request's life cycle inside baton-worker (private to src/worker):
 * its phases, its sequences, the answer, failures; job_pd.c holds the KV hand-off steps. */
#ifndef BATON_WORKER_JOB_H
#define BATON_WORKER_JOB_H

#include <stddef.h>
#include <stdint.h>

#include "common/list.h"
#include "common/phase.h"
#include "http/server.h"
#include "worker/render.h"
#include "worker/request.h"
#include "worker/simtext.h"
#include "worker/worker.h"

/*
 * Everything here runs on the worker's loop thread. A job owns its HTTP request until it
 * answers it (exactly once: the full answer, an error, or the end of the stream) and is freed
 * right after, in the same call; so a job pointer is never kept past a callback that may end it.
 *
 * A job's phases; only wk_job_to moves a job, and it refuses a move this table does not list:
 *
 *   NEW       parsed and admitted                  -> RUNNING (regular) | MATCHING (prefill) |
 *                                                     PAGES (decode) | FAILED | ABORTED
 *   MATCHING  prefill: every room opened, waiting for every decode's offer -> PAGES | FAILED |
 *             ABORTED
 *   PAGES     PD: waiting for the KV page slots of every sequence (maybe queued in the pool)
 *             -> RUNNING (prefill) | RECEIVING (decode) | FAILED | ABORTED
 *   RECEIVING decode: every room offered, the KV on its way and checked -> RUNNING | FAILED |
 *             ABORTED
 *   RUNNING   in the scheduler: prefill (and the KV going out) or decode steps -> DONE |
 *             FAILED | ABORTED
 *   DONE, FAILED, ABORTED  answered (the full answer / an error / the client left): terminal
 *
 * MATCHING, PAGES and RECEIVING are the rendezvous: the job is in the worker's FIFO of
 * deadlines exactly while in them (wk_job_to links and unlinks it); a deadline that passes in
 * PAGES answers 503 kv_pool_exhausted, in the others 504 bootstrap_timeout.
 *
 * A sequence's phases (wk_seq_to; it also keeps the worker's gauges of waiting and handed-off
 * sequences):
 *
 *   NEW      -> RUNNING (regular) | KV_WAIT (PD) | GONE
 *   KV_WAIT  PD: its room is not there yet (counted in n_kv_waiting) -> MATCHED (prefill) |
 *            KV_IN (decode) | GONE
 *   MATCHED  prefill: its room met its offer (still counted waiting) -> RUNNING | GONE
 *   KV_IN    decode: its KV arrived and was verified -> RUNNING | DONE | GONE
 *   RUNNING  in the scheduler -> HANDOFF (prefill) | DONE | GONE
 *   HANDOFF  prefill: computed, its KV going out (counted in n_boot_pub); a vllm-nixl
 *            prefill: its KV being exported for the decode's pull -> DONE | GONE
 *   DONE     finished; GONE  taken out because the job ended otherwise: terminal
 */
typedef enum {
    WK_JOB_NEW = 0,
    WK_JOB_MATCHING,
    WK_JOB_PAGES,
    WK_JOB_RECEIVING,
    WK_JOB_RUNNING,
    WK_JOB_DONE,
    WK_JOB_FAILED,
    WK_JOB_ABORTED,
    WK_JOB_N_PHASES
} wk_job_phase_t;

typedef enum {
    WK_SS_NEW = 0,
    WK_SS_KV_WAIT,
    WK_SS_MATCHED,
    WK_SS_KV_IN,
    WK_SS_RUNNING,
    WK_SS_HANDOFF,
    WK_SS_DONE,
    WK_SS_GONE,
    WK_SS_N_PHASES
} wk_seq_phase_t;

/* One sequence of a job: scheduler entry, generator, KV room, stream position. */
typedef struct wk_sstate_s {
    wk_seq_t seq;
    wk_job_t *job;
    size_t index;
    wk_seq_phase_t phase;
    wk_gen_t gen;
    wk_stream_state_t st;
    wk_kv_recv_t *recv;          /* decode: its room, until the sequence ends */
    wk_kv_send_t *send;          /* prefill: its room, until DONE went out */
    struct wk_vllm_hold_s *hold; /* vllm-nixl prefill: its exported pages, until the answer */
    int32_t first_token;
    wk_pcache_hold_t cache_hold; /* the cached prefix it reads, held until prefilled or freed */
} wk_sstate_t;

struct wk_job_s {
    wk_worker_t *w;
    baton_http_req_t *http;
    wk_job_phase_t phase;
    wk_request_t req;
    wk_sstate_t *ss;
    const wk_gen_t **gens;
    char id[48];
    uint32_t resp_seq;   /* Responses API stream: the next event's sequence_number */
    struct json_t *conv; /* Responses API: the conversation this response continues */
    long long created;
    uint64_t start_ns;
    size_t n_done, n_booted, n_matched;
    int streaming; /* the SSE response has started: failures end the stream, not a status */
    int ttft_seen;
    int catchup; /* a continuation: sequences behind the others catch up before the next token */
    const char *route;
    baton_list_t link; /* in w->jobs */

    /* KV page slots for every sequence of the job, reserved at once */
    wk_kv_resv_t resv;
    uint32_t *slots;
    uint32_t n_slots;

    /* the rendezvous deadline (bootstrap timeout), in the worker's FIFO of deadlines */
    baton_list_t dl_link; /* in w->deadlines while linked (points at itself otherwise) */
    uint64_t deadline_ms;

    struct wk_vllm_hb_s *hb; /* vllm-nixl decode: lease heartbeats until its KV is in */
};

/* The job's and the sequence's phase tables (common/phase.h; exported for the tests). */
typedef baton_phase_table_t wk_phase_table_t;
extern const wk_phase_table_t wk_job_phases, wk_seq_phases;
static inline int wk_phase_legal(const wk_phase_table_t *t, unsigned from, unsigned to)
{
    return baton_phase_legal(t, from, to);
}

/* ---- job.c ---- */

/* A generation request (a route of http_api.c): parses, admits or refuses (answering at once),
 * then starts a job that answers later. */
void wk_job_handle(wk_worker_t *w, baton_http_req_t *http, wk_api_t api);
/* The one place a job / a sequence changes phase: 0, or BATON_EINVAL (logged, unchanged). */
int wk_job_to(wk_job_t *job, wk_job_phase_t to);
int wk_seq_to(wk_sstate_t *ss, wk_seq_phase_t to);
/* Shutdown: a job still here after the server closed (a bug worth a line) is let go. */
void wk_job_leftover(wk_job_t *job);
/* The drain's deadline: every job still here is answered 503 shutting_down (a stream: its error
 * event and end), so that its client gets an answer rather than a cut connection. */
void wk_job_fail_all_shutdown(wk_worker_t *w);

/* The scheduler's callbacks (worker.c registers them). */
int wk_job_on_prefilled(wk_sched_t *s, wk_seq_t *seq);
int wk_job_on_decoded(wk_sched_t *s, wk_seq_t *seq);

/* Used by job_pd.c. */
void wk__job_fail_err(wk_job_t *job, int err, const char *what, const char *detail);
void wk__job_fail_reason(wk_job_t *job, int status, const char *message, const char *code,
                         const char *reason);
int wk__job_seq_push(wk_sstate_t *ss, int32_t token, const char *what);
int wk__job_seq_finish(wk_sstate_t *ss);
void wk__job_complete(wk_job_t *job);
/* Every sequence goes into the scheduler's prefill queue (phase RUNNING). */
void wk__job_submit_prefill(wk_job_t *job);

/* ---- job_cache.c: the prefix cache's side of a job ---- */

/* Looks each sequence's prompt up in the cache: sets items[i].cached_tokens and the
 * scheduler's cached_tokens (not charged), holding the matched pages. No-op without a cache. */
void wk__job_cache_match(wk_job_t *job);
/* The sequence's prompt KV exists now (prefilled, or received by a decode that finished it):
 * its pages go into the cache and the held prefix is released. */
void wk__job_cache_store(wk_sstate_t *ss);
/* Releases whatever the job's sequences still hold (the job is being freed). */
void wk__job_cache_release(wk_job_t *job);
/* The prompt's token ids: a token-id prompt's own, or a text's word ids in a new array that
 * *tmp_p owns (free it; NULL when nothing was allocated). 0 or BATON_ENOMEM. */
int wk__item_ids(const wk_item_t *it, const int64_t **ids_p, int64_t **tmp_p);

/* ---- job_pd.c: the KV hand-off steps of a PD job ---- */

/* Opens the rooms (prefill) or reserves the pages and offers the rooms (decode). */
void wk__job_pd_start(wk_job_t *job);
/* The KV prompt of an item (its ids, or the ids of its text); *tmp_p is to free after use. */
int wk__job_item_prompt(const wk_item_t *it, wk_kv_prompt_t *pr, int64_t **tmp_p);
/* Prefill: the sequence was computed; its KV goes out and the answer waits for DONE. */
void wk__job_pd_prefilled(wk_sstate_t *ss);
/* The scheduler's layer callback (prefill): the layer's KV exists now. */
void wk_job_on_layer(wk_sched_t *s, wk_seq_t *seq, uint32_t layer);

#endif
