/* xfer_engine_fake.c — raw-socket peers against a real engine: fake prefills (out-of-bounds
 * writes, malformed frames, layer-done), fake holders, an old prefill, the listener's caps. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "../phase_checks.h"
#include <dlfcn.h>
#include <uv.h>

#include "baton/error.h"
#include "baton/transfer.h"
#include "transfer/ctrl_frame.h"
#include "xfer_pattern.h"
#include "transfer/internal.h"
#include "xfer_engine.h"

/* ---- a fake prefill on raw sockets -------------------------------------------------------- */

static int read_full(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, 0);
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int send_buf(int fd, const baton_buf_t *b)
{
    return send(fd, b->data, b->len, MSG_NOSIGNAL) == (ssize_t)b->len ? 0 : -1;
}

/* Reads one frame (header + body) into buf; returns its decoded form. */
int read_frame(int fd, uint8_t *buf, size_t cap, baton__frame_t *f)
{
    if (read_full(fd, buf, BATON__FRAME_HDR) != 0)
        return -1;
    uint32_t len = (uint32_t)buf[8] | (uint32_t)buf[9] << 8 | (uint32_t)buf[10] << 16 |
                   (uint32_t)buf[11] << 24;
    if (len + BATON__FRAME_HDR > cap || read_full(fd, buf + BATON__FRAME_HDR, len) != 0)
        return -1;
    size_t used;
    return baton__frame_decode(buf, BATON__FRAME_HDR + len, f, &used, NULL);
}

/* What a fake prefill announces in its HELLO. */
typedef struct {
    uint16_t proto;     /* its protocol version */
    uint16_t min_proto; /* the decode's HELLO must announce at least this */
    const char *engine_id;
    uint64_t incarnation, generation;
} fake_hello_t;

/* Plays a prefill's side of the handshake on listener lfd: the decode's HELLO (proto checked),
 * this HELLO echoing its generation with one TCP lane, the decode's LANE_HELLO (its incarnation
 * and generation checked), LANE_ACK. 0 with the control and lane sockets, or -1. */
static int fake_handshake(int lfd, const fake_hello_t *fh, int *c_p, int *lane_p, uint8_t *buf,
                          size_t cap)
{
    baton__frame_t f;
    int c = accept(lfd, NULL, NULL);
    if (c < 0 || read_frame(c, buf, cap, &f) != 0 || f.type != BATON__F_HELLO ||
        f.u.hello.proto < fh->min_proto)
        return -1;
    uint64_t decode_gen = f.u.hello.generation, decode_inc = f.u.hello.incarnation;
    baton__hello_t h;
    memset(&h, 0, sizeof(h));
    h.proto = fh->proto;
    h.role = BATON__ROLE_PREFILL;
    snprintf(h.engine_id, sizeof(h.engine_id), "%s", fh->engine_id);
    h.incarnation = fh->incarnation;
    h.generation = fh->generation;
    h.echo_generation = decode_gen;
    h.heartbeat_ms = 1000;
    h.n_tp = 1;
    static const uint8_t tcp_blob[2] = {1, 1}; /* version 1, one lane */
    h.tp[0].id = BATON_XFER_TRANSPORT_TCP;
    h.tp[0].len = 2;
    h.tp[0].blob = tcp_blob;
    baton_buf_t b = BATON_BUF_INIT;
    baton__enc_hello(&b, &h);
    send_buf(c, &b);
    baton_buf_reset(&b);
    int lane = accept(lfd, NULL, NULL);
    if (lane < 0 || read_frame(lane, buf, cap, &f) != 0 || f.type != BATON__F_LANE_HELLO ||
        f.u.lane_hello.incarnation != decode_inc || f.u.lane_hello.generation != decode_gen) {
        baton_buf_free(&b);
        return -1;
    }
    baton__enc_lane_ack(&b, 0, 0);
    send_buf(lane, &b);
    baton_buf_free(&b);
    *c_p = c;
    *lane_p = lane;
    return 0;
}

