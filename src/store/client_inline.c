/* store/client_inline.c — the store client's inline reads: a small object's bytes asked of its node
 * over a blocking control connection the calling thread holds (NODE_READ, proto.h), without
 * either side's libbaton engine; any failure leaves the read to the engine path. Also the
 * deferred completion of gets that finished inside the caller's call. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include "common/clock.h"
#include "common/log.h"
#include "store/client_int.h"

#define COMP "store"

/*
 * Threads: an inline read runs on the thread that called get — the loop's thread in loop mode;
 * in own-progress mode any host thread (a get read wholly from the location cache) or the
 * client's own thread (the rest) — and blocks it: one round trip to the node, at most
 * INLINE_WAIT_MS per socket call when the node does not answer (capped by request_timeout_ms);
 * a node that failed is then left to the engine path for INLINE_BACKOFF_MS.
 * A connection belongs to one thread while it reads (taken from its node's idle list under
 * cl->inline_lock, given back after); each node keeps at most INLINE_POOL idle. The frame buffer
 * is the reading call's own. The nodes' list only grows (freed with the client), so a node
 * stays valid without the lock; its idle list and back-off are read and written under it.
 */
#define INLINE_WAIT_MS    200
#define INLINE_BACKOFF_MS 1000
#define INLINE_POOL       4
#define REPLY_OVERHEAD    4096 /* a REPLY's body beyond its text (fixed fields, empty tables) */

struct baton__inode_s {
    struct baton__inode_s *next;
    char host[BATON__SP_HOST_MAX + 1];
    int port; /* the node's control port */
    int idle[INLINE_POOL];
    int n_idle;
    uint64_t retry_ms; /* after a failure: the engine path until then */
};

static uint32_t wait_ms(const baton_store_client_t *cl)
{
    return cl->timeout_ms < INLINE_WAIT_MS ? cl->timeout_ms : INLINE_WAIT_MS;
}

void baton__inline_free(baton_store_client_t *cl)
{
    while (cl->inodes) {
        baton__inode_t *n = cl->inodes;
        cl->inodes = n->next;
        for (int i = 0; i < n->n_idle; i++)
            close(n->idle[i]);
        free(n);
    }
}

static baton__inode_t *inode_get(baton_store_client_t *cl, const char *host, int port)
{
    uv_mutex_lock(&cl->inline_lock);
    baton__inode_t *n = cl->inodes;
    while (n && !(n->port == port && strcmp(n->host, host) == 0))
        n = n->next;
    if (n == NULL && (n = calloc(1, sizeof(*n))) != NULL) {
        snprintf(n->host, sizeof(n->host), "%s", host);
        n->port = port;
        n->next = cl->inodes;
        cl->inodes = n;
    }
    uv_mutex_unlock(&cl->inline_lock);
    return n;
}

/* An idle connection to n (-1: none), or -2 while n is left to the engines. */
static int conn_take(baton_store_client_t *cl, baton__inode_t *n, uint64_t now)
{
    uv_mutex_lock(&cl->inline_lock);
    int fd = n->retry_ms > now ? -2 : n->n_idle > 0 ? n->idle[--n->n_idle] : -1;
    uv_mutex_unlock(&cl->inline_lock);
    return fd;
}

static void conn_give(baton_store_client_t *cl, baton__inode_t *n, int fd)
{
    uv_mutex_lock(&cl->inline_lock);
    if (n->n_idle < INLINE_POOL) {
        n->idle[n->n_idle++] = fd;
        fd = -1;
    }
    uv_mutex_unlock(&cl->inline_lock);
    if (fd >= 0)
        close(fd);
}

static void back_off(baton_store_client_t *cl, baton__inode_t *n)
{
    uv_mutex_lock(&cl->inline_lock);
    n->retry_ms = baton_now_ms() + INLINE_BACKOFF_MS;
    uv_mutex_unlock(&cl->inline_lock);
}

/* ---- blocking frames ---------------------------------------------------------------------- */

