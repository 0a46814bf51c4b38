/* kvevents/sub.c — the KV-event subscriber: reads [topic, seq, payload] from a PUB socket,
 * delivers decoded batches in sequence, detects gaps and fills them from the publisher's replay
 * socket (both reply forms), reports a lost history as a reset and a malformed stream as an
 * error. Bounded: the decoder's limits, a replay's batch count and its deadline. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zmq.h>

#include "kvevents/zsock.h"

struct baton_kvev_sub {
    void *sub;
    char *replay_ep;
    baton_kvev_limits_t lim;
    int replay_timeout_ms;
    uint32_t replay_max;
    baton_kvev_sub_cb cb;
    void *ud;
    int64_t next;    /* the next sequence expected; -1 before the first */
    int64_t live_hi; /* the highest sequence seen live: one publisher's live stream only rises */
    int failed;
    baton_kvev_sub_stats_t st;
    /* The replay in progress (rd non-NULL): it runs beside the caller's loop, never blocking
     * it; the SUB socket is not read meanwhile (ZMQ keeps what arrives). */
    void *rd;
    int64_t r_start, r_first;
    int r_lost, r_sync;
    uint32_t r_got;
    long long r_deadline;
    int sync_result; /* baton_kvev_sub_synced's answer */
    struct held_s *held;
};

enum { MAX_FRAMES = 4 };

/* The live message whose gap a replay is filling, handled again once it ends. */
typedef struct held_s {
    zmq_msg_t f[MAX_FRAMES];
    int n;
} held_t;

/* One multipart message, at most MAX_FRAMES kept (more counts as malformed): the frame count, 0
 * when nothing waits (flags ZMQ_DONTWAIT), -1 on error. */
static int recv_msg(void *sock, zmq_msg_t *f, int flags)
{
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, n == 0 ? flags : 0) < 0) {
            zmq_msg_close(&m);
            for (int k = 0; k < n && k < MAX_FRAMES; k++)
                zmq_msg_close(&f[k]);
            return n == 0 && errno == EAGAIN ? 0 : -1;
        }
        more = zmq_msg_more(&m);
        if (n < MAX_FRAMES)
            f[n] = m;
        else
            zmq_msg_close(&m);
        n++;
    }
    return n;
}

static void close_msg(zmq_msg_t *f, int n)
{
    for (int k = 0; k < n && k < MAX_FRAMES; k++)
        zmq_msg_close(&f[k]);
}

static void to_frames(zmq_msg_t *f, int n, baton_kvev_frame_t *out)
{
    for (int k = 0; k < n && k < MAX_FRAMES; k++)
        out[k] = (baton_kvev_frame_t){zmq_msg_data(&f[k]), zmq_msg_size(&f[k])};
}

static void error_out(baton_kvev_sub_t *s, const char *why)
{
    if (!s->failed)
        s->cb(s->ud, BATON_KVEV_SUB_ERROR, s->next, NULL, why);
    s->failed = 1;
}

static void reset(baton_kvev_sub_t *s, const char *why)
{
    s->st.resets++;
    s->cb(s->ud, BATON_KVEV_SUB_RESET, s->next, NULL, why);
}