/* Reads control frames (MEM ...) up to the next OFFER: its room and first page. */
static int fake_next_offer(int c, uint8_t *buf, size_t cap, baton__offer_page_t *pg, uint64_t *room)
{
    baton__frame_t f;
    for (;;) {
        if (read_frame(c, buf, cap, &f) != 0)
            return -1;
        if (f.type == BATON__F_OFFER)
            break;
    }
    *room = f.u.offer.room;
    baton__offer_page(&f.u.offer, 0, pg);
    return 0;
}

static struct {
    int lfd;
    int port;
    baton__offer_page_t page;
    uint64_t room;
    int32_t wack[8];
    int n_wack;
    int ok;
    volatile int go_garbage;
} F;

static void *fake_prefill(void *arg)
{
    static uint8_t buf[1 << 20];
    static const fake_hello_t fh = {1, 0, "fake-prefill", 77, 5};
    baton__frame_t f;
    int c, lane;
    if (fake_handshake(F.lfd, &fh, &c, &lane, buf, sizeof(buf)) != 0 ||
        fake_next_offer(c, buf, sizeof(buf), &F.page, &F.room) != 0)
        return NULL;
    baton_buf_t b = BATON_BUF_INIT;
    uint8_t data[8192];
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (uint8_t)(i * 7 + 1);
    struct {
        uint64_t room, addr;
        uint32_t page, len;
    } w[] = {
        {F.room, F.page.addr + F.page.len - 10, 0, 20}, /* runs past the page end */
        {F.room, F.page.addr - 1, 0, 4},                /* starts before it */
        {F.room, F.page.addr, 5, 4},                    /* page index out of range */
        {F.room + 1, F.page.addr, 0, 4},                /* a room that is not open */
        {F.room, F.page.addr, 0, F.page.len},           /* the good one */
    };
    for (uint32_t i = 0; i < sizeof(w) / sizeof(w[0]); i++) {
        uint8_t hdr[BATON__WRITE_HDR];
        baton__enc_write_hdr(hdr, w[i].room, w[i].addr, w[i].page, i, w[i].len);
        if (send(lane, hdr, sizeof(hdr), MSG_NOSIGNAL) != sizeof(hdr) ||
            send(lane, data, w[i].len, MSG_NOSIGNAL) != (ssize_t)w[i].len)
            return NULL;
        if (read_frame(lane, buf, sizeof(buf), &f) != 0 || f.type != BATON__F_WACK ||
            f.u.wack.seq != i)
            return NULL;
        F.wack[F.n_wack++] = f.u.wack.status;
    }
    baton__enc_done(&b, F.room, 0, (int64_t)(F.room % 1000), (const uint8_t *)&F.room, 8);
    send_buf(c, &b);
    baton_buf_reset(&b);
    for (int i = 0; !F.go_garbage; i++) {
        if (i % 50 == 0) { /* keep the decode side's liveness check happy meanwhile */
            baton__enc_heartbeat(&b, (uint64_t)i, 0);
            send_buf(c, &b);
            baton_buf_reset(&b);
        }
        usleep(1000);
    }
    /* Garbage on the control connection: the decode side must close it (and only it). */
    static const char junk[] = "GET / HTTP/1.1\r\n\r\n";
    send(c, junk, sizeof(junk) - 1, MSG_NOSIGNAL);
    char tmp[64];
    while (recv(c, tmp, sizeof(tmp), 0) > 0) {
    }
    F.ok = 1;
    close(lane);
    close(c);
    baton_buf_free(&b);
    return NULL;
}

