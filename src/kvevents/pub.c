/* kvevents/pub.c — the KV-event publisher: a ZMQ PUB socket sending [topic, seq, payload] and a
 * ROUTER socket answering replay requests from a bounded buffer of the last batches, in either
 * reply form. Single-threaded: the owner calls send and service from one thread. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "kvevents/zsock.h"

static void *g_ctx;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void ctx_init(void)
{
    g_ctx = zmq_ctx_new();
}

void *baton_kvev_zctx(void)
{
    pthread_once(&g_once, ctx_init);
    return g_ctx;
}

typedef struct {
    int64_t seq;
    char *data;
    size_t len;
} slot_t;

struct baton_kvev_pub {
    void *pub, *replay;
    char topic[64];
    char ep[2][256]; /* the endpoints as bound (a wildcard port resolved) */
    int reply_topic; /* reply [topic, seq, payload] (current vLLM) or [seq, payload] */
    baton_kvev_encoding_t enc;
    slot_t *ring;
    size_t cap, head, count, bytes, max_bytes;
    int64_t next_seq;
    uint64_t replays_served;
};

static void set_err(char *err, size_t errlen, const char *what, const char *ep)
{
    if (err && errlen)
        snprintf(err, errlen, "%s %s: %s", what, ep, zmq_strerror(errno));
}

