/* proxy_internal.h — the proxy's module-private types: the request's phase machine, the per-loop
 * context and the cross-file functions of proxy*.c. Not for use outside src/router/proxy*.c
 * (and the proxy's unit test). */
#ifndef BATON_ROUTER_PROXY_INTERNAL_H
#define BATON_ROUTER_PROXY_INTERNAL_H

#include "common/list.h"
#include "common/phase.h"
#include "router/dataplane/pick.h"
#include "router/dataplane/proxy.h"
#include "router/dataplane/route_ctx.h"
#include "router/dataplane/token_metrics.h"
#include "http/sse.h"

/*
 * Threading: as proxy.h — everything here lives on one loop's thread.
 *
 * Files, one concern each:
 *   proxy.c          the request's phases (the one transition function), its life time, the
 *                    upstream and client events that drive it, the entry points;
 *   proxy_loop.c     shared router state, the per-loop context, its upstream pools and
 *                    housekeeping (drain deadlines, shutdown);
 *   proxy_queue.c    admission: slots and the loop's queue;
 *   proxy_dispatch.c picking workers, starting an attempt (PD pair or regular), upstream
 *                    requests and their release;
 *   proxy_relay.c    what the client gets: responses, the stream relay with back-pressure and
 *                    the logprob merge;
 *   proxy_retry.c    failures: what the client is told, retries with a new pair, deferral.
 */

#define BATON_PROXY_POOL_MAX_IDLE 64 /* idle keep-alive connections kept per (loop, worker) */
/* Client write queue above which decode is paused until the client drains it. */
#define BATON_PROXY_STREAM_HIGH_WATER (256u * 1024u)
/* A buffered (non-streamed) upstream body larger than this fails the request. */
#define BATON_PROXY_MAX_UPSTREAM_BODY ((size_t)256 << 20)
/* Answers of at most this (and max/64) still pass when the budget is full (baton__pr_account). */
#define BATON_PROXY_SMALL_ANSWER ((size_t)1 << 20)
/* Housekeeping period: drain deadlines of removed workers, queued requests re-tried. */
#define BATON_PROXY_TICK_MS 250
/* A retry that would leave less than this before the request's deadline is not started. */
#define BATON_PROXY_MIN_ATTEMPT_MS 100

/*
 * The phase of one proxied request. It changes only in baton__pr_set_phase(), which refuses
 * a transition that baton__proxy_phase_allowed() does not list.
 *
 *   NEW ──► QUEUED ──► NEW (left the queue: tries for a worker, or is answered)
 *    │
 *    ├──► SENT ──► STREAMING ◄──► HOLDING ──► HELD_END
 *    │     │  └──► WAIT_PREFILL ──► RETRY_WAIT (prefill failed: nothing was sent yet)
 *    │     └─────► RETRY_WAIT ──► SENT (the next attempt)
 *    │   STREAMING ──► RETRY_WAIT: a migration (migrate.h); its attempt is SENT with the
 *    │                 client's stream already started (ttfb_ns set), then STREAMING again
 *    │
 *   SENT and after ──► FAIL_DEFERRED (the failure waits for requests borrowing the body)
 *   NEW, SENT and after ──► ABORTED (the client went away) ──► DONE
 *   every phase but QUEUED and DONE ──► DONE (the answer went out)
 *
 * The request is freed once DONE and no upstream request of any attempt is in flight.
 */
typedef enum baton__proxy_phase_e {
    PH_NEW,           /* not queued, no attempt in flight, client not answered */
    PH_QUEUED,        /* in the loop's admission queue (the timer is the queue timeout) */
    PH_SENT,          /* an attempt is in flight; nothing went to the client yet (but for a
                       * migration's attempt: baton__pr_streamed tells) */
    PH_WAIT_PREFILL,  /* not streamed: decode's answer is in, prefill's logprobs are needed */
    PH_STREAMING,     /* the client's stream started: decode's bytes pass through */
    PH_HOLDING,       /* streaming, decode paused: an event waits for prefill's logprobs */
    PH_HELD_END,      /* decode's stream ended while events were held for prefill */
    PH_RETRY_WAIT,    /* the attempt was abandoned; the timer is the back-off before the next */
    PH_FAIL_DEFERRED, /* the failure is decided; it goes out once no upstream borrows the body */
    PH_ABORTED,       /* the client is gone; finished once nothing is in flight */
    PH_DONE,          /* the client request is finished (pr->req is NULL) */
    PH_COUNT
} baton__proxy_phase_t;