/* A fake peer's listener on an ephemeral loopback port. */
static void fake_listen(int *lfd_p, int *port_p)
{
    *lfd_p = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    assert_int_equal(bind(*lfd_p, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(*lfd_p, 8), 0);
    getsockname(*lfd_p, (struct sockaddr *)&sa, &sl);
    *port_p = ntohs(sa.sin_port);
}

void test_fake_prefill_bounds_and_garbage(void **state)
{
    memset(&F, 0, sizeof(F));
    fake_listen(&F.lfd, &F.port);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fake_prefill, NULL), 0);

    /* A real prefill engine too: the fake peer's misbehaviour must not touch it. */
    start_engines(BATON_XFER_TRANSPORT_TCP, BATON_XFER_TRANSPORT_TCP, 0);
    T.pmode = P_AUTO;
    droom_t r[2] = {{.id = 31337, .layers = 1, .ppl = 1, .page_len = 4096, .slot = 8192}, {0}};
    assert_int_equal(offer_room(&r[0], F.port, T.pool), 0);
    run_until(all_done, r, 10000, "room from the fake prefill");
    assert_int_equal(r[0].status, 0);
    assert_int_equal(F.n_wack, 5);
    assert_int_equal(F.wack[0], BATON_ERKEY);
    assert_int_equal(F.wack[1], BATON_ERKEY);
    assert_int_equal(F.wack[2], BATON_ERKEY);
    assert_int_equal(F.wack[3], BATON_ENOTFOUND);
    assert_int_equal(F.wack[4], 0);
    /* on_offer_done compared the page with the pattern source; here the fake sent its own
     * bytes, so check them directly, and that nothing landed around the page. */
    T.corrupt = 0;
    for (size_t i = 0; i < 4096; i++)
        assert_int_equal(T.pool[i], (uint8_t)(i * 7 + 1));
    for (size_t i = 4096; i < 8192 + 4096; i++)
        assert_int_equal(T.pool[i], XFER_POISON);
    baton_xfer_stats_t st;
    baton_xfer_engine_stats(T.d, &st);
    assert_int_equal(st.writes_rejected, 3);

    /* Garbage from the fake peer: its connection is closed, the real peer keeps working. */
    droom_t ok[2] = {{.id = 4242, .layers = 2, .ppl = 3, .page_len = 3000, .slot = 4096}, {0}};
    memset(T.pool + 65536, XFER_POISON, 6 * 4096);
    assert_int_equal(offer_room(&ok[0], baton_xfer_engine_listen_port(T.p), T.pool + 65536), 0);
    F.go_garbage = 1;
    run_until(all_done, ok, 10000, "room on the real peer");
    assert_int_equal(ok[0].status, 0);
    assert_int_equal(T.corrupt, 0);
    pthread_join(th, NULL);
    assert_int_equal(F.ok, 1);
    baton_xfer_engine_stats(T.d, &st);
    assert_true(st.frames_rejected >= 1);
    close(F.lfd);
}

/* A fake proto-2 prefill: LAYER_DONE for an unknown room is ignored, a valid one fires the layer
 * callback once, before the room's completion, with the bytes in place; a duplicate LAYER_DONE
 * closes the connection (the open room fails once, after the fence, with BATON_EPROTO). */
static struct {
    int lfd, port, ok;
    uint64_t room1, room2;
    uint16_t proto; /* what the fake announces; 0: BATON__PROTO_VERSION */
} G;

static int g_handshake(int *c_p, int *lane_p, uint8_t *buf, size_t cap)
{
    const fake_hello_t fh = {G.proto ? G.proto : BATON__PROTO_VERSION, BATON__PROTO_LAYER_DONE,
                             "fake-prefill-2", 78, 6};
    return fake_handshake(G.lfd, &fh, c_p, lane_p, buf, cap);
}

