/* sched.h — the simulated engine's timing model: prefill batches, decode steps, queues, in
 * virtual time so it can be tested without a loop. */
#ifndef BATON_WORKER_SCHED_H
#define BATON_WORKER_SCHED_H

#include <stdint.h>

#include "common/list.h"

/*
 * The engine runs one step at a time on a virtual timeline (nanoseconds):
 *   - prefill step: when sequences wait for prefill and fewer than max_batch are running, up to
 *     (max_batch - running) of them, in arrival order; it costs sum(prompt_tokens -
 *     cached_tokens) × prefill_ns_per_token (a prefix cache hit is not computed again).
 *     Prefill goes before decode.
 *   - decode step: otherwise, sequences waiting in the ready queue join the running set (up to
 *     max_batch), and one step of decode_ns_per_step produces one token for every running
 *     sequence.
 * A step's members are fixed when it starts; new arrivals wait for the next boundary.
 * Layer-wise prefill (wk_sched_set_layers): a prefill step computes its L layers one after the
 * other, each taking 1/L of the step; as layer k ends, on_layer(seq, k) runs for every member
 * (the last layer's at the step end, just before on_prefilled), so a caller can hand each layer
 * off while the next ones are still being computed. A step
 * that ends at T is followed by the next one starting at T (so throughput does not depend on
 * how late the loop noticed); a step started from idle begins at the `now` given to poll.
 *
 * Ownership: the scheduler never allocates per sequence; wk_seq_t is embedded in the owner's
 * object and must stay valid until it has left the scheduler (a callback returned 0, or
 * wk_sched_cancel). Single-threaded: call everything from the owning loop's thread.
 */

typedef struct wk_sched_s wk_sched_t;
typedef struct wk_seq_s wk_seq_t;

typedef enum {
    WK_SEQ_IDLE = 0,  /* not in the scheduler */
    WK_SEQ_PREFILL_Q, /* waiting for prefill */
    WK_SEQ_READY_Q,   /* waiting for a running slot (decode mode) */
    WK_SEQ_RUNNING,   /* decoding, between steps */
    WK_SEQ_IN_STEP,   /* member of the step in progress */
} wk_seq_where_t;

struct wk_seq_s {
    baton_list_t link;      /* scheduler's */
    wk_seq_where_t where;   /* scheduler's; read-only for the owner */
    unsigned slot;          /* scheduler's */
    uint32_t prompt_tokens; /* set by the owner before submitting */
    uint32_t cached_tokens; /* of prompt_tokens, found in the prefix cache: not charged */
    void *data;             /* owner's */
};

/*
 * Callbacks run inside wk_sched_poll, with the sequence already out of every queue. Return 1 to
 * keep the sequence (it joins or stays in the running set), 0 when it leaves the scheduler (the
 * owner may then free it, even inside the callback). A callback may cancel other sequences and
 * submit new ones; it must not call wk_sched_poll.
 */
typedef int (*wk_sched_prefilled_cb)(wk_sched_t *s, wk_seq_t *seq);
typedef int (*wk_sched_decoded_cb)(wk_sched_t *s, wk_seq_t *seq);
/* Layer `layer` of a prefill step member is computed. The sequence stays in the step; the
 * callback may cancel it (or others). */
typedef void (*wk_sched_layer_cb)(wk_sched_t *s, wk_seq_t *seq, uint32_t layer);

typedef struct wk_sched_cfg_s {
    uint64_t prefill_ns_per_token;
    uint64_t decode_ns_per_step;
    unsigned max_batch; /* >= 1 */
} wk_sched_cfg_t;

typedef struct wk_seq_list_s {
    baton_list_t q; /* of wk_seq_t.link, oldest first */
    unsigned n;
} wk_seq_list_t;

typedef enum { WK_STEP_NONE = 0, WK_STEP_PREFILL, WK_STEP_DECODE } wk_step_kind_t;

struct wk_sched_s {
    wk_sched_cfg_t cfg;
    wk_sched_prefilled_cb on_prefilled;
    wk_sched_decoded_cb on_decoded;
    wk_sched_layer_cb on_layer; /* NULL: no layer events */
    uint32_t layers;            /* >= 1 when on_layer is set */
    void *data;                 /* owner's */

    wk_seq_list_t prefill_q, ready_q, running;
    wk_step_kind_t step_kind;
    uint64_t step_start, step_end; /* virtual ns */
    wk_seq_t **step;               /* max_batch slots */
    unsigned step_n;
    uint32_t layer_next; /* prefill step: the next layer to report */

    /* counters (for metrics and tests) */
    uint64_t prefill_steps, decode_steps;
    uint64_t prefill_tokens, decode_tokens;
};

#define WK_SCHED_IDLE UINT64_MAX

/* Returns 0, BATON_EINVAL (max_batch 0) or BATON_ENOMEM. */
int wk_sched_init(wk_sched_t *s, const wk_sched_cfg_t *cfg, wk_sched_prefilled_cb on_prefilled,
                  wk_sched_decoded_cb on_decoded, void *data);
/* Turns layer events on (layers >= 1, cb not NULL) or off (cb NULL). Call between steps. */
void wk_sched_set_layers(wk_sched_t *s, uint32_t layers, wk_sched_layer_cb cb);
/* When layer `layer` (< layers) of the prefill step in progress ends (virtual ns). */
uint64_t wk_sched_layer_end(const wk_sched_t *s, uint32_t layer);
/* Every sequence must have left before. */
void wk_sched_free(wk_sched_t *s);

void wk_sched_submit_prefill(wk_sched_t *s, wk_seq_t *seq);
void wk_sched_submit_decode(wk_sched_t *s, wk_seq_t *seq);
/* Takes the sequence out at once, wherever it is; no callback for it follows. */
void wk_sched_cancel(wk_sched_t *s, wk_seq_t *seq);

/*
 * Completes every step that ends at or before `now` (at most max_steps of them), reports the
 * layers that ended, and starts the next step. Returns when the next event is due (a layer or
 * the step end; <= now when max_steps cut the work short: call again soon), or WK_SCHED_IDLE
 * when there is nothing to do.
 */
uint64_t wk_sched_poll(wk_sched_t *s, uint64_t now, unsigned max_steps);

/* Sequences waiting (prefill and ready queues); running (the running set and the members of the
 * step in progress, prefill included); whether a step is in progress. */
unsigned wk_sched_waiting(const wk_sched_t *s);
unsigned wk_sched_running(const wk_sched_t *s);
int wk_sched_busy(const wk_sched_t *s);

#endif
