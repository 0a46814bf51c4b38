/* xfer_engine_auth.c — the authenticated KV bootstrap: rogue clients, replayed handshakes
 * through a recording relay, mismatched secrets. */
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

/* ---- the authenticated KV bootstrap (shared secret) ---------------------------------------- */

#define SECRET       "kv-secret: correct horse battery staple"
#define WRONG_SECRET "kv-secret: not the one the prefill has"

/* A loopback relay between the decode engine and the prefill's bootstrap port (the control
 * connection and the tcp lanes that follow it there) that records what the decode side sends on
 * the first connection, its control connection: the "captured" handshake a rogue replays. */
#define PX_MAX 16
static struct {
    int lfd, port, target;
    volatile int stop;
    uint8_t rec[1 << 20];
    size_t rec_len;
    pthread_t th, pair_th[PX_MAX];
    int pair_fd[PX_MAX];
    int n_pairs;
} PX;

static void *proxy_pair(void *arg)
{
    int idx = (int)(intptr_t)arg;
    int a = PX.pair_fd[idx];
    int b = tcp_connect(PX.target);
    static char bufs[PX_MAX][65536];
    char *buf = bufs[idx];
    while (!PX.stop && b >= 0) {
        struct pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
        if (poll(p, 2, 20) <= 0)
            continue;
        if (p[0].revents) {
            ssize_t n = recv(a, buf, 65536, 0);
            if (n <= 0 || send(b, buf, (size_t)n, MSG_NOSIGNAL) != n)
                break;
            if (idx == 0) {
                size_t room = sizeof(PX.rec) - PX.rec_len;
                size_t keep = room < (size_t)n ? room : (size_t)n;
                memcpy(PX.rec + PX.rec_len, buf, keep);
                PX.rec_len += keep;
            }
        }
        if (p[1].revents) {
            ssize_t n = recv(b, buf, 65536, 0);
            if (n <= 0 || send(a, buf, (size_t)n, MSG_NOSIGNAL) != n)
                break;
        }
    }
    close(a);
    if (b >= 0)
        close(b);
    return NULL;
}

static void *proxy_main(void *arg)
{
    while (!PX.stop && PX.n_pairs < PX_MAX) {
        struct pollfd p = {PX.lfd, POLLIN, 0};
        if (poll(&p, 1, 20) != 1)
            continue;
        int fd = accept(PX.lfd, NULL, NULL);
        if (fd < 0)
            continue;
        int idx = PX.n_pairs;
        PX.pair_fd[idx] = fd;
        if (pthread_create(&PX.pair_th[idx], NULL, proxy_pair, (void *)(intptr_t)idx) != 0) {
            close(fd);
            continue;
        }
        PX.n_pairs++;
    }
    return NULL;
}