static void *fake_prefill_layers(void *arg)
{
    static uint8_t buf[1 << 20];
    int c, lane;
    baton__frame_t f;
    baton__offer_page_t pg;
    if (g_handshake(&c, &lane, buf, sizeof(buf)) != 0 ||
        fake_next_offer(c, buf, sizeof(buf), &pg, &G.room1) != 0)
        return NULL;
    uint8_t data[4096];
    memset(data, 0x3C, sizeof(data));
    uint8_t hdr[BATON__WRITE_HDR];
    baton__enc_write_hdr(hdr, G.room1, pg.addr, 0, 1, pg.len);
    if (send(lane, hdr, sizeof(hdr), MSG_NOSIGNAL) != sizeof(hdr) ||
        send(lane, data, pg.len, MSG_NOSIGNAL) != (ssize_t)pg.len ||
        read_frame(lane, buf, sizeof(buf), &f) != 0 || f.type != BATON__F_WACK ||
        f.u.wack.status != 0)
        return NULL;
    baton_buf_t b = BATON_BUF_INIT;
    baton__enc_layer_done(&b, G.room1 + 1000, 0); /* not a room of this connection: ignored */
    baton__enc_layer_done(&b, G.room1, 0);
    baton__enc_done(&b, G.room1, 0, (int64_t)(G.room1 % 1000), (const uint8_t *)&G.room1, 8);
    send_buf(c, &b);
    baton_buf_reset(&b);
    if (fake_next_offer(c, buf, sizeof(buf), &pg, &G.room2) != 0)
        return NULL;
    baton__enc_layer_done(&b, G.room2, 0);
    baton__enc_layer_done(&b, G.room2, 0); /* duplicate: a broken peer */
    send_buf(c, &b);
    baton_buf_free(&b);
    char tmp[256];
    while (recv(c, tmp, sizeof(tmp), 0) > 0) { /* until the decode side closes it */
    }
    G.ok = 1;
    close(lane);
    close(c);
    return NULL;
}

static int g_layer_cbs[2], g_layer_after_done[2];
static droom_t *g_rooms;

static void on_layer_count(void *data, uint64_t room_id, uint32_t layer)
{
    check_not_inside();
    droom_t *r = data;
    int i = (int)(r - g_rooms);
    assert_int_equal(layer, 0);
    if (r->done)
        g_layer_after_done[i]++;
    g_layer_cbs[i]++;
    if (i == 0) /* the fake writes room 555's page only */
        for (uint32_t k = 0; k < r->page_len; k++)
            assert_int_equal(r->base[k], 0x3C); /* the bytes are in place */
}

void test_fake_prefill_layer_done(void **state)
{
    memset(&G, 0, sizeof(G));
    memset(g_layer_cbs, 0, sizeof(g_layer_cbs));
    memset(g_layer_after_done, 0, sizeof(g_layer_after_done));
    pthread_t th;
    fake_listen(&G.lfd, &G.port);
    assert_int_equal(pthread_create(&th, NULL, fake_prefill_layers, NULL), 0);
    start_engines(BATON_XFER_TRANSPORT_TCP, BATON_XFER_TRANSPORT_TCP, 0);
    droom_t r[3] = {{.id = 555, .layers = 2, .ppl = 1, .page_len = 4096, .slot = 8192},
                    {.id = 556, .layers = 2, .ppl = 1, .page_len = 4096, .slot = 8192},
                    {0}};
    g_rooms = r;
    assert_int_equal(offer_room_cb(&r[0], G.port, T.pool, on_layer_count), 0);
    WAIT_INT(T.offers_done, 1, 10000);
    assert_int_equal(r[0].status, 0);
    assert_int_equal(g_layer_cbs[0], 1);
    assert_int_equal(g_layer_after_done[0], 0);
    T.corrupt = 0; /* the fake's bytes are not the pattern on_offer_done compares */
    assert_int_equal(offer_room_cb(&r[1], G.port, T.pool + 65536, on_layer_count), 0);
    run_until(all_done, r, 10000, "room 556");
    /* as for any malformed frame: the connection's rooms fail with the protocol error */
    assert_int_equal(r[1].status, BATON_EPROTO);
    pthread_join(th, NULL);
    assert_int_equal(G.ok, 1);
    baton_xfer_stats_t st;
    baton_xfer_engine_stats(T.d, &st);
    assert_true(st.frames_rejected >= 1);
    close(G.lfd);
}

/* A fake proto-4 holder answers pulls with GRANT over tcp (it never would: tcp pulls are
 * written), which lets the puller's refusals of a grant be seen without a NIC: a grant for a
 * room it does not have is ignored; a grant of the wrong shape is refused (EPROTO) and one its
 * transport cannot read is refused (ENOTSUP), before anything is read, each with READ_DONE
 * carrying that status. The fake records the READ_DONE statuses. */
