/* test_xfer_pull.c — libbaton's pull mode (transfer.h "pull mode") over tcp and shm: two engines
 * on one caller loop, a holder that exports pages and a puller that fetches them; every byte
 * checked, the export's callback exactly once (pulled, timeout), refusals that leave the export
 * waiting, release, and an unexported key reaching the application as an ordinary offer. Served
 * rooms (baton_xfer_engine_serve): one-page offers answered on the holder's progress thread from
 * a region, the application never seeing them; declined ones reaching room_cb, refused and
 * out-of-range ones aborted, offers of another shape never asked about. Forgetting a peer
 * (baton_xfer_forget): at once when idle, only after its last room when one is open. */
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <uv.h>

#include "baton/transfer.h"

#define N_LAYERS 3
#define N_PAGES  5
#define PAGE_LEN (48u * 1024 + 16) /* not a multiple of the slice: the tail matters */
#define LEN      ((size_t)N_LAYERS * N_PAGES * PAGE_LEN)
#define WAIT_MS  30000

typedef struct pt_s {
    uv_loop_t loop;
    baton_xfer_engine_t *holder, *puller;
    baton_xfer_mem_t *src, *dst;
    int app_rooms, app_closed; /* what the holder's application saw */
    int export_cbs, export_status;
    uint64_t export_key;
    int offer_cbs, offer_status;
    int64_t first_token;
    char payload[16];
    int closed;
    atomic_int serve_calls; /* the holder's progress thread */
    int hold;               /* on_room keeps the room (held) instead of aborting it */
    baton_xfer_room_t *held;
} pt_t;

static uint8_t pattern(size_t i)
{
    return (uint8_t)((i * 131u) ^ (i >> 9) ^ 0x5a);
}

static void on_room(baton_xfer_engine_t *eng, baton_xfer_room_t *room, void *data)
{
    pt_t *t = data;
    (void)eng;
    t->app_rooms++;
    if (t->hold) {
        t->held = room;
        return;
    }
    baton_xfer_room_abort(room, BATON_XFER_EABORTED); /* this application serves no offers */
}

static void on_room_closed(baton_xfer_engine_t *eng, baton_xfer_room_t *room, int status,
                           void *data)
{
    (void)eng;
    (void)room;
    (void)status;
    ((pt_t *)data)->app_closed++;
}

static void on_export(baton_xfer_engine_t *eng, uint64_t key, int status, void *data)
{
    pt_t *t = data;
    assert_ptr_equal(eng, t->holder);
    t->export_cbs++;
    t->export_status = status;
    t->export_key = key;
}

static void on_offer(void *data, uint64_t room_id, int status, const baton_xfer_done_t *done)
{
    pt_t *t = data;
    (void)room_id;
    t->offer_cbs++;
    t->offer_status = status;
    if (status == 0) {
        t->first_token = done->first_token;
        assert_true(done->payload_len < sizeof(t->payload));
        memcpy(t->payload, done->payload, done->payload_len);
        t->payload[done->payload_len] = '\0';
    }
}

static void on_closed(baton_xfer_engine_t *eng, void *data)
{
    (void)eng;
    ((pt_t *)data)->closed++;
}

static void run_until(pt_t *t, int *counter, int want)
{
    uint64_t deadline = uv_hrtime() / 1000000 + WAIT_MS;
    while (*counter < want) {
        if (uv_hrtime() / 1000000 > deadline)
            fail_msg("timed out");
        uv_run(&t->loop, UV_RUN_ONCE);
    }
}

/* Runs the loop until the holder's engine counts `rooms` rooms done (any, when 0) and
 * `bytes` bytes written: it counts them on its own thread when the room closes, which may be
 * after the puller's callback. */