/* The phase table (proxy.c), and 1 when `from` → `to` is a legal transition in it, else 0. */
extern const baton_phase_table_t baton__proxy_phases;
int baton__proxy_phase_allowed(baton__proxy_phase_t from, baton__proxy_phase_t to);
const char *baton__proxy_phase_name(baton__proxy_phase_t ph);

enum { BATON__SPARE_PREQ, BATON__SPARE_UP, BATON__SPARE_KINDS };
#ifndef BATON_POOL_REUSE
#define BATON_POOL_REUSE 1 /* 0 in sanitizer builds (CMakeLists.txt) */
#endif
#define BATON__SPARE_MAX 64

typedef struct pool_entry_s {
    baton_worker_t *w; /* referenced while cached */
    baton_http_pool_t *pool;
} baton__pool_entry_t;

struct baton_proxy_loop_s {
    uv_loop_t *loop;
    baton_router_t *router;
    const baton_http_client_ops_t *http; /* the upstream client: the real one but in tests */
    baton__pool_entry_t *pools;
    size_t n_pools, cap_pools;
    uint64_t gen; /* registry generation the pool cache was last checked against */
    unsigned active;
    unsigned phase_refused; /* illegal transitions refused (a bug when not 0; tests check it) */
    baton_list_t live;      /* of preq_t.link: every live request of this loop, newest first */
    baton_list_t queue;     /* of preq_t.qlink: waiting for admission, FIFO */
    uv_timer_t tick;
    uv_async_t wake;
    baton_admission_waker_t waker;
    int started;
    unsigned open_handles; /* pl is freed when the last one closed */
    /* Freed per-request structs kept for the next request (baton__pl_calloc). */
    void *spare[BATON__SPARE_KINDS][BATON__SPARE_MAX];
    unsigned n_spare[BATON__SPARE_KINDS];
    struct baton_rtok_local_s *rtok; /* this loop's tokenizer side (rtok.h); made on first use */
};

/* The loop's tokenizer side, made on first use; NULL when the router has no tokenizers (or
 * out of memory: requests then go on without token ids). */
struct baton_rtok_local_s *baton__pl_rtok(baton_proxy_loop_t *pl);

/* Per-loop recycling of the per-request structs: a request on a warm loop allocates neither its
 * preq nor its upstreams. baton__pl_calloc gives a zeroed block of the kind's size (a spare or a
 * new one; NULL when out of memory); baton__pl_free keeps up to BATON__SPARE_MAX of each kind. */
void *baton__pl_calloc(baton_proxy_loop_t *pl, int kind);
void baton__pl_free(baton_proxy_loop_t *pl, int kind, void *p);

enum baton__proxy_mode { MODE_PD, MODE_REGULAR, MODE_FORWARD };
enum { UP_PREFILL = 0, UP_MAIN = 1 }; /* MAIN: decode in PD mode, the only worker otherwise */

/* What the client gets for a failure, decided before a retry is tried: if the retry finds no
 * pair, this is the answer. */
enum baton__fail_kind { FAIL_NONE, FAIL_ERROR, FAIL_PASS };
/* The request timer's handle (its use follows the phase: QUEUED or RETRY_WAIT). */
enum baton__tstate { TS_CLOSED_NEVER, TS_OPEN, TS_CLOSING };

/* The serialized body of one PD attempt, shared by its two upstream requests (the HTTP client
 * writes it without copying, so it lives until both reported on_done). */
typedef struct body_s {
    unsigned refs;
    baton_buf_t buf;
} baton__body_t;

typedef struct fail_s {
    enum baton__fail_kind kind;
    int status;
    const char *type, *code; /* static strings */
    char *msg;               /* owned; NULL: a generic message */
    char ctype[128];         /* FAIL_PASS */
    baton_buf_t body;        /* FAIL_PASS: the worker's own answer */
} baton__fail_t;

struct preq_s;
/* A PD protocol's steps (proxy_pd.h), chosen once per attempt. */
typedef struct baton__pd_ops_s baton__pd_ops_t;

#define BATON__REQID_MAX 72 /* vLLM protocols: request ids kept, NUL included */