static int32_t g_read_done[2] = {1, 1};

static void *fake_granting_holder(void *arg)
{
    static uint8_t buf[1 << 20];
    int c, lane;
    baton__frame_t f;
    baton__offer_page_t pg;
    if (g_handshake(&c, &lane, buf, sizeof(buf)) != 0)
        return NULL;
    for (int k = 0; k < 2; k++) {
        if (fake_next_offer(c, buf, sizeof(buf), &pg, k ? &G.room2 : &G.room1) != 0)
            return NULL;
        /* room 1: the shape of the offer (1 page); room 2: one page too many */
        baton__offer_page_t gsrc[2] = {{0x100000, pg.len, 5}, {0x200000, pg.len, 5}};
        baton_buf_t b = BATON_BUF_INIT;
        baton__enc_grant(&b, 424242, 0, 1, NULL, 0, 1, gsrc); /* no such room: ignored */
        baton__enc_grant(&b, k ? G.room2 : G.room1, 0, 7, (const uint8_t *)"x", 1, k ? 2 : 1, gsrc);
        send_buf(c, &b);
        baton_buf_free(&b);
        for (;;) {
            if (read_frame(c, buf, sizeof(buf), &f) != 0)
                return NULL;
            if (f.type == BATON__F_READ_DONE) {
                g_read_done[k] = f.u.read_done.status;
                break;
            }
        }
    }
    G.ok = 1;
    close(lane);
    close(c);
    return NULL;
}

void test_puller_refuses_bad_grants(void **state)
{
    memset(&G, 0, sizeof(G));
    pthread_t th;
    fake_listen(&G.lfd, &G.port);
    assert_int_equal(pthread_create(&th, NULL, fake_granting_holder, NULL), 0);
    start_engines(BATON_XFER_TRANSPORT_TCP, BATON_XFER_TRANSPORT_TCP, 0);
    droom_t r[2] = {{.id = 701, .layers = 1, .ppl = 1, .page_len = 4096, .slot = 8192},
                    {.id = 702, .layers = 1, .ppl = 1, .page_len = 4096, .slot = 8192}};
    memset(T.pool, 0x11, 16384);
    assert_int_equal(offer_room(&r[0], G.port, T.pool), 0);
    WAIT_INT(T.offers_done, 1, 10000);
    assert_int_equal(r[0].status, BATON_XFER_ENOTSUP); /* tcp cannot READ: refused, unread */
    assert_int_equal(offer_room(&r[1], G.port, T.pool + 8192), 0);
    WAIT_INT(T.offers_done, 2, 10000);
    assert_int_equal(r[1].status, BATON_XFER_EPROTO); /* two source pages for one page */
    pthread_join(th, NULL);
    assert_int_equal(G.ok, 1);
    assert_int_equal(g_read_done[0], BATON_XFER_ENOTSUP);
    assert_int_equal(g_read_done[1], BATON_XFER_EPROTO);
    for (size_t i = 0; i < 16384; i++) /* nothing was placed in the pages */
        assert_int_equal(T.pool[i], 0x11);
    close(G.lfd);
}

/* A proto-2 prefill cannot skip pages: it records the first OFFER it gets, then hangs up. */
static uint32_t g_old_first_page = UINT32_MAX;

static void *fake_old_prefill(void *arg)
{
    static uint8_t buf[1 << 20];
    int c, lane;
    baton__frame_t f;
    if (g_handshake(&c, &lane, buf, sizeof(buf)) != 0)
        return NULL;
    for (;;) {
        if (read_frame(c, buf, sizeof(buf), &f) != 0)
            break;
        if (f.type == BATON__F_OFFER) {
            G.room1 = f.u.offer.room;
            g_old_first_page = f.u.offer.first_page;
            G.ok = 1;
            break;
        }
    }
    close(lane);
    close(c);
    return NULL;
}