baton_kvev_pub_t *baton_kvev_pub_open(const baton_kvev_pub_opts_t *o, char *err, size_t errlen)
{
    baton_kvev_pub_t *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    void *ctx = baton_kvev_zctx();
    snprintf(p->topic, sizeof(p->topic), "%s", o->topic ? o->topic : "");
    p->reply_topic = o->reply_with_topic;
    p->enc = o->encoding;
    p->cap = o->buffer_steps ? o->buffer_steps : 10000;
    p->max_bytes = o->buffer_bytes ? o->buffer_bytes : (64u << 20);
    p->ring = calloc(p->cap, sizeof(*p->ring));
    p->pub = zmq_socket(ctx, ZMQ_PUB);
    if (!p->ring || !p->pub) {
        set_err(err, errlen, "socket", "PUB");
        baton_kvev_pub_close(p);
        return NULL;
    }
    int linger = 0, hwm = 100000;
    zmq_setsockopt(p->pub, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(p->pub, ZMQ_SNDHWM, &hwm, sizeof(hwm));
    if (zmq_bind(p->pub, o->endpoint) != 0) {
        set_err(err, errlen, "cannot bind", o->endpoint);
        baton_kvev_pub_close(p);
        return NULL;
    }
    size_t len = sizeof(p->ep[0]);
    zmq_getsockopt(p->pub, ZMQ_LAST_ENDPOINT, p->ep[0], &len);
    if (o->replay_endpoint && o->replay_endpoint[0]) {
        p->replay = zmq_socket(ctx, ZMQ_ROUTER);
        if (!p->replay || (zmq_setsockopt(p->replay, ZMQ_LINGER, &linger, sizeof(linger)),
                           zmq_bind(p->replay, o->replay_endpoint)) != 0) {
            set_err(err, errlen, "cannot bind", o->replay_endpoint);
            baton_kvev_pub_close(p);
            return NULL;
        }
        len = sizeof(p->ep[1]);
        zmq_getsockopt(p->replay, ZMQ_LAST_ENDPOINT, p->ep[1], &len);
    }
    return p;
}

void baton_kvev_pub_close(baton_kvev_pub_t *p)
{
    if (!p)
        return;
    if (p->pub)
        zmq_close(p->pub);
    if (p->replay)
        zmq_close(p->replay);
    for (size_t k = 0; p->ring && k < p->count; k++)
        free(p->ring[(p->head + k) % p->cap].data);
    free(p->ring);
    free(p);
}

/* Frees the oldest buffered batch. */
static void drop_oldest(baton_kvev_pub_t *p)
{
    slot_t *s = &p->ring[p->head];
    p->bytes -= s->len;
    free(s->data);
    s->data = NULL;
    p->head = (p->head + 1) % p->cap;
    p->count--;
}

int baton_kvev_pub_send_payload(baton_kvev_pub_t *p, const void *payload, size_t len)
{
    uint8_t seq[8];
    baton_kvev_seq_put(seq, p->next_seq);
    if (zmq_send(p->pub, p->topic, strlen(p->topic), ZMQ_SNDMORE) < 0 ||
        zmq_send(p->pub, seq, 8, ZMQ_SNDMORE) < 0 || zmq_send(p->pub, payload, len, 0) < 0)
        return -1;
    char *copy = malloc(len ? len : 1);
    if (copy) {
        memcpy(copy, payload, len);
        while (p->count && (p->count == p->cap || p->bytes + len > p->max_bytes))
            drop_oldest(p);
        p->ring[(p->head + p->count) % p->cap] = (slot_t){p->next_seq, copy, len};
        p->count++;
        p->bytes += len;
    }
    p->next_seq++;
    return 0;
}

int baton_kvev_pub_send(baton_kvev_pub_t *p, const baton_kvev_batch_t *b)
{
    baton_buf_t out = BATON_BUF_INIT;
    int rc = baton_kvev_encode(b, p->enc, &out) == 0 ? baton_kvev_pub_send_payload(p, out.data, out.len) : -1;
    baton_buf_free(&out);
    return rc;
}

const char *baton_kvev_pub_endpoint(const baton_kvev_pub_t *p, int replay)
{
    return p->ep[replay ? 1 : 0];
}

int64_t baton_kvev_pub_next_seq(const baton_kvev_pub_t *p)
{
    return p->next_seq;
}

int baton_kvev_pub_replay_fd(baton_kvev_pub_t *p)
{
    int fd = -1;
    size_t sz = sizeof(fd);
    if (!p->replay || zmq_getsockopt(p->replay, ZMQ_FD, &fd, &sz) != 0)
        return -1;
    return fd;
}

/* Sends one reply of the configured form: [identity, "", (topic,) seq, payload]. */
static int reply(baton_kvev_pub_t *p, const zmq_msg_t *id, int64_t seq, const void *d, size_t n)
{
    uint8_t s8[8];
    baton_kvev_seq_put(s8, seq);
    const char *topic = seq < 0 ? "" : p->topic;
    if (zmq_send(p->replay, zmq_msg_data((zmq_msg_t *)id), zmq_msg_size(id), ZMQ_SNDMORE) < 0 ||
        zmq_send(p->replay, "", 0, ZMQ_SNDMORE) < 0)
        return -1;
    if (p->reply_topic && zmq_send(p->replay, topic, strlen(topic), ZMQ_SNDMORE) < 0)
        return -1;
    if (zmq_send(p->replay, s8, 8, ZMQ_SNDMORE) < 0 || zmq_send(p->replay, d, n, 0) < 0)
        return -1;
    return 0;
}

/* Reads one whole multipart message (at most max frames kept; the rest discarded). Returns the
 * number of frames, 0 when none is waiting, -1 on error. */
static int recv_frames(void *sock, zmq_msg_t *f, int max)
{
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, n == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            zmq_msg_close(&m);
            return n == 0 && errno == EAGAIN ? 0 : -1;
        }
        more = zmq_msg_more(&m);
        if (n < max)
            f[n] = m;
        else
            zmq_msg_close(&m);
        n++;
    }
    return n;
}

int baton_kvev_pub_service(baton_kvev_pub_t *p)
{
    int served = 0;
    while (p->replay) {
        zmq_msg_t f[4];
        int n = recv_frames(p->replay, f, 4);
        if (n <= 0)
            break;
        int64_t start;
        int kept = n < 4 ? n : 4;
        /* [identity, "", start seq]: anything else is ignored, as vLLM does. */
        if (n == 3 && zmq_msg_size(&f[1]) == 0 &&
            baton_kvev_seq_get(zmq_msg_data(&f[2]), zmq_msg_size(&f[2]), &start) == 0) {
            for (size_t k = 0; k < p->count; k++) {
                const slot_t *s = &p->ring[(p->head + k) % p->cap];
                if (s->seq >= start && reply(p, &f[0], s->seq, s->data, s->len) < 0)
                    break;
            }
            reply(p, &f[0], -1, "", 0);
            p->replays_served++;
            served++;
        }
        for (int k = 0; k < kept; k++)
            zmq_msg_close(&f[k]);
    }
    return served;
}