typedef struct upstream_s {
    struct preq_s *pr;
    int side;
    baton_worker_t *w;             /* referenced */
    baton_whealth_ticket_t ticket; /* 0 once its outcome was reported (or no health layer) */
    baton_http_creq_t *creq;       /* non-NULL while in flight */
    baton__body_t *body;           /* PD: the attempt's body */
    int status;                    /* 0 until on_head */
    /* Per upstream request, not the request's phase: */
    unsigned reserved : 1;     /* holds one of w's in-flight slots */
    uint32_t tokens;           /* ... and these prompt words of its in-flight count (pick.h) */
    unsigned sse : 1;          /* Content-Type: text/event-stream */
    unsigned buffer : 1;       /* keep the body */
    unsigned cancelled : 1;    /* we cancelled it: its on_done is bookkeeping only */
    unsigned stale : 1;        /* its attempt was abandoned for a retry: freed at on_done */
    unsigned held : 1;         /* vllm-nixl prefill: answered, its blocks wait for the decode
                                * (released through `pd` when freed still set) */
    const baton__pd_ops_t *pd; /* PD: its attempt's protocol (a stale leg outlives the choice) */
    char remote_rid[BATON__REQID_MAX]; /* vllm-nixl prefill: its remote_request_id */
    /* DP ranks (dp_rank.h): the rank of w this attempt holds an in-flight count on, given back
     * when the upstream settles; dp_hdr: X-data-parallel-rank's value, "" when not sent. */
    unsigned dp_held : 1;
    int dp_rank;
    char dp_hdr[8];
    int err; /* on_done's error */
    char ctype[128];
    baton_buf_t resp;
} baton__upstream_t;

typedef struct preq_s {
    baton_proxy_loop_t *pl;
    baton_http_req_t *req; /* NULL once the client request is finished (phase DONE) */
    const char *route;
    enum baton__proxy_mode mode;
    baton__proxy_phase_t phase;    /* changed only by baton__pr_set_phase() */
    baton_pdreq_t pd;              /* PD and regular modes */
    baton__upstream_t *up[2];      /* the current attempt; NULL where unused */
    const baton__pd_ops_t *pd_ops; /* PD: the current attempt's protocol; NULL otherwise */
    unsigned pending;              /* upstream requests in flight, of every attempt */
    unsigned attempts;             /* attempts dispatched */
    uint64_t deadline_ns;          /* the whole request's deadline (uv_hrtime); 0 = none */
    baton_worker_t **avoid;        /* workers of failed attempts (referenced) */
    size_t n_avoid, cap_avoid;

    /* Flags that are not the phase: each can be set or not in several phases. */
    unsigned bp_paused : 1; /* decode paused: the client's write queue is over the watermark
                             * (back-pressure comes and goes in every streaming phase) */
    unsigned lp_ready : 1;  /* prefill finished: lp (maybe NULL) is final — prefill's own
                             * progress, independent of decode's phase */
    unsigned lp_pass : 1;   /* stream: nothing more to merge, bytes pass untouched */
    unsigned borrowed : 1;  /* an attempt sent the client's own body bytes (a resource that
                             * outlives the attempt: stale requests may still write it) */
    unsigned slot : 1;      /* holds an admission slot (a resource, from NEW to the end) */
    unsigned no_retry : 1;  /* shutting down: failures are final (a policy) */

    baton__fail_t fail;

    baton_route_ctx_t rctx; /* what the policies read (route_ctx.c); built before the first pick */
    unsigned rctx_built : 1;

    uv_timer_t timer; /* queue timeout (QUEUED) or retry back-off (RETRY_WAIT) */
    enum baton__tstate tstate;
    uint64_t queued_ns;

    baton_pdreq_lp_t *lp;
    baton_sse_splitter_t sse;
    baton_buf_t held;
    baton_buf_t scratch;
    size_t charged;  /* bytes held for this request counted in the budget (baton__pr_account) */
    size_t lp_bytes; /* size of the prefill answer pr->lp was made from (its stand-in there) */

    /* When the first response byte went to the client; 0 before. Non-zero also tells that the
     * client's stream started (a failure then goes out as an SSE event, never retried). */
    uint64_t ttfb_ns;
    uint64_t events_out;       /* SSE events relayed to the client (a Responses error's sequence) */
    size_t resp_seen;          /* /v1/responses: answer bytes searched for its id (responses.h) */
    int resp_noted;            /* ... and whether the search is over */
    baton_token_scan_t tokens; /* TTFT / inter-token latency of the relayed stream */
    struct baton_mig_s *mig;   /* a stream that can go on on another worker (migrate.h) */
    char *resp_conv;           /* /v1/responses: its conversation so far (resp_history.h) */
    baton_buf_t resp_body;     /* ... and its body with the earlier conversation as input,
                                * which pd borrows (empty: pd borrows the client's bytes) */
    char reqid[BATON__REQID_MAX]; /* vLLM protocols: X-Request-Id on both legs; "" otherwise */
    baton_list_t link;            /* in pl->live */
    baton_list_t qlink;           /* in pl->queue while QUEUED */
} baton__preq_t;

