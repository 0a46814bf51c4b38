/* kvevents/zsock.h — the KV-event sockets: the publisher (PUB + replay ROUTER with a bounded
 * buffer) and the subscriber (SUB with sequence-gap detection and replay through a DEALER). Each
 * object is used from one thread; its descriptor (ZMQ_FD, edge-triggered) lets a libuv loop poll
 * it, and every call drains what is waiting. */
#ifndef BATON_KVEVENTS_ZSOCK_H
#define BATON_KVEVENTS_ZSOCK_H

#include <stddef.h>
#include <stdint.h>

#include "kvevents/wire.h"

/* The process's one ZMQ context (created on first use, thread-safe). */
void *baton_kvev_zctx(void);

typedef struct baton_kvev_pub baton_kvev_pub_t;

typedef struct {
    const char *endpoint; /* PUB, bound: "tcp://127.0.0.1:5557" (port "*": any), or "ipc:..." */
    const char *replay_endpoint; /* ROUTER, bound; NULL or "": no replay */
    const char *topic;           /* NULL: "" */
    baton_kvev_encoding_t encoding;
    int reply_with_topic; /* replay replies [topic, seq, payload] (current vLLM), else [seq, payload] */
    size_t buffer_steps;  /* batches kept for replay (0: 10,000) */
    size_t buffer_bytes;  /* and their bytes (0: 64 MiB); the oldest go first */
} baton_kvev_pub_opts_t;

baton_kvev_pub_t *baton_kvev_pub_open(const baton_kvev_pub_opts_t *o, char *err, size_t errlen);
void baton_kvev_pub_close(baton_kvev_pub_t *p);
/* Encodes and publishes one batch with the next sequence number (from 0), and buffers it. */
int baton_kvev_pub_send(baton_kvev_pub_t *p, const baton_kvev_batch_t *b);
int baton_kvev_pub_send_payload(baton_kvev_pub_t *p, const void *payload, size_t len);
int64_t baton_kvev_pub_next_seq(const baton_kvev_pub_t *p);
/* The PUB (replay 0) or ROUTER (replay 1) endpoint as bound, a wildcard port ("tcp://H:*")
 * resolved: "tcp://127.0.0.1:40123"; "" when there is none. */
const char *baton_kvev_pub_endpoint(const baton_kvev_pub_t *p, int replay);
/* The replay socket's descriptor (-1 without one), and answering what requests wait there. */
int baton_kvev_pub_replay_fd(baton_kvev_pub_t *p);
int baton_kvev_pub_service(baton_kvev_pub_t *p);

typedef struct baton_kvev_sub baton_kvev_sub_t;

typedef enum {
    BATON_KVEV_SUB_BATCH = 0, /* a batch in sequence (live or replayed) */
    BATON_KVEV_SUB_RESET = 1, /* history lost (publisher restarted, gap not replayable): clear */
    BATON_KVEV_SUB_ERROR = 2, /* malformed or hostile input: drop the subscription, retry later */
} baton_kvev_sub_event_t;

/* b is valid during the call only; why is set for RESET and ERROR. */
typedef void (*baton_kvev_sub_cb)(void *ud, baton_kvev_sub_event_t ev, int64_t seq,
                                  const baton_kvev_batch_t *b, const char *why);

typedef struct {
    const char *endpoint;        /* PUB to connect to */
    const char *replay_endpoint; /* ROUTER to connect to; NULL or "": gaps reset */
    baton_kvev_limits_t limits;
    int replay_timeout_ms;        /* one replay in all (0: 2,000) */
    uint32_t replay_max_batches;  /* batches one replay may return (0: 100,000) */
} baton_kvev_sub_opts_t;

typedef struct {
    int64_t last_seq; /* -1 before the first batch */
    uint64_t batches, gaps, replays, replay_failures, resets;
} baton_kvev_sub_stats_t;

baton_kvev_sub_t *baton_kvev_sub_open(const baton_kvev_sub_opts_t *o, baton_kvev_sub_cb cb,
                                      void *ud, char *err, size_t errlen);
void baton_kvev_sub_close(baton_kvev_sub_t *s);
int baton_kvev_sub_fd(baton_kvev_sub_t *s);
/* Catches up from sequence 0 through the replay socket, blocking until it ends: 1 when the
 * history came whole from 0 (the worker's cache is known), 0 when it began later, -1 when replay
 * is unavailable (or timed out). */
int baton_kvev_sub_sync(baton_kvev_sub_t *s);
/* The same without blocking: the replay runs inside baton_kvev_sub_poll (poll the replay
 * descriptor too, and call it at least every tick: its deadline is checked there), and
 * baton_kvev_sub_synced answers -2 until it ended, then as baton_kvev_sub_sync would. */
void baton_kvev_sub_sync_start(baton_kvev_sub_t *s);
int baton_kvev_sub_synced(const baton_kvev_sub_t *s);
/* The descriptor of the replay in progress (edge-triggered as baton_kvev_sub_fd's), -1 when
 * none runs. */
int baton_kvev_sub_replay_fd(baton_kvev_sub_t *s);
/* Handles every message waiting, never blocking: a replay (a sync, or one a gap starts) goes
 * on beside the caller's loop, with the SUB socket left unread until it ends; the number of
 * batches delivered, or -1 after an ERROR was delivered (close the subscription). */
int baton_kvev_sub_poll(baton_kvev_sub_t *s);
void baton_kvev_sub_stats(const baton_kvev_sub_t *s, baton_kvev_sub_stats_t *out);

#endif