static void wait_holder_counts(pt_t *t, uint64_t rooms, uint64_t bytes)
{
    uint64_t deadline = uv_hrtime() / 1000000 + WAIT_MS;
    baton_xfer_stats_t st;
    for (;;) {
        baton_xfer_engine_stats(t->holder, &st);
        if ((rooms == 0 || st.rooms_done == rooms) && st.bytes_written == bytes)
            return;
        if (uv_hrtime() / 1000000 > deadline)
            fail_msg("holder: rooms_done %llu bytes_written %llu",
                     (unsigned long long)st.rooms_done, (unsigned long long)st.bytes_written);
        uv_run(&t->loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
}

static void setup(pt_t *t, baton_xfer_transport_t tp)
{
    memset(t, 0, sizeof(*t));
    assert_int_equal(uv_loop_init(&t->loop), 0);
    baton_xfer_config_t cfg;
    baton_xfer_config_init(&cfg);
    cfg.transports[0] = tp;
    cfg.n_transports = 1;
    cfg.engine_id = "holder";
    cfg.listen_host = "127.0.0.1";
    cfg.listen_port = 0;
    baton_xfer_callbacks_t cbs = {on_room, on_room_closed, NULL, t};
    assert_int_equal(baton_xfer_engine_create(&t->loop, &cfg, &cbs, &t->holder), 0);
    baton_xfer_config_init(&cfg);
    cfg.transports[0] = tp;
    cfg.n_transports = 1;
    cfg.engine_id = "puller";
    baton_xfer_callbacks_t none = {NULL, NULL, NULL, NULL};
    assert_int_equal(baton_xfer_engine_create(&t->loop, &cfg, &none, &t->puller), 0);
    assert_int_equal(baton_xfer_mem_alloc(t->holder, LEN, &t->src), 0);
    assert_int_equal(baton_xfer_mem_alloc(t->puller, LEN, &t->dst), 0);
    uint8_t *p = baton_xfer_mem_addr(t->src);
    for (size_t i = 0; i < LEN; i++)
        p[i] = pattern(i);
}

static void teardown(pt_t *t)
{
    assert_int_equal(baton_xfer_mem_deregister(t->holder, t->src), 0);
    assert_int_equal(baton_xfer_mem_deregister(t->puller, t->dst), 0);
    baton_xfer_engine_destroy(t->holder, on_closed, t);
    baton_xfer_engine_destroy(t->puller, on_closed, t);
    run_until(t, &t->closed, 2);
    assert_int_equal(uv_loop_close(&t->loop), 0);
}

static int do_export(pt_t *t, uint64_t key, uint32_t timeout_ms)
{
    baton_xfer_iov_t src[N_LAYERS * N_PAGES];
    uint8_t *base = baton_xfer_mem_addr(t->src);
    for (int j = 0; j < N_LAYERS * N_PAGES; j++)
        src[j] = (baton_xfer_iov_t){base + (size_t)j * PAGE_LEN, PAGE_LEN};
    baton_xfer_export_t ex = {key, N_LAYERS,   N_PAGES,
                              src, timeout_ms, {0, 4242, (const uint8_t *)"held-kv", 7}};
    return baton_xfer_export(t->holder, &ex, on_export, t);
}

/* Pulls `key` into the puller's pages; ppl != N_PAGES makes a pull of another shape. */
static int do_pull(pt_t *t, uint64_t key, uint32_t ppl)
{
    baton_xfer_iov_t pages[N_LAYERS * N_PAGES];
    uint8_t *base = baton_xfer_mem_addr(t->dst);
    for (uint32_t j = 0; j < N_LAYERS * ppl; j++)
        pages[j] = (baton_xfer_iov_t){base + (size_t)j * PAGE_LEN, PAGE_LEN};
    baton_xfer_offer_t offer = {key, N_LAYERS, ppl, pages, NULL};
    return baton_xfer_pull(t->puller, "127.0.0.1", baton_xfer_engine_listen_port(t->holder), &offer,
                           on_offer, t);
}

static void pull_mode(baton_xfer_transport_t tp)
{
    pt_t t;
    setup(&t, tp);
    /* arguments */
    assert_int_equal(baton_xfer_export(t.holder, NULL, on_export, &t), BATON_XFER_EINVAL);
    assert_int_equal(do_export(&t, 7, 0), 0);
    assert_int_equal(do_export(&t, 7, 0), BATON_XFER_EEXIST);
    assert_int_equal(baton_xfer_export_release(t.holder, 8), BATON_XFER_ENOTFOUND);

    /* a pull of another shape is refused; the export keeps waiting */
    assert_int_equal(do_pull(&t, 7, N_PAGES - 1), 0);
    run_until(&t, &t.offer_cbs, 1);
    assert_int_equal(t.offer_status, BATON_XFER_EABORTED);
    assert_int_equal(t.export_cbs, 0);

    /* the pull: every byte in place, DONE's payload, the export's callback once */
    assert_int_equal(do_pull(&t, 7, N_PAGES), 0);
    run_until(&t, &t.export_cbs, 1);
    run_until(&t, &t.offer_cbs, 2);
    assert_int_equal(t.offer_status, 0);
    assert_int_equal(t.export_status, 0);
    assert_int_equal(t.export_key, 7);
    assert_int_equal(t.first_token, 4242);
    assert_string_equal(t.payload, "held-kv");
    assert_memory_equal(baton_xfer_mem_addr(t.dst), baton_xfer_mem_addr(t.src), LEN);
    assert_int_equal(t.app_rooms, 0); /* the application never saw the pulls */
    assert_int_equal(t.app_closed, 0);
    wait_holder_counts(&t, 0, LEN);
    /* the export is over: the key is free again */
    assert_int_equal(baton_xfer_export_release(t.holder, 7), BATON_XFER_ENOTFOUND);

    /* no pull in time: ETIMEOUT; a later pull of that key is an ordinary offer (the
     * application aborts it here) */
    assert_int_equal(do_export(&t, 9, 50), 0);
    run_until(&t, &t.export_cbs, 2);
    assert_int_equal(t.export_status, BATON_XFER_ETIMEOUT);
    assert_int_equal(t.export_key, 9);
    assert_int_equal(do_pull(&t, 9, N_PAGES), 0);
    run_until(&t, &t.offer_cbs, 3);
    assert_int_equal(t.offer_status, BATON_XFER_EABORTED);
    assert_int_equal(t.app_rooms, 1);

    /* release: no callback; the key can be exported again */
    assert_int_equal(do_export(&t, 11, 0), 0);
    assert_int_equal(baton_xfer_export_release(t.holder, 11), 0);
    assert_int_equal(do_export(&t, 11, 0), 0);
    /* destroy drops the waiting export without a callback */
    teardown(&t);
    assert_int_equal(t.export_cbs, 2);
}

static void test_pull_tcp(void **state)
{
    (void)state;
    pull_mode(BATON_XFER_TRANSPORT_TCP);
}

static void test_pull_shm(void **state)
{
    (void)state;
    pull_mode(BATON_XFER_TRANSPORT_SHM);
}

/* ---- served rooms ---- */

#define DECLINE_ID 0xdec1u /* the serve callback sends these to room_cb */
#define REFUSE_ID  0xbadu  /* and refuses these */

/* The room id is the offset into the holder's region (a store node's scheme, simplified). */
static int serve(void *data, uint64_t room_id, uint64_t len, baton_xfer_mem_t **mem_p,
                 uint64_t *off_p)
{
    pt_t *t = data;
    (void)len;
    atomic_fetch_add(&t->serve_calls, 1);
    if (room_id == DECLINE_ID)
        return 1;
    if (room_id == REFUSE_ID)
        return BATON_XFER_ERKEY;
    *mem_p = t->src;
    *off_p = room_id; /* may be out of range: the engine checks */
    return 0;
}

/* Offers n_pages pages of PAGE_LEN (one layer) at the start of dst; returns the room's status. */
static int offer_pages(pt_t *t, uint64_t room_id, uint32_t n_pages)
{
    baton_xfer_iov_t pages[2];
    uint8_t *d = baton_xfer_mem_addr(t->dst);
    for (uint32_t i = 0; i < n_pages; i++)
        pages[i] = (baton_xfer_iov_t){d + (size_t)i * PAGE_LEN, PAGE_LEN};
    baton_xfer_offer_t o = {room_id, 1, n_pages, pages, NULL};
    int want = t->offer_cbs + 1;
    assert_int_equal(baton_xfer_offer(t->puller, "127.0.0.1",
                                      baton_xfer_engine_listen_port(t->holder), &o, on_offer, t),
                     0);
    run_until(t, &t->offer_cbs, want);
    return t->offer_status;
}

static void served(baton_xfer_transport_t tp)
{
    pt_t t;
    setup(&t, tp);
    assert_int_equal(baton_xfer_engine_serve(t.holder, serve, &t), 0);
    uint8_t *d = baton_xfer_mem_addr(t.dst), *s = baton_xfer_mem_addr(t.src);
    /* many in a row, at offsets all over the region: every byte where it belongs */
    for (uint64_t k = 0; k < 64; k++) {
        uint64_t off = (k * 7919u * 64u) % (LEN - PAGE_LEN);
        memset(d, 0, PAGE_LEN);
        assert_int_equal(offer_pages(&t, off, 1), 0);
        assert_memory_equal(d, s + off, PAGE_LEN);
    }
    assert_int_equal(t.app_rooms, 0);
    assert_int_equal(t.app_closed, 0);
    wait_holder_counts(&t, 64, 64 * (uint64_t)PAGE_LEN);

    /* declined: the application's room_cb decides (it aborts) */
    assert_int_equal(offer_pages(&t, DECLINE_ID, 1), BATON_XFER_EABORTED);
    run_until(&t, &t.app_closed, 1);
    assert_int_equal(t.app_rooms, 1);
    /* refused, and a range outside the region: aborted without the application */
    assert_int_equal(offer_pages(&t, REFUSE_ID, 1), BATON_XFER_ERKEY);
    assert_int_equal(offer_pages(&t, LEN - PAGE_LEN / 2, 1), BATON_XFER_ERKEY);
    /* another shape: never asked, the application's */
    int calls = atomic_load(&t.serve_calls);
    assert_int_equal(offer_pages(&t, 0, 2), BATON_XFER_EABORTED);
    assert_int_equal(atomic_load(&t.serve_calls), calls);
    run_until(&t, &t.app_closed, 2);
    assert_int_equal(t.app_rooms, 2);
    teardown(&t);
}

static void test_served_tcp(void **state)
{
    (void)state;
    served(BATON_XFER_TRANSPORT_TCP);
}

static void test_served_shm(void **state)
{
    (void)state;
    served(BATON_XFER_TRANSPORT_SHM);
}

/* ---- forgetting peers ---- */

/* Runs the loop until the puller keeps `peers` peers and has forgotten `forgotten`. */
static void wait_peers(pt_t *t, uint64_t peers, uint64_t forgotten)
{
    uint64_t deadline = uv_hrtime() / 1000000 + WAIT_MS;
    baton_xfer_stats_t st;
    for (;;) {
        baton_xfer_engine_stats_sized(t->puller, &st, sizeof(st));
        if (st.peers == peers && st.peers_forgotten == forgotten)
            return;
        if (uv_hrtime() / 1000000 > deadline)
            fail_msg("peers %llu forgotten %llu", (unsigned long long)st.peers,
                     (unsigned long long)st.peers_forgotten);
        uv_run(&t->loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
}

static void test_forget(void **state)
{
    (void)state;
    pt_t t;
    setup(&t, BATON_XFER_TRANSPORT_TCP);
    int port = baton_xfer_engine_listen_port(t.holder);
    assert_int_equal(baton_xfer_forget(t.puller, NULL, port), BATON_XFER_EINVAL);
    assert_int_equal(baton_xfer_forget(t.puller, "127.0.0.1", 1), 0); /* unknown: nothing */
    /* a pull makes a peer; forgetting it when idle drops it at once */
    assert_int_equal(do_export(&t, 21, 0), 0);
    assert_int_equal(do_pull(&t, 21, N_PAGES), 0);
    run_until(&t, &t.offer_cbs, 1);
    run_until(&t, &t.export_cbs, 1); /* the holder's side is over too: its region is free */
    assert_int_equal(t.offer_status, 0);
    wait_peers(&t, 1, 0);
    assert_int_equal(baton_xfer_forget(t.puller, "127.0.0.1", port), 0);
    wait_peers(&t, 0, 1);

    /* a room still open keeps it until the room ends; the next offer makes a fresh peer */
    t.hold = 1;
    assert_int_equal(do_pull(&t, 22, N_PAGES), 0); /* no export: the application's room */
    run_until(&t, &t.app_rooms, 1);
    wait_peers(&t, 1, 1);
    assert_int_equal(baton_xfer_forget(t.puller, "127.0.0.1", port), 0);
    for (int i = 0; i < 50; i++) { /* its turn has come and gone: the room holds it */
        uv_run(&t.loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
    wait_peers(&t, 1, 1);
    assert_int_equal(baton_xfer_room_abort(t.held, BATON_XFER_EABORTED), 0);
    run_until(&t, &t.offer_cbs, 2);
    assert_int_equal(t.offer_status, BATON_XFER_EABORTED);
    wait_peers(&t, 0, 2);
    t.hold = 0;
    assert_int_equal(do_export(&t, 23, 0), 0);
    assert_int_equal(do_pull(&t, 23, N_PAGES), 0);
    run_until(&t, &t.offer_cbs, 3);
    run_until(&t, &t.export_cbs, 2);
    assert_int_equal(t.offer_status, 0);
    wait_peers(&t, 1, 2);
    teardown(&t);
}

/* Own-progress mode: polls the engine fd and dispatches until *counter reaches want. */
static void dispatch_until(baton_xfer_engine_t *eng, int *counter, int want)
{
    uint64_t deadline = uv_hrtime() / 1000000 + WAIT_MS;
    while (*counter < want) {
        if (uv_hrtime() / 1000000 > deadline)
            fail_msg("timed out");
        struct pollfd pfd = {.fd = baton_xfer_engine_fd(eng), .events = POLLIN};
        assert_true(poll(&pfd, 1, 200) >= 0);
        assert_true(baton_xfer_engine_dispatch(eng) >= 0);
    }
}

/* Own-progress mode has no caller loop for a timer: the engine's progress thread makes the fd
 * readable once an export's timeout is due, and dispatch ends it with ETIMEOUT (exactly once,
 * never inside a call). A released export and one still waiting at destroy get no callback. */
static void test_pull_own_progress_timeout(void **state)
{
    (void)state;
    baton_xfer_config_t cfg;
    baton_xfer_config_init(&cfg);
    baton_xfer_callbacks_t none = {NULL, NULL, NULL, NULL};
    baton_xfer_engine_t *eng;
    assert_int_equal(baton_xfer_engine_create(NULL, &cfg, &none, &eng), 0);
    static uint8_t buf[4096];
    baton_xfer_mem_t *mem;
    assert_int_equal(baton_xfer_mem_register(eng, buf, sizeof(buf), BATON_XFER_MEM_HOST, 0, &mem),
                     0);
    pt_t t = {0};
    t.holder = eng;
    baton_xfer_iov_t src = {buf, sizeof(buf)};
    baton_xfer_export_t ex = {1, 1, 1, &src, 100, {0, -1, NULL, 0}};
    uint64_t t0 = uv_hrtime(); /* before the export: its deadline counts from the call */
    assert_int_equal(baton_xfer_export(eng, &ex, on_export, &t), 0); /* key 1: 100 ms */
    ex.key = 2;
    ex.timeout_ms = 50;
    assert_int_equal(baton_xfer_export(eng, &ex, on_export, &t), 0); /* key 2: released */
    assert_int_equal(baton_xfer_export_release(eng, 2), 0);
    ex.key = 3;
    ex.timeout_ms = 0;
    assert_int_equal(baton_xfer_export(eng, &ex, on_export, &t), 0); /* key 3: no timeout */
    ex.key = 4;
    ex.timeout_ms = 3600 * 1000;
    assert_int_equal(baton_xfer_export(eng, &ex, on_export, &t), 0); /* key 4: not due here */
    assert_int_equal(t.export_cbs, 0);
    dispatch_until(eng, &t.export_cbs, 1);
    assert_int_equal(t.export_status, BATON_XFER_ETIMEOUT);
    assert_int_equal(t.export_key, 1);
    assert_true(uv_hrtime() - t0 >= 100ull * 1000000); /* never early (a lower bound only) */
    /* the expired export is over: its key is free; the others are still held */
    assert_int_equal(baton_xfer_export_release(eng, 1), BATON_XFER_ENOTFOUND);
    assert_int_equal(baton_xfer_export_release(eng, 3), 0);
    /* an export made after the first wake gets its own */
    ex.key = 5;
    ex.timeout_ms = 20;
    assert_int_equal(baton_xfer_export(eng, &ex, on_export, &t), 0);
    dispatch_until(eng, &t.export_cbs, 2);
    assert_int_equal(t.export_status, BATON_XFER_ETIMEOUT);
    assert_int_equal(t.export_key, 5);
    assert_int_equal(baton_xfer_mem_deregister(eng, mem), 0);
    baton_xfer_engine_destroy(eng, on_closed, &t);
    /* own-progress: the close callback runs inside dispatch once the thread is gone; key 4 is
     * dropped without its callback */
    dispatch_until(eng, &t.closed, 1);
    assert_int_equal(t.export_cbs, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pull_tcp),
        cmocka_unit_test(test_pull_shm),
        cmocka_unit_test(test_pull_own_progress_timeout),
        cmocka_unit_test(test_served_tcp),
        cmocka_unit_test(test_served_shm),
        cmocka_unit_test(test_forget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