/* Decodes and delivers one batch of sequence seq; -1 (and ERROR) when it does not decode. */
static int deliver(baton_kvev_sub_t *s, int64_t seq, const baton_kvev_frame_t *payload)
{
    baton_kvev_batch_t b;
    char err[128];
    if (baton_kvev_decode(payload->p, payload->len, &s->lim, &b, err, sizeof(err)) < 0) {
        char why[160];
        snprintf(why, sizeof(why), "batch %lld: %s", (long long)seq, err);
        error_out(s, why);
        return -1;
    }
    s->next = seq + 1;
    s->st.last_seq = seq;
    s->st.batches++;
    s->cb(s->ud, BATON_KVEV_SUB_BATCH, seq, &b, NULL);
    baton_kvev_batch_free(&b);
    return 0;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Ends the replay in progress with rc: the first sequence the publisher had (>= its start), -1
 * when it failed or timed out, -2 after a malformed reply (ERROR delivered). A sync records its
 * answer; a gap's failure is a RESET (the batches missed are gone). */
static void replay_end(baton_kvev_sub_t *s, int64_t rc)
{
    zmq_close(s->rd);
    s->rd = NULL;
    if (rc == -1)
        s->st.replay_failures++;
    if (s->r_sync) {
        s->sync_result = rc < 0 ? -1 : rc == 0;
    } else if (rc == -1) {
        reset(s, "gap not replayed");
        s->next = -1;
    }
}

/* Asks for every buffered batch from start (lost: the caller saw a gap; a publisher whose buffer
 * no longer reaches back to start then gets a RESET first). 0 when the request went out, -1
 * when there is no replay endpoint or it could not be asked (nothing started). */
static int replay_start(baton_kvev_sub_t *s, int64_t start, int lost, int sync)
{
    if (!s->replay_ep)
        return -1;
    s->st.replays++;
    void *d = zmq_socket(baton_kvev_zctx(), ZMQ_DEALER);
    if (!d) {
        s->st.replay_failures++;
        return -1;
    }
    int linger = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof(linger));
    uint8_t s8[8];
    baton_kvev_seq_put(s8, start);
    if (zmq_connect(d, s->replay_ep) != 0 || zmq_send(d, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0 ||
        zmq_send(d, s8, 8, ZMQ_DONTWAIT) < 0) {
        zmq_close(d);
        s->st.replay_failures++;
        return -1;
    }
    s->rd = d;
    s->r_start = start;
    s->r_first = -1;
    s->r_lost = lost;
    s->r_sync = sync;
    s->r_got = 0;
    s->r_deadline = now_ms() + s->replay_timeout_ms;
    return 0;
}

/* Handles the replay replies waiting, without blocking; ends the replay at its end marker, a
 * malformed reply, its batch limit or its deadline. */
static void replay_step(baton_kvev_sub_t *s)
{
    while (s->rd) {
        zmq_msg_t f[MAX_FRAMES];
        int n = recv_msg(s->rd, f, ZMQ_DONTWAIT);
        if (n < 0) {
            replay_end(s, -1);
            return;
        }
        if (n == 0) {
            if (now_ms() >= s->r_deadline)
                replay_end(s, -1); /* timed out */
            return;
        }
        baton_kvev_frame_t fr[MAX_FRAMES];
        to_frames(f, n, fr);
        int64_t seq;
        baton_kvev_frame_t payload;
        /* The DEALER sees the ROUTER's empty delimiter first. */
        baton_kvev_msg_t m = n > MAX_FRAMES || n < 3 || fr[0].len != 0
                                 ? BATON_KVEV_MSG_BAD
                                 : baton_kvev_parse_replay(fr + 1, (size_t)n - 1, &seq, &payload);
        if (m == BATON_KVEV_MSG_END) {
            close_msg(f, n);
            /* nothing buffered from start: nothing missed */
            replay_end(s, s->r_first < 0 ? s->r_start : s->r_first);
            return;
        }
        if (m == BATON_KVEV_MSG_BAD || ++s->r_got > s->replay_max) {
            close_msg(f, n);
            error_out(s, m == BATON_KVEV_MSG_BAD ? "malformed replay reply"
                                                 : "replay longer than its limit");
            replay_end(s, -2);
            return;
        }
        if (s->r_first < 0) {
            s->r_first = seq;
            if (s->r_lost && seq > s->r_start) {
                reset(s, "gap older than the replay buffer");
                s->next = -1;
            }
        }
        int drc = seq >= s->next || s->next < 0 ? deliver(s, seq, &payload) : 0;
        close_msg(f, n);
        if (drc < 0) {
            replay_end(s, -2);
            return;
        }
    }
}

baton_kvev_sub_t *baton_kvev_sub_open(const baton_kvev_sub_opts_t *o, baton_kvev_sub_cb cb,
                                      void *ud, char *err, size_t errlen)
{
    baton_kvev_sub_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->lim = o->limits;
    if (!s->lim.max_payload)
        baton_kvev_limits_default(&s->lim);
    s->replay_timeout_ms = o->replay_timeout_ms > 0 ? o->replay_timeout_ms : 2000;
    s->replay_max = o->replay_max_batches ? o->replay_max_batches : 100000;
    s->cb = cb;
    s->ud = ud;
    s->next = -1;
    s->live_hi = -1;
    s->st.last_seq = -1;
    s->sync_result = -1;
    if (o->replay_endpoint && o->replay_endpoint[0])
        s->replay_ep = strdup(o->replay_endpoint);
    s->sub = zmq_socket(baton_kvev_zctx(), ZMQ_SUB);
    int linger = 0;
    /* The payload limit bounds what ZMQ itself buffers for one message. */
    int64_t maxmsg = (int64_t)s->lim.max_payload;
    if (!s->sub || zmq_setsockopt(s->sub, ZMQ_LINGER, &linger, sizeof(linger)) != 0 ||
        zmq_setsockopt(s->sub, ZMQ_MAXMSGSIZE, &maxmsg, sizeof(maxmsg)) != 0 ||
        zmq_setsockopt(s->sub, ZMQ_SUBSCRIBE, "", 0) != 0 ||
        zmq_connect(s->sub, o->endpoint) != 0) {
        if (err && errlen)
            snprintf(err, errlen, "cannot subscribe to %s: %s", o->endpoint, zmq_strerror(errno));
        baton_kvev_sub_close(s);
        return NULL;
    }
    return s;
}

void baton_kvev_sub_close(baton_kvev_sub_t *s)
{
    if (!s)
        return;
    if (s->sub)
        zmq_close(s->sub);
    if (s->rd)
        zmq_close(s->rd);
    free(s->replay_ep);
    if (s->held) {
        close_msg(s->held->f, s->held->n);
        free(s->held);
    }
    free(s);
}

int baton_kvev_sub_fd(baton_kvev_sub_t *s)
{
    int fd = -1;
    size_t sz = sizeof(fd);
    return zmq_getsockopt(s->sub, ZMQ_FD, &fd, &sz) == 0 ? fd : -1;
}

int baton_kvev_sub_replay_fd(baton_kvev_sub_t *s)
{
    int fd = -1;
    size_t sz = sizeof(fd);
    return s->rd && zmq_getsockopt(s->rd, ZMQ_FD, &fd, &sz) == 0 ? fd : -1;
}

void baton_kvev_sub_sync_start(baton_kvev_sub_t *s)
{
    s->sync_result = -2;
    if (s->rd || replay_start(s, 0, 0, 1) != 0)
        s->sync_result = -1;
}

int baton_kvev_sub_synced(const baton_kvev_sub_t *s)
{
    return s->sync_result;
}

int baton_kvev_sub_sync(baton_kvev_sub_t *s)
{
    baton_kvev_sub_sync_start(s);
    while (s->rd) {
        long long left = s->r_deadline - now_ms();
        zmq_pollitem_t it = {.socket = s->rd, .events = ZMQ_POLLIN};
        if (left > 0)
            zmq_poll(&it, 1, (long)left);
        replay_step(s);
    }
    return s->sync_result;
}

/* One live batch: in sequence, a gap to fill first, or a restarted publisher. 1 when a replay
 * started for its gap (the message is held and handled again when it ends). */
static int live(baton_kvev_sub_t *s, int64_t seq, const baton_kvev_frame_t *payload, int again)
{
    int64_t hi = s->live_hi;
    if (!again)
        s->live_hi = seq;
    if (!again && hi >= 0 && seq <= hi) {
        s->next = -1; /* the live stream went back: a new publisher, its history starts empty */
        reset(s, "publisher restarted");
    } else if (s->next >= 0 && seq < s->next) {
        return 0; /* already delivered by a replay */
    } else if (!again && s->next >= 0 && seq > s->next) {
        s->st.gaps++;
        if (replay_start(s, s->next, 1, 0) == 0)
            return 1;
        reset(s, "gap not replayed");
        s->next = -1;
    }
    return deliver(s, seq, payload);
}

/* Handles one message of the SUB socket (or the held one): 0 done, 1 a replay started, -1 an
 * ERROR was delivered. */
static int handle(baton_kvev_sub_t *s, zmq_msg_t *f, int n, int again)
{
    baton_kvev_frame_t fr[MAX_FRAMES] = {{0}};
    to_frames(f, n, fr);
    int64_t seq;
    baton_kvev_frame_t payload;
    if (n > MAX_FRAMES ||
        baton_kvev_parse_pub(fr, (size_t)n, &seq, &payload) != BATON_KVEV_MSG_BATCH) {
        close_msg(f, n);
        error_out(s, "malformed message (not [topic, 8-byte seq, payload])");
        return -1;
    }
    int rc = live(s, seq, &payload, again);
    if (rc == 1) {
        held_t *h = s->held ? s->held : malloc(sizeof(*h));
        if (h) {
            memcpy(h->f, f, sizeof(h->f));
            h->n = n;
            s->held = h;
            return 1;
        }
        /* out of memory: the gap's replay still comes; this batch is its last */
    }
    close_msg(f, n);
    return rc < 0 ? -1 : rc;
}

int baton_kvev_sub_poll(baton_kvev_sub_t *s)
{
    uint64_t before = s->st.batches;
    while (!s->failed) {
        if (s->rd) {
            replay_step(s);
            if (s->rd || s->failed)
                break; /* still replaying: the SUB socket waits */
        }
        if (s->held) {
            held_t *h = s->held;
            s->held = NULL;
            int rc = handle(s, h->f, h->n, 1);
            free(h);
            if (rc != 0)
                continue;
        }
        zmq_msg_t f[MAX_FRAMES];
        int n = recv_msg(s->sub, f, ZMQ_DONTWAIT);
        if (n == 0)
            break;
        if (n < 0) {
            error_out(s, "receive failed");
            break;
        }
        handle(s, f, n, 0);
    }
    return s->failed ? -1 : (int)(s->st.batches - before);
}

void baton_kvev_sub_stats(const baton_kvev_sub_t *s, baton_kvev_sub_stats_t *out)
{
    *out = s->st;
}