/* A partial offer to a prefill of control proto 2 fails with ENOTSUP before anything goes on the
 * wire (an older engine would refuse OFFER's length and drop the connection); a full offer
 * after it still reaches that peer, unchanged. */
void test_partial_offer_to_old_prefill(void **state)
{
    memset(&G, 0, sizeof(G));
    G.proto = BATON__PROTO_FIRST_PAGE - 1;
    pthread_t th;
    fake_listen(&G.lfd, &G.port);
    assert_int_equal(pthread_create(&th, NULL, fake_old_prefill, NULL), 0);
    start_engines(BATON_XFER_TRANSPORT_TCP, BATON_XFER_TRANSPORT_TCP, 0);
    droom_t r[2] = {{.id = 601, .layers = 1, .ppl = 2, .page_len = 4096, .slot = 8192},
                    {.id = 602, .layers = 1, .ppl = 2, .page_len = 4096, .slot = 8192}};
    baton_xfer_iov_t iov = {T.pool + 8192, 4096}; /* page 1 only: page 0 is cached */
    baton_xfer_offer_t o = {r[0].id, 1, 2, &iov, NULL};
    baton_xfer_offer_opts_t opts;
    baton_xfer_offer_opts_init(&opts);
    opts.first_page = 1;
    assert_int_equal(
        API(baton_xfer_offer_ex(T.d, "127.0.0.1", G.port, &o, &opts, on_offer_done, &r[0])), 0);
    WAIT_INT(T.offers_done, 1, 10000);
    assert_int_equal(r[0].status, BATON_ENOTSUP);
    assert_int_equal(offer_room(&r[1], G.port, T.pool + 65536), 0);
    WAIT_INT(T.offers_done, 2, 10000); /* the fake hangs up after the OFFER */
    pthread_join(th, NULL);
    assert_int_equal(G.ok, 1);
    assert_int_equal(G.room1, r[1].id); /* the partial room never went on the wire */
    assert_int_equal(g_old_first_page, 0);
    assert_int_not_equal(r[1].status, 0);
    close(G.lfd);
}