/* ---- proxy.c: phases and life time ---- */

/* Moves pr to `to`, the only place the phase changes: 0, or BATON_EINVAL (the transition is
 * not in the table: refused, logged, counted in pl->phase_refused; the phase is unchanged).
 * Leaving QUEUED or RETRY_WAIT stops the request's timer; entering DONE needs pr->req NULL. */
int baton__pr_set_phase(baton__preq_t *pr, baton__proxy_phase_t to, const char *why);
/* Brings the bytes pr holds for its peers (buffered answers, a failure passed through, the open
 * SSE event, events held for prefill, prefill's logprobs), plus `extra` about to be added, into
 * the shared budget. 0, or BATON_ETOOBIG when that takes the budget over its max (the charge
 * stays: the caller fails the leg, and the bytes are given back when pr is freed). */
int baton__pr_account(baton__preq_t *pr, size_t extra);
/* The request is answered or its answer is decided: nothing may start or retry any more. */
int baton__pr_decided(const baton__preq_t *pr);
/* The client's stream started (its answer's format is fixed: SSE). */
int baton__pr_streamed(const baton__preq_t *pr);
/* Frees pr when the client was answered, nothing is in flight and its timer closed. */
void baton__pr_maybe_free(baton__preq_t *pr);
void baton__pr_timer_start(baton__preq_t *pr, uint64_t ms);
void baton__pr_timer_stop(baton__preq_t *pr);
/* Milliseconds left before the request's deadline (UINT64_MAX: none). */
uint64_t baton__pr_ms_left(const baton__preq_t *pr, uint64_t now_ns);
/* The upstream client's callbacks (data: the baton__upstream_t): the request's events. */
void baton__proxy_on_head(baton_http_creq_t *creq, int status, const baton_http_header_t *headers,
                          size_t n_headers);
void baton__proxy_on_data(baton_http_creq_t *creq, const char *data, size_t len);
void baton__proxy_on_done(baton_http_creq_t *creq, int err);

/* ---- proxy_loop.c ---- */

/* The loop's pool for a worker, created on first use; NULL on allocation failure. */
baton_http_pool_t *baton__pool_for(baton_proxy_loop_t *pl, baton_worker_t *w);
/* Tests: the upstream client to use (before any request). */
void baton__proxy_loop_set_client_ops(baton_proxy_loop_t *pl, const baton_http_client_ops_t *ops);

/* ---- proxy_queue.c ---- */

enum baton__start_rc { ST_STARTED, ST_WAIT, ST_NOWORKER, ST_NOMEM };
/* Admission then the first attempt; ST_WAIT: no slot or every worker at its cap (no slot held
 * then). Otherwise the request was dispatched or answered. `fair`: queued requests go first. */
enum baton__start_rc baton__try_start(baton__preq_t *pr, int fair);
/* 0 (QUEUED), or BATON_EBUSY when the queue is full. */
int baton__queue_add(baton__preq_t *pr);
/* Takes pr out of the queue (back to NEW); `final`: it leaves for good (its wait is observed). */
void baton__queue_remove(baton__preq_t *pr, int final);
baton__preq_t *baton__queue_head(const baton_proxy_loop_t *pl);
void baton__queue_run(baton_proxy_loop_t *pl);
/* The queue timer fired: 503 queue_timeout. */
void baton__queue_timeout(baton__preq_t *pr);

/* ---- proxy_dispatch.c ---- */

/* Picks workers for a new attempt and dispatches it: a PD pair when both roles can be picked,
 * else a regular worker. ST_WAIT: every eligible worker of a role needed is at its cap.
 * *missing_prefill tells which role was missing for ST_NOWORKER. */
enum baton__start_rc baton__start_attempt(baton__preq_t *pr, int *missing_prefill);
baton_pick_rc_t baton__pick(baton_router_t *r, baton_worker_role_t role,
                            baton_worker_t *const *avoid, size_t n_avoid, int use_cap,
                            baton_route_ctx_t *ctx, baton_pick_t *out);