static void proxy_start(int target)
{
    memset(&PX, 0, sizeof(PX));
    PX.target = target;
    PX.lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    assert_int_equal(bind(PX.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(PX.lfd, 16), 0);
    getsockname(PX.lfd, (struct sockaddr *)&sa, &sl);
    PX.port = ntohs(sa.sin_port);
    assert_int_equal(pthread_create(&PX.th, NULL, proxy_main, NULL), 0);
}

static void proxy_stop(void)
{
    PX.stop = 1;
    pthread_join(PX.th, NULL);
    for (int i = 0; i < PX.n_pairs; i++)
        pthread_join(PX.pair_th[i], NULL);
    close(PX.lfd);
}

/* A rogue session on the bootstrap port: sends `len` bytes, then reads what the server sends
 * until it closes the connection. Returns the bytes received (into got, cap), -1 if the server
 * did not close it within 5 s. */
static ssize_t rogue_session(int port, const void *bytes, size_t len, uint8_t *got, size_t cap)
{
    int s = tcp_connect(port);
    assert_true(s >= 0);
    send(s, bytes, len, MSG_NOSIGNAL); /* may stop short: the server closes early */
    size_t n = 0;
    for (;;) {
        ssize_t r = recv(s, got + n, cap - n, 0);
        if (r == 0 || (r < 0 && errno == ECONNRESET))
            break;
        if (r < 0) {
            close(s);
            return -1;
        }
        n += (size_t)r;
        assert_true(n < cap);
    }
    close(s);
    return (ssize_t)n;
}

static uint64_t auth_failures(baton_xfer_engine_t *e)
{
    baton_xfer_stats_t st;
    memset(&st, 0xff, sizeof(st));
    baton_xfer_engine_stats_sized(e, &st, sizeof(st));
    return st.auth_failures;
}

/* Every frame in buf[0..len) is an AUTH RESPONSE (the only thing an unauthenticated peer may
 * get): no HELLO (transport addresses), MEM (regions, rkeys), DONE or KV bytes. Returns how many.
 */
static int only_auth_responses(const uint8_t *buf, size_t len)
{
    int n = 0;
    size_t off = 0;
    while (off < len) {
        baton__frame_t f;
        size_t used = 0;
        assert_int_equal(baton__frame_decode(buf + off, len - off, &f, &used, NULL), 0);
        assert_int_equal(f.type, BATON__F_AUTH);
        assert_int_equal(f.u.auth.step, BATON__AUTH_RESPONSE);
        assert_string_equal(f.u.auth.engine_id, "test-prefill");
        off += used;
        n++;
    }
    return n;
}

static void rooms_via(int port, uint64_t first_id, int n, uint8_t *base)
{
    droom_t rs[9] = {{0}};
    assert_true(n < 9);
    size_t slot = 16 * 1024;
    for (int i = 0; i < n; i++) {
        rs[i] = (droom_t){.id = first_id + (uint64_t)i,
                          .layers = 3,
                          .ppl = 2,
                          .page_len = 9000 + 100 * (uint32_t)i,
                          .slot = slot};
        assert_int_equal(offer_room(&rs[i], port, base + (size_t)i * 6 * slot), 0);
    }
    run_until(all_done, rs, 20000, "rooms done");
    for (int i = 0; i < n; i++)
        assert_int_equal(rs[i].status, 0);
    assert_int_equal(T.corrupt, 0);
}

/* Both engines share the secret: rooms work through a recording relay. Then rogues on the
 * prefill's bootstrap port — a HELLO without authentication, a replay of the recorded
 * handshake and rooms, an OFFER for another room, a wrong-secret proof, a flood — are all
 * refused and counted, get nothing but a RESPONSE to their challenge, and the legitimate
 * connection and its rooms carry on untouched. */
void test_kv_auth_rogues(void **state)
{
    AUTH.p = AUTH.d = SECRET;
    start_engines(BATON_XFER_TRANSPORT_TCP, BATON_XFER_TRANSPORT_TCP, 0);
    T.pmode = P_AUTO;
    int port = baton_xfer_engine_listen_port(T.p);
    proxy_start(port);
    rooms_via(PX.port, 5000, 4, T.pool);
    assert_int_equal(auth_failures(T.p), 0);
    assert_int_equal(auth_failures(T.d), 0);
    assert_int_equal(atomic_load(&AUTH.disabled_lines), 0); /* a secret: no warning */
    int rooms_before = T.rooms_seen;

    /* What the decode side sent: its CHALLENGE first, then PROOF, then HELLO, MEMs, OFFERs. */
    size_t cap_len = PX.rec_len;
    assert_true(cap_len > 0);
    baton__frame_t f;
    size_t used = 0;
    assert_int_equal(baton__frame_decode(PX.rec, cap_len, &f, &used, NULL), 0);
    assert_int_equal(f.type, BATON__F_AUTH);
    assert_int_equal(f.u.auth.step, BATON__AUTH_CHALLENGE);
    baton__auth_t challenge = f.u.auth;
    size_t used2 = 0;
    assert_int_equal(baton__frame_decode(PX.rec + used, cap_len - used, &f, &used2, NULL), 0);
    assert_int_equal(f.u.auth.step, BATON__AUTH_PROOF);
    size_t hello_off = used + used2;
    assert_int_equal(baton__frame_decode(PX.rec + hello_off, cap_len - hello_off, &f, &used, NULL),
                     0);
    assert_int_equal(f.type, BATON__F_HELLO);

    static uint8_t got[1 << 16];
    uint64_t t_rogues = uv_hrtime();
    /* 1. No secret: the captured HELLO (and everything after it) on its own. */
    ssize_t n = rogue_session(port, PX.rec + hello_off, cap_len - hello_off, got, sizeof(got));
    assert_int_equal(n, 0);
    assert_int_equal(auth_failures(T.p), 1);

    /* 2. The whole captured session replayed: a fresh nonce makes the old proof worthless. */
    n = rogue_session(port, PX.rec, cap_len, got, sizeof(got));
    assert_true(n > 0);
    assert_int_equal(only_auth_responses(got, (size_t)n), 1);
    assert_int_equal(auth_failures(T.p), 2);

    /* 3. An OFFER for another room, straight away. */
    baton_buf_t b = BATON_BUF_INIT;
    baton__offer_page_t pg = {(uint64_t)(uintptr_t)T.pool, 4096, 1};
    baton__enc_offer(&b, 777, 1, 1, 1, &pg);
    n = rogue_session(port, b.data, b.len, got, sizeof(got));
    assert_int_equal(n, 0);
    assert_int_equal(auth_failures(T.p), 3);
    baton_buf_reset(&b);

    /* 4. The protocol followed with a wrong secret: the prefill's RESPONSE proves the right one
     * (checked here with it), the rogue's PROOF fails. */
    int s = tcp_connect(port);
    assert_true(s >= 0);
    baton__auth_t a = challenge;
    strcpy(a.engine_id, "rogue");
    a.generation = 99;
    memset(a.nonce, 0x5a, sizeof(a.nonce));
    assert_int_equal(baton__enc_auth(&b, &a), 0);
    assert_int_equal(send_buf(s, &b), 0);
    baton_buf_reset(&b);
    assert_int_equal(read_frame(s, got, sizeof(got), &f), 0);
    assert_int_equal(f.type, BATON__F_AUTH);
    assert_int_equal(f.u.auth.step, BATON__AUTH_RESPONSE);
    baton__auth_party_t d = {.incarnation = a.incarnation, .generation = a.generation};
    strcpy(d.id, a.engine_id);
    memcpy(d.nonce, a.nonce, sizeof(d.nonce));
    baton__auth_party_t p = {.incarnation = f.u.auth.incarnation,
                             .generation = f.u.auth.generation};
    strcpy(p.id, f.u.auth.engine_id);
    memcpy(p.nonce, f.u.auth.nonce, sizeof(p.nonce));
    uint8_t mac[BATON__AUTH_MAC];
    assert_int_equal(baton__auth_mac((const uint8_t *)SECRET, strlen(SECRET),
                                     "baton kv-auth v1 prefill", &d, &p, mac),
                     0);
    assert_memory_equal(mac, f.u.auth.mac, sizeof(mac));
    a.step = BATON__AUTH_PROOF;
    assert_int_equal(baton__auth_mac((const uint8_t *)WRONG_SECRET, strlen(WRONG_SECRET),
                                     "baton kv-auth v1 decode", &d, &p, a.mac),
                     0);
    assert_int_equal(baton__enc_auth(&b, &a), 0);
    assert_int_equal(send_buf(s, &b), 0);
    baton_buf_reset(&b);
    char c1;
    assert_true(recv(s, &c1, 1, 0) <= 0); /* closed, nothing more sent */
    close(s);
    assert_int_equal(auth_failures(T.p), 4);

    /* 5. A flood of HELLOs: each refused and counted, the log rate-limited (at most 5 lines in
     * each second the flood and the refusals before it took, whatever the machine's speed). */
    for (int i = 0; i < 30; i++) {
        n = rogue_session(port, PX.rec + hello_off, used, got, sizeof(got));
        assert_int_equal(n, 0);
    }
    assert_int_equal(auth_failures(T.p), 34);
    uint64_t secs = (uv_hrtime() - t_rogues) / 1000000000u + 2;
    int lines = atomic_load(&AUTH.refused_lines);
    assert_true(lines >= 1 && (uint64_t)lines <= 5 * secs);
    if (lines < 34) {
        run_for(1100); /* the next window reports what was held back */
        n = rogue_session(port, PX.rec + hello_off, used, got, sizeof(got));
        assert_int_equal(n, 0);
        assert_int_equal(atomic_load(&AUTH.suppressed_lines), 1);
    }

    /* The legitimate connection never noticed: same connection, rooms go on. */
    rooms_via(PX.port, 6000, 4, T.pool + 32 * 16 * 1024);
    assert_int_equal(T.rooms_seen, rooms_before + 4); /* no room of any rogue reached the host */
    baton_xfer_stats_t st;
    baton_xfer_engine_stats(T.d, &st);
    assert_int_equal(st.reconnects, 0);
    assert_int_equal(st.peers_up, 1);
    assert_int_equal(auth_failures(T.d), 0);
    baton_buf_free(&b);
    stop_engines();
    proxy_stop();
}

/* Mismatched configurations never connect, and each refusal is counted where it is seen. */
void test_kv_auth_mismatch(void **state)
{
    baton_xfer_config_t cfg;
    baton_xfer_config_init(&cfg);
    cfg.secret = "too short";
    cfg.secret_len = 9;
    baton_xfer_engine_t *e = NULL;
    assert_int_equal(baton_xfer_engine_create(&loop, &cfg, NULL, &e), BATON_XFER_EINVAL);
    const struct {
        const char *p, *d;
    } cases[] = {{SECRET, WRONG_SECRET}, {SECRET, NULL}, {NULL, SECRET}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        AUTH.p = cases[i].p;
        AUTH.d = cases[i].d;
        atomic_store(&AUTH.disabled_lines, 0);
        start_engines(BATON_XFER_TRANSPORT_TCP, BATON_XFER_TRANSPORT_TCP, 0);
        assert_int_equal(atomic_load(&AUTH.disabled_lines), cases[i].p ? 0 : 1);
        T.pmode = P_AUTO;
        droom_t r[2] = {{.id = 90 + i, .layers = 2, .ppl = 2, .page_len = 4000, .slot = 4096}, {0}};
        assert_int_equal(offer_room(&r[0], baton_xfer_engine_listen_port(T.p), T.pool), 0);
        run_until(all_done, r, 10000, "offer refused");
        assert_int_equal(r[0].status, BATON_EPEERDOWN);
        assert_int_equal(T.rooms_seen, 0);
        /* A wrong secret is caught by the decode side (the prefill's proof fails), a missing one
         * by the prefill (HELLO or CHALLENGE it will not take). */
        if (cases[i].d && cases[i].p)
            assert_true(auth_failures(T.d) >= 1);
        else
            assert_true(auth_failures(T.p) >= 1);
        stop_engines();
    }
}