/* Raw clients sending bad frames to a prefill engine: each is dropped, nothing else changes. */
void test_prefill_refuses_bad_frames(void **state)
{
    start_engines(BATON_XFER_TRANSPORT_TCP, BATON_XFER_TRANSPORT_TCP, 0);
    T.pmode = P_AUTO;
    int port = baton_xfer_engine_listen_port(T.p);
    baton_buf_t b = BATON_BUF_INIT;
    baton__offer_page_t pg = {0x1000, 10, 1};
    baton__enc_offer(&b, 1, 1, 1, 1, &pg); /* OFFER before HELLO: out of order */
    uint8_t oversized[BATON__FRAME_HDR];
    memcpy(oversized, b.data, BATON__FRAME_HDR);
    oversized[6] = BATON__F_HELLO;
    oversized[8] = oversized[9] = oversized[10] = 0xff; /* huge length */
    oversized[11] = 0x7f;
    const struct {
        const void *p;
        size_t len;
    } bad[] = {{b.data, b.len}, {oversized, sizeof(oversized)}, {"\x00\x01garbage!!", 10}};
    for (size_t i = 0; i < 3; i++) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET,
                                 .sin_port = htons((uint16_t)port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        assert_int_equal(connect(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
        assert_int_equal(send(s, bad[i].p, bad[i].len, MSG_NOSIGNAL), (ssize_t)bad[i].len);
        /* Drive the engines until the server closes this socket. */
        struct timeval tv = {0, 20000};
        setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        int closed = 0;
        for (int k = 0; k < 250 && !closed; k++) {
            char c;
            ssize_t n = recv(s, &c, 1, 0);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
                closed = 1;
            uv_run(&loop, UV_RUN_NOWAIT);
        }
        assert_true(closed);
        close(s);
    }
    baton_buf_free(&b);
    baton_xfer_stats_t st;
    baton_xfer_engine_stats(T.p, &st);
    assert_int_equal(st.frames_rejected, 3);
    droom_t r[2] = {{.id = 55, .layers = 3, .ppl = 2, .page_len = 7777, .slot = 8192}, {0}};
    assert_int_equal(offer_room(&r[0], port, T.pool), 0);
    run_until(all_done, r, 10000, "room after bad clients");
    assert_int_equal(r[0].status, 0);
    assert_int_equal(T.corrupt, 0);
}

static baton_xfer_stats_t prefill_stats(void)
{
    baton_xfer_stats_t st;
    memset(&st, 0xff, sizeof(st));
    baton_xfer_engine_stats_sized(T.p, &st, sizeof(st));
    return st;
}

static int refused_at_least(void *arg)
{
    return prefill_stats().conns_refused >= (uint64_t)(intptr_t)arg;
}

static int pending_is(void *arg)
{
    return prefill_stats().pending_conns == (uint64_t)(intptr_t)arg;
}

int tcp_connect(int port)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (s < 0 || connect(s, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        if (s >= 0)
            close(s);
        return -1;
    }
    struct timeval tv = {5, 0}; /* a server that never answers cannot hang the test */
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return s;
}

/* The listener before a handshake ends: connections over the per-address cap are closed at
 * once, a frame other than a handshake's is refused from its header, read buffers stay within
 * their budget, and the engines' own rooms go on. */
void test_listener_pending_caps(void **state)
{
    T.max_pending = 8;
    T.max_pending_per_addr = 3;
    T.pending_buffer_bytes = 16384;
    start_engines(BATON_XFER_TRANSPORT_TCP, BATON_XFER_TRANSPORT_TCP, 0);
    T.pmode = P_AUTO;
    int port = baton_xfer_engine_listen_port(T.p);
    int socks[6];
    for (int i = 0; i < 6; i++) {
        socks[i] = tcp_connect(port);
        assert_true(socks[i] >= 0);
        assert_int_equal(send(socks[i], "BATN", 4, MSG_NOSIGNAL), 4); /* one read: charged */
    }
    run_until(refused_at_least, (void *)(intptr_t)3, 10000, "three connections refused");
    baton_xfer_stats_t st = prefill_stats();
    assert_int_equal(st.pending_conns, 3);
    assert_true(st.pending_bytes > 0 && st.pending_bytes <= 16384);
    for (int i = 0; i < 6; i++)
        close(socks[i]);
    run_until(pending_is, (void *)0, 10000, "pending connections released");
    assert_int_equal(prefill_stats().pending_bytes, 0);

    /* A 2 MiB OFFER header: closed before any of its body arrives. */
    baton_buf_t b = BATON_BUF_INIT;
    assert_int_equal(baton__enc_heartbeat(&b, 1, 1), 0);
    uint8_t hdr[BATON__FRAME_HDR];
    memcpy(hdr, b.data, sizeof(hdr));
    baton_buf_free(&b);
    hdr[6] = BATON__F_OFFER;
    uint32_t len = 2u << 20;
    memcpy(hdr + 8, &len, 4); /* little-endian host, as the wire */
    uint64_t rejected = prefill_stats().frames_rejected;
    int s = tcp_connect(port);
    assert_true(s >= 0);
    assert_int_equal(send(s, hdr, sizeof(hdr), MSG_NOSIGNAL), (ssize_t)sizeof(hdr));
    char c;
    assert_int_equal(recv(s, &c, 1, 0), 0); /* closed by the engine, not by a time-out */
    close(s);
    assert_int_equal(prefill_stats().frames_rejected, rejected + 1);

    droom_t r[2] = {{.id = 56, .layers = 3, .ppl = 2, .page_len = 7777, .slot = 8192}, {0}};
    assert_int_equal(offer_room(&r[0], port, T.pool), 0);
    run_until(all_done, r, 10000, "a room after the refusals");
    assert_int_equal(r[0].status, 0);
    assert_int_equal(T.corrupt, 0);
}
