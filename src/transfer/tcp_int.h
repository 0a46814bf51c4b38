/* transfer/tcp_int.h — the tcp transport's private types and the calls between its files
 * (tcp.c: lanes, failure, ops; tcp_send.c: the initiator's writes; tcp_recv.c: reading a lane). */
#ifndef BATON_TRANSFER_TCP_INT_H
#define BATON_TRANSFER_TCP_INT_H

#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>

#include "common/phase.h"
#include "transfer/ctrl_frame.h"
#include "transfer/tcp_stage.h"
#include "transfer/transport.h"

#define TCP_BLOB_VERSION 1
#define MAX_LANES        16
#define LANE_WINDOW      (8u << 20) /* bytes in flight per lane */
#define SCRATCH          (64u * 1024)
#define LANE_ACK_SIZE    (BATON__FRAME_HDR + 8)
#define ACK_BATCH        64 /* WACKs buffered per lane before a forced flush */

typedef struct tcp_peer_s tcp_peer_t;
typedef struct tcp_lane_s tcp_lane_t;

typedef struct {
    baton__tp_t base;
} tcp_tp_t;

typedef struct {
    baton__tp_mr_t base;
} tcp_mr_t;

/* One slice of a write: header + data, sent on one lane, acknowledged by one WACK. */
typedef struct tcp_slice_s {
    struct tcp_slice_s *next; /* pending queue or a lane's in-flight FIFO */
    uv_write_t req;
    uint8_t hdr[BATON__WRITE_HDR];
    baton__tp_write_t *w;
    const uint8_t *src;
    uint8_t *stage; /* device source: its pinned copy, held until the write callback */
    uint64_t dst;
    uint32_t page;
    uint32_t len;
    uint32_t seq;
    uint8_t dev;     /* the source is device memory */
    uint8_t written; /* libuv's write callback ran (or the slice was never sent) */
    uint8_t acked;   /* its WACK arrived (or it was cancelled) */
    int status;
} tcp_slice_t;

/* Per write request bookkeeping, kept in w->priv. */
typedef struct {
    tcp_slice_t *slices;
    uint32_t left; /* slices not finished */
    int status;    /* first error */
} tcp_wstate_t;

typedef struct {
    tcp_slice_t *head, *tail;
} slice_q_t;

/* A lane's phases (only LANE_MOVE changes them): the initiator's NONE -> CONNECTING -> HELLO ->
 * READY, the target's NONE -> READY (a lane handed over by the engine); any -> CLOSED. */
enum { LANE_NONE = 0, LANE_CONNECTING, LANE_HELLO, LANE_READY, LANE_CLOSED, LANE_N_STATES };
extern const baton_phase_table_t baton__tcp_lane_phases; /* tcp.c */
#define LANE_MOVE(l, to)                                                                           \
    (void)BATON_PHASE_MOVE(&baton__tcp_lane_phases, (l)->state, (to), "lane=%" PRIu32, (l)->index)
enum { RD_HDR = 0, RD_DATA, RD_DISCARD, RD_STAGE };

struct tcp_lane_s {
    tcp_peer_t *peer;
    uv_tcp_t *tcp;
    uv_connect_t creq;
    uv_write_t hreq;
    uint32_t index;
    int state;
    /* initiator */
    slice_q_t inflight;
    uint64_t inflight_bytes;
    uint32_t next_seq;
    /* reading */
    uint8_t rbuf[4096];
    size_t rlen;
    int rstate;
    uint8_t *dst;
    uint64_t left;
    uint8_t *stage;   /* RD_STAGE: the chunk the payload is read into, then copied to dst */
    size_t stage_len; /* bytes in it not copied yet */
    uint32_t wseq;
    uint64_t wroom;
    uint32_t wlen;
    int wstatus;
    uint8_t hello[BATON__FRAME_HDR + 20];
    /* target: WACKs of finished slices not sent yet (flushed by the peer's ack_flush) */
    size_t acks_len;
    uint8_t acks[ACK_BATCH * BATON__WACK_SIZE];
};

struct tcp_peer_s {
    baton__tp_peer_t base;
    uint32_t n_lanes;
    uint32_t lanes_ready;
    tcp_lane_t lanes[MAX_LANES];
    baton__tp_done_cb connect_cb;
    void *connect_arg;
    slice_q_t pending;
    int failed;
    int fencing;
    int open_handles;
    baton__tp_done_cb fence_cb;
    void *fence_arg;
    uint8_t *scratch;
    tcp_stage_t stage;     /* device memory: pinned bounce chunks (tcp_stage.h) */
    uv_check_t *ack_flush; /* target: sends the buffered WACKs once per loop iteration */
    int ack_flush_on;
    baton__tp_done_cb deferred_cb; /* for the connect / fence callbacks run from a defer */
    void *deferred_arg;
    int deferred_status;
};

static inline void q_push(slice_q_t *q, tcp_slice_t *s)
{
    s->next = NULL;
    if (q->tail)
        q->tail->next = s;
    else
        q->head = s;
    q->tail = s;
}

static inline tcp_slice_t *q_pop(slice_q_t *q)
{
    tcp_slice_t *s = q->head;
    if (s) {
        q->head = s->next;
        if (q->head == NULL)
            q->tail = NULL;
        s->next = NULL;
    }
    return s;
}

static inline const baton__tp_env_t *env_of(tcp_peer_t *p)
{
    return p->base.tp->env;
}

/* tcp.c: the peer fails (once; logged; reported through the connect callback while connecting,
 * else the engine's peer_failed from a defer). */
void baton__tcp_peer_fail(tcp_peer_t *p, int err, const char *why);

/* tcp_send.c: the initiator's writes. */
/* A slice written and acknowledged ends; its write completes with its last slice. */
void baton__tcp_slice_finish(tcp_slice_t *s);
/* Sends the queued slices on the lanes with room in their window. */
void baton__tcp_pump(tcp_peer_t *p);
/* The bytes of one WRITE frame's payload (a device slice's chunk has this size). */
uint64_t baton__tcp_slice_size(const baton__tp_env_t *env);
int baton__tcp_write(baton__tp_peer_t *tpp, baton__tp_write_t *w);

/* tcp_recv.c: reading a lane, and the small frames (LANE_ACK, WACKs) sent on one. */
void baton__tcp_send_small(tcp_lane_t *l, const uint8_t *frame, size_t len);
void baton__tcp_lane_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
void baton__tcp_lane_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

#endif