baton__upstream_t *baton__up_new(baton__preq_t *pr, int side, baton_pick_t *p);
/* Sends the upstream request; 0 (then pr->pending counts it) or an error (nothing sent). */
int baton__up_start(baton__preq_t *pr, baton__upstream_t *u, const char *method, const char *path,
                    const char *body, size_t len);
/* The same with the body as segments (http/client.h's baton_http_requestv: written with the head
 * in one writev, not copied; the bytes live until the upstream's on_done). NULL/0: no body. */
int baton__up_startv(baton__preq_t *pr, baton__upstream_t *u, const char *method, const char *path,
                     const uv_buf_t *body, unsigned n_body);
/* Reports u's breaker outcome once (the in-flight slot stays). */
void baton__up_report(baton__upstream_t *u, baton_breaker_outcome_t outcome);
/* Reports the outcome and gives back the in-flight slot. */
void baton__up_settle(baton__upstream_t *u, baton_breaker_outcome_t outcome);
/* Frees an upstream that is not in flight. */
void baton__up_free(baton__upstream_t *u);
/* Closes u's request (once); its on_done follows later. */
void baton__up_cancel(baton__upstream_t *u, const char *reason);
void baton__pr_cancel_all(baton__preq_t *pr, const char *reason);
void baton__respond_no_worker(baton__preq_t *pr, int pd_missing_prefill);
const char *baton__side_name(const baton__upstream_t *u);

/* ---- proxy_relay.c ---- */

void baton__pr_respond(baton__preq_t *pr, int status, const char *ctype, const char *body,
                       size_t len);
void baton__pr_respond_error(baton__preq_t *pr, int status, const char *message, const char *type,
                             const char *code);
void baton__pr_respond_queue_full(baton__preq_t *pr);
void baton__pr_stream_start(baton__preq_t *pr);
void baton__pr_stream_end(baton__preq_t *pr, int status_for_metrics);
/* Writes decode's (or the regular worker's) streamed bytes, merging logprobs when asked. */
void baton__relay_stream_bytes(baton__preq_t *pr, const char *data, size_t len);
/* Decode's stream ended (after any held events were released). */
void baton__relay_stream_done(baton__preq_t *pr);
/* Decode (or the regular worker) finished a buffered response: pass it on. */
void baton__relay_main_body_done(baton__preq_t *pr);
/* Prefill answered 2xx: its logprobs are final; release what waited for them. */
void baton__relay_prefill_ok(baton__preq_t *pr);
/* Pauses or resumes decode for back-pressure or held events. */
void baton__relay_update_pause(baton__preq_t *pr);
int baton__is_2xx(int status);

/* ---- proxy_retry.c ---- */

/* An upstream failed at the transport level (err < 0) or answered with a non-2xx status that
 * is this side's failure: decides the client's answer, retries or answers. */
void baton__side_failed(baton__preq_t *pr, baton__upstream_t *u, int err);
/* Decode's own non-2xx answer: passed to the client unless a retry does better. */
void baton__main_status_failed(baton__preq_t *pr, baton__upstream_t *u, const char *ctype);
void baton__finish_error(baton__preq_t *pr, int status, const char *msg, const char *type,
                         const char *code, const char *abort_reason);
/* Answers with the stored failure once no upstream borrows the client's body. */
void baton__finish_failure(baton__preq_t *pr, const char *abort_reason);
/* FAIL_DEFERRED / ABORTED: answers once nothing is in flight any more. */
void baton__run_deferred(baton__preq_t *pr);
/* The back-off passed: the next attempt, or the last failure when no pair can be picked. */
void baton__retry_fire(baton__preq_t *pr);
/* The main side's stream broke (u: its upstream) after the client's stream started: 1 when the
 * request goes on (a continuation on another worker after a back-off, or only [DONE] was
 * missing and the stream was ended), 0 when it cannot (the caller answers as before). */
int baton__try_migrate(baton__preq_t *pr, baton__upstream_t *u);
/* The main side answered 2xx SSE with `capable` (it takes continuations): starts the client's
 * stream, or goes on with it after a migration. 0, or -1 when the answer cannot continue the
 * stream (it was failed through baton__side_failed). */
int baton__stream_answer(baton__preq_t *pr, baton__upstream_t *u, int capable);
/* A decode's 5xx that reports its prefill peer's failure (not charged to either breaker). */
int baton__blames_prefill(const baton__preq_t *pr, const baton__upstream_t *u, int err);
int baton__is_timeout(int err);
void baton__fail_free(baton__fail_t *f);

#endif