static int send_msg(baton_buf_t *b, int fd, const baton__sp_msg_t *m)
{
    b->len = 0;
    int rc = baton__sp_encode(b, m);
    for (size_t at = 0; rc == 0 && at < b->len;) {
        ssize_t w = send(fd, b->data + at, b->len - at, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue; /* a signal on the calling thread */
        if (w <= 0)
            return BATON_XFER_EPEERDOWN; /* a send time-out (SO_SNDTIMEO) too */
        at += (size_t)w;
    }
    return rc;
}

/* Reads exactly one frame (the only one in flight) and decodes it into *m. */
static int recv_msg(baton_buf_t *b, int fd, uint32_t max_body, uint64_t deadline_ms,
                    baton__sp_msg_t *m)
{
    b->len = 0;
    size_t want = BATON__SP_HDR;
    int judged = 0;
    while (b->len < want) {
        if (baton_buf_reserve(b, want - b->len) != 0)
            return BATON_XFER_ENOMEM;
        ssize_t r = recv(fd, b->data + b->len, want - b->len, 0);
        if (r < 0 && errno == EINTR && baton_now_ms() <= deadline_ms)
            continue;
        if (r <= 0 || baton_now_ms() > deadline_ms)
            return r == 0 ? BATON_XFER_EPEERDOWN : BATON_XFER_ETIMEOUT;
        b->len += (size_t)r;
        if (!judged && b->len >= BATON__SP_HDR) {
            int rc = baton__sp_frame_check((uint8_t *)b->data, b->len, max_body, &want);
            if (rc != 0)
                return rc < 0 ? rc : BATON_XFER_EPROTO;
            judged = 1;
        }
    }
    return baton__sp_decode((uint8_t *)b->data, want, max_body, m);
}

/* The connector's side of the store handshake (sconn.c speaks the listener's). */
static int handshake(baton_store_client_t *cl, baton_buf_t *b, int fd, uint64_t deadline_ms)
{
    baton__sp_msg_t m, r;
    memset(&m, 0, sizeof(m));
    m.type = BATON__SP_AUTH_CHALLENGE;
    snprintf(m.id, sizeof(m.id), "%s", cl->id);
    if (getrandom(m.nonce, BATON__SP_NONCE, 0) != BATON__SP_NONCE)
        return BATON_XFER_ENODEV;
    uint8_t my_nonce[BATON__SP_NONCE], want[BATON__SP_MAC];
    memcpy(my_nonce, m.nonce, sizeof(my_nonce));
    int rc = send_msg(b, fd, &m);
    if (rc == 0)
        rc = recv_msg(b, fd, 4096, deadline_ms, &r);
    if (rc != 0)
        return rc;
    const char *lis_id = r.id[0] ? r.id : "-";
    if (r.type != BATON__SP_AUTH_RESPONSE ||
        baton__sconn_auth_mac(cl->so.secret, cl->so.secret_len, 1, cl->id, my_nonce, lis_id,
                              r.nonce, want) != 0 ||
        !baton__sconn_mac_equal(want, r.mac))
        rc = BATON_XFER_EAUTH;
    memset(&m, 0, sizeof(m));
    m.type = BATON__SP_AUTH_PROOF;
    if (rc == 0)
        rc = baton__sconn_auth_mac(cl->so.secret, cl->so.secret_len, 0, cl->id, my_nonce, lis_id,
                                   r.nonce, m.mac);
    baton__sp_msg_free(&r);
    return rc == 0 ? send_msg(b, fd, &m) : rc;
}

/* Connects within the deadline (a non-blocking connect), then blocking with SO_RCVTIMEO and
 * SO_SNDTIMEO: each read and write of the fast path is one system call. */
static int conn_open(baton_store_client_t *cl, baton_buf_t *b, const baton__inode_t *n,
                     uint64_t deadline_ms)
{
    struct sockaddr_storage sa;
    socklen_t sl = sizeof(struct sockaddr_in);
    memset(&sa, 0, sizeof(sa));
    if (inet_pton(AF_INET, n->host, &((struct sockaddr_in *)&sa)->sin_addr) == 1) {
        sa.ss_family = AF_INET;
        ((struct sockaddr_in *)&sa)->sin_port = htons((uint16_t)n->port);
    } else if (inet_pton(AF_INET6, n->host, &((struct sockaddr_in6 *)&sa)->sin6_addr) == 1) {
        sa.ss_family = AF_INET6;
        ((struct sockaddr_in6 *)&sa)->sin6_port = htons((uint16_t)n->port);
        sl = sizeof(struct sockaddr_in6);
    } else {
        return BATON_XFER_EINVAL;
    }
    int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return BATON_XFER_ENOMEM;
    int rc = connect(fd, (struct sockaddr *)&sa, sl) == 0 || errno == EINPROGRESS ? 0 : -1;
    if (rc == 0) {
        struct pollfd p = {fd, POLLOUT, 0};
        uint64_t now = baton_now_ms();
        int err = 0;
        socklen_t el = sizeof(err);
        if (now >= deadline_ms || poll(&p, 1, (int)(deadline_ms - now)) != 1 ||
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0)
            rc = -1;
    }
    int one = 1, fl = rc == 0 ? fcntl(fd, F_GETFL) : -1;
    uint32_t ms = wait_ms(cl);
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    if (rc == 0 && (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0 ||
                    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
                    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0 || fl < 0 ||
                    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0))
        rc = -1;
    if (rc == 0 && cl->so.secret && handshake(cl, b, fd, deadline_ms) != 0)
        rc = -1;
    if (rc != 0) {
        close(fd);
        return BATON_XFER_EPEERDOWN;
    }
    return fd;
}

/* ---- the read ----------------------------------------------------------------------------- */

/* One NODE_READ exchange on fd: 0 with the bytes in dst, the node's refusal (the connection
 * stays usable), or why the connection is not (it must be closed). */
static int exchange(baton_store_client_t *cl, baton_buf_t *b, int fd, const baton__slice_t *sl,
                    uint8_t *dst, uint64_t deadline, int *usable)
{
    baton__slice_t one = *sl;
    baton__sp_msg_t m, r;
    memset(&m, 0, sizeof(m));
    m.type = BATON__SP_NODE_READ;
    m.req_id = (uint32_t)atomic_fetch_add(&cl->inline_req, 1);
    m.n_slices = 1;
    m.slices = &one;
    *usable = 0;
    int rc = send_msg(b, fd, &m);
    if (rc == 0)
        rc = recv_msg(b, fd, cl->inline_max + REPLY_OVERHEAD, deadline, &r);
    if (rc != 0)
        return rc;
    if (r.type != BATON__SP_REPLY || r.req_id != m.req_id) {
        rc = BATON_XFER_EPROTO;
    } else if (r.status != 0) {
        rc = r.status; /* refused (too big, a range outside the segment) */
        *usable = 1;
    } else if (r.text_len != sl->len) {
        rc = BATON_XFER_EPROTO;
    } else {
        memcpy(dst, r.text, sl->len);
        *usable = 1;
    }
    baton__sp_msg_free(&r);
    return rc;
}

/* One slice into dst from node n: over an idle connection, and when that one turns out to be
 * closed by the node (it restarted), over a fresh one. */
static int read_slice_inline(baton_store_client_t *cl, baton_buf_t *b, baton__inode_t *n,
                             const baton__slice_t *sl, uint8_t *dst)
{
    uint64_t now = baton_now_ms(), deadline = now + wait_ms(cl);
    int fd = conn_take(cl, n, now);
    if (fd == -2)
        return BATON_XFER_EPEERDOWN;
    int rc = BATON_XFER_EPEERDOWN, usable = 0;
    for (int fresh = fd < 0; fresh < 2; fresh++) {
        if (fd < 0 && (fd = conn_open(cl, b, n, deadline)) < 0)
            break;
        rc = exchange(cl, b, fd, sl, dst, deadline, &usable);
        if (usable || rc == BATON_XFER_ETIMEOUT)
            break;
        close(fd);
        fd = -1;
    }
    if (fd >= 0 && usable)
        conn_give(cl, n, fd);
    else if (fd >= 0)
        close(fd);
    if (rc == BATON_XFER_ETOOBIG || rc == BATON_XFER_EPEERDOWN || rc == BATON_XFER_ETIMEOUT ||
        rc == BATON_XFER_EPROTO)
        back_off(cl, n);
    if (rc != 0)
        log_debug(COMP, "store_inline_read_failed node=%s:%d reason=\"%s\"", n->host, n->port,
                  baton_store_strerror(rc));
    return rc;
}

static int read_obj_inline(baton_store_client_t *cl, baton_buf_t *b, const op_t *op, oobj_t *o)
{
    if (!op->small || cl->inline_max == 0 || o->obj_len == 0 || o->n_slices == 0)
        return -1;
    for (uint32_t s = 0; s < o->n_slices; s++) {
        int rc = -1;
        for (uint32_t rep = 0; rc != 0 && rep < o->n_replicas; rep++) {
            const baton__slice_t *sl = &o->slices[(size_t)rep * o->n_slices + s];
            const baton__sp_node_t *nd = baton__op_node(op, o, sl->node);
            baton__inode_t *n = nd ? inode_get(cl, nd->host, nd->ctrl_port) : NULL;
            if (n != NULL)
                rc = read_slice_inline(cl, b, n, sl, o->addr + baton__slice_obj_off(o, s));
        }
        if (rc != 0) {
            atomic_fetch_add(&cl->inline_fallbacks, 1);
            return -1;
        }
    }
    /* Bytes that are not the object's (evicted and reused, a node that restarted on the same
     * port): the engine path reads it again, and fails the same way if they really changed. */
    if (baton_store_crc32c(0, o->addr, o->obj_len) != o->crc) {
        atomic_fetch_add(&cl->inline_fallbacks, 1);
        return -1;
    }
    atomic_fetch_add(&cl->inline_reads, 1);
    return 0;
}

int baton__inline_read(baton_store_client_t *cl, const op_t *op, oobj_t *o)
{
    baton_buf_t b = BATON_BUF_INIT;
    int rc = read_obj_inline(cl, &b, op, o);
    baton_buf_free(&b);
    return rc;
}

int baton__inline_get_here(baton_store_client_t *cl, const baton_store_obj_t *objs, size_t n,
                           baton_store_batch_cb cb, void *data)
{
    if (cl->inline_max == 0 || cl->n_locs == 0)
        return -1;
    op_t op; /* only what the reads look at: the client, small; the nodes are the objects' */
    memset(&op, 0, sizeof(op));
    op.cl = cl;
    op.n = n;
    op.o = calloc(n, sizeof(*op.o));
    baton_store_result_t *res = calloc(n, sizeof(*res));
    int rc = op.o && res ? baton__op_copy_keys(&op, NULL, objs) : -1;
    uint64_t now = baton_now_ms(), total = 0;
    size_t taken = 0;
    while (rc == 0 && taken < n && baton__loc_take(cl, &op.o[taken], now) == 0)
        total += op.o[taken++].obj_len;
    op.small = taken == n && total <= cl->inline_max;
    baton_buf_t b = BATON_BUF_INIT;
    for (size_t i = 0; rc == 0 && op.small && i < n; i++) {
        oobj_t *o = &op.o[i];
        rc = read_obj_inline(cl, &b, &op, o);
        /* the lease outlives the read, as for every get (the cache left room for it) */
        if (rc == 0 && !baton__store_lease_ok(o->lease_start_ms, o->lease_ms, baton_now_ms()))
            rc = -1;
        if (rc == 0)
            res[i] = (baton_store_result_t){0, o->obj_len, o->n_replicas};
    }
    baton_buf_free(&b);
    if (rc == 0 && op.small)
        rc = baton__own_complete(cl, res, n, n, cb, data);
    else
        rc = -1;
    for (size_t i = 0; i < taken; i++)
        baton__obj_reset(&op.o[i]);
    free(op.o);
    free(res);
    return rc == 0 ? 0 : -1;
}

void baton__client_inline_stats(const baton_store_client_t *cl, uint64_t *reads,
                                uint64_t *fallbacks)
{
    *reads = atomic_load(&cl->inline_reads);
    *fallbacks = atomic_load(&cl->inline_fallbacks);
}

/* ---- finishing after the call ---------------------------------------------------------------
 * A get whose every object was read inline is done inside the caller's call, yet its callback
 * must come later: the op waits on the client's loop for the next iteration (an idle handle,
 * started only while some wait, so the loop polls without sleeping). */

static void on_later(uv_idle_t *h)
{
    baton_store_client_t *cl = h->data;
    op_t *op = cl->later;
    cl->later = NULL; /* ops finished from these callbacks wait for the next iteration */
    uv_idle_stop(h);
    while (op) {
        op_t *next = op->later_next;
        baton__op_finish(op, cl->closing ? BATON_XFER_ESHUTDOWN : 0);
        op = next;
    }
}

int baton__op_finish_later(op_t *op)
{
    baton_store_client_t *cl = op->cl;
    if (cl->later_idle == NULL) {
        cl->later_idle = malloc(sizeof(*cl->later_idle));
        if (cl->later_idle == NULL)
            return BATON_XFER_ENOMEM;
        uv_idle_init(cl->loop, cl->later_idle);
        cl->later_idle->data = cl;
    }
    op_t **pp = &cl->later;
    while (*pp)
        pp = &(*pp)->later_next;
    op->later_next = NULL;
    *pp = op;
    uv_idle_start(cl->later_idle, on_later);
    return 0;
}

void baton__later_close(baton_store_client_t *cl)
{
    if (cl->later_idle)
        uv_close((uv_handle_t *)cl->later_idle, (uv_close_cb)free);
    cl->later_idle = NULL;
}
