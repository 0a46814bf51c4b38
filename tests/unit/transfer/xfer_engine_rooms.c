/* xfer_engine_rooms.c — two real engines over tcp and shm: rooms of mixed sizes, layer-wise
 * writes, partial offers, abort races then page reuse, API errors, peer loss and reconnect. */
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

/* ---- tests ------------------------------------------------------------------------------ */

static void mixed_rooms(baton_xfer_transport_t tp, int n_rooms)
{
    start_engines(tp, tp, 0);
    T.pmode = P_AUTO;
    int port = baton_xfer_engine_listen_port(T.p);
    droom_t *rs = calloc((size_t)n_rooms + 1, sizeof(*rs));
    assert_non_null(rs);
    size_t slot = 64 * 1024, off = 0;
    for (int i = 0; i < n_rooms; i++) {
        droom_t *r = &rs[i];
        r->id = 1000 + (uint64_t)i;
        xfer_room_shape(r->id * 7919, 4, 6, (uint32_t)slot, &r->layers, &r->ppl, &r->page_len);
        r->slot = slot;
        size_t need = (size_t)r->layers * r->ppl * slot;
        assert_true(off + need <= POOL_LEN);
        assert_int_equal(offer_room(r, port, T.pool + off), 0);
        off += need;
    }
    run_until(all_done, rs, 20000, "all rooms done");
    assert_int_equal(T.offers_ok, n_rooms);
    assert_int_equal(T.corrupt, 0);
    WAIT_INT(T.closed_ok, n_rooms, 5000);
    baton_xfer_stats_t st;
    baton_xfer_engine_stats(T.d, &st);
    assert_int_equal(st.rooms_done, (uint64_t)n_rooms);
    assert_int_equal(st.writes_rejected, 0);
    free(rs);
}

void test_tcp_mixed_rooms(void **state)
{
    mixed_rooms(BATON_XFER_TRANSPORT_TCP, 40);
}

void test_shm_mixed_rooms(void **state)
{
    mixed_rooms(BATON_XFER_TRANSPORT_SHM, 40);
}

void test_layerwise(void **state)
{
    start_engines(BATON_XFER_TRANSPORT_TCP, BATON_XFER_TRANSPORT_TCP, 0);
    T.pmode = P_LAYERWISE;
    droom_t rs[2] = {{.id = 77, .layers = 6, .ppl = 3, .page_len = 40000, .slot = 65536}, {0}};
    assert_int_equal(offer_room(&rs[0], baton_xfer_engine_listen_port(T.p), T.pool), 0);
    run_until(all_done, rs, 10000, "layer-wise room");
    assert_int_equal(rs[0].status, 0);
    assert_int_equal(T.corrupt, 0);
    WAIT_INT(T.rooms_closed, 1, 5000);
    /* Every layer was written by its own call, each confirmed before the room closed. */
    assert_int_equal(T.writes_ok, 6);
    unsigned seen = 0;
    for (int i = 0; i < 6; i++)
        seen |= 1u << T.layer_order[i];
    assert_int_equal(seen, 0x3f);
    assert_int_equal(T.last_closed, 0);
}

/*
 * Per-layer arrival callbacks (proto 2 LAYER_DONE): once per layer, before the room's
 * completion, with the layer's bytes already in place; in layer order when the prefill writes
 * strictly in order (P_CHAIN) and for a whole-room write (P_WHOLE); once per layer, any order,
 * when all layers are in flight together (P_AUTO). Rooms offered without a layer callback
 * alongside get none and still complete.
 */
static void layer_callbacks(baton_xfer_transport_t tp)
{
    start_engines(tp, tp, 0);
    int port = baton_xfer_engine_listen_port(T.p);
    const pmode_t modes[] = {P_CHAIN, P_WHOLE, P_AUTO};
    size_t off = 0;
    for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
        T.pmode = modes[m];
        enum { N = 4 };
        droom_t rs[N + 1];
        memset(rs, 0, sizeof(rs));
        for (int i = 0; i < N; i++) {
            droom_t *r = &rs[i];
            r->id = 7000 + m * 100 + (uint64_t)i;
            r->layers = 8 + (uint32_t)i;
            r->ppl = 3;
            r->page_len = 28000 + 977 * (uint32_t)i; /* < slot: the slack stays poison */
            r->slot = 32768;
            size_t need = (size_t)r->layers * r->ppl * r->slot;
            assert_true(off + need <= POOL_LEN);
            /* Room 3 has no layer callback: it must still work, and get none. */
            assert_int_equal(offer_room_cb(r, port, T.pool + off, i == 3 ? NULL : on_layer), 0);
            off += need;
        }
        run_until(all_done, rs, 20000, "layer-callback rooms");
        for (int i = 0; i < N; i++) {
            droom_t *r = &rs[i];
            assert_int_equal(r->status, 0);
            assert_int_equal(r->layer_after_done, 0);
            assert_int_equal(r->layer_bad, 0);
            assert_int_equal(r->layer_dup, 0);
            if (i == 3) {
                assert_int_equal(r->n_layer_cbs, 0);
                continue;
            }
            assert_int_equal(r->n_layer_cbs, (int)r->layers);
            if (modes[m] != P_AUTO)
                for (uint32_t l = 0; l < r->layers; l++)
                    assert_int_equal(r->layer_seq[l], l);
        }
        assert_int_equal(T.corrupt, 0);
    }
    baton_xfer_stats_t st;
    baton_xfer_engine_stats(T.d, &st);
    assert_int_equal(st.frames_rejected, 0);
    assert_int_equal(st.rooms_failed, 0);
}

/*
 * A partial offer (baton_xfer_offer_opts_t.first_page): the decode already holds pages
 * [0, F) of every layer and offers only the rest. The prefill sees the full shape and
 * F, writes with full-shape sources (the cached pages' entries empty, which would be refused
 * if they were read), and exactly the
 * offered bytes move: the offered pages hold the source pattern, the cached pages keep what
 * the decode put there, and both engines count only the offered bytes.
 */
static void partial_offer(baton_xfer_transport_t tp)
{
    start_engines(tp, tp, 0);
    T.pmode = P_AUTO;
    int port = baton_xfer_engine_listen_port(T.p);
    enum { LAYERS = 3, PPL = 5, F = 2, PAGE = 40000, SLOT = 64 * 1024 };
    droom_t r = {.id = 4242, .layers = LAYERS, .ppl = PPL, .page_len = PAGE, .slot = SLOT};
    r.base = T.pool;
    baton_xfer_iov_t iov[LAYERS * (PPL - F)];
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t j = 0; j < PPL; j++) {
            if (j < F) {
                memset(page_at(&r, l, j), 0xC5, SLOT); /* "cached": must stay as it is */
                continue;
            }
            iov[l * (PPL - F) + (j - F)].addr = page_at(&r, l, j);
            iov[l * (PPL - F) + (j - F)].len = PAGE;
        }
    baton_xfer_offer_t o = {r.id, LAYERS, PPL, iov, NULL};
    baton_xfer_offer_opts_t opts;
    baton_xfer_offer_opts_init(&opts);
    assert_int_equal(opts.size, sizeof(opts));
    assert_int_equal(opts.first_page, 0);
    opts.first_page = PPL; /* nothing left to offer */
    assert_int_equal(API(baton_xfer_offer_ex(T.d, "127.0.0.1", port, &o, &opts, on_offer_done, &r)),
                     BATON_EINVAL);
    opts.size = 4; /* too small to be a real struct */
    assert_int_equal(API(baton_xfer_offer_ex(T.d, "127.0.0.1", port, &o, &opts, on_offer_done, &r)),
                     BATON_EINVAL);
    baton_xfer_offer_opts_init(&opts);
    opts.first_page = F;
    assert_int_equal(API(baton_xfer_offer_ex(T.d, "127.0.0.1", port, &o, &opts, on_offer_done, &r)),
                     0);
    WAIT_INT(T.offers_done, 1, 20000);
    assert_int_equal(T.offers_ok, 1);
    assert_int_equal(g_first_page_seen, F);
    for (uint32_t l = 0; l < LAYERS; l++)
        for (uint32_t j = 0; j < PPL; j++) {
            const uint8_t *pg = page_at(&r, l, j);
            if (j < F) {
                for (size_t k = 0; k < SLOT; k++)
                    assert_int_equal(pg[k], 0xC5);
                continue;
            }
            size_t off = xfer_src_offset(r.id, l, j, SRC_LEN, PAGE);
            assert_memory_equal(pg, src + off, PAGE);
            for (size_t k = PAGE; k < SLOT; k++)
                assert_int_equal(pg[k], XFER_POISON);
        }
    WAIT_INT(T.closed_ok, 1, 5000);
    baton_xfer_stats_t st;
    baton_xfer_engine_stats(T.d, &st);
    assert_int_equal(st.bytes_received, (uint64_t)LAYERS * (PPL - F) * PAGE);
    assert_int_equal(st.writes_rejected, 0);
    baton_xfer_engine_stats(T.p, &st);
    assert_int_equal(st.bytes_written, (uint64_t)LAYERS * (PPL - F) * PAGE);
}

void test_tcp_partial_offer(void **state)
{
    partial_offer(BATON_XFER_TRANSPORT_TCP);
}

void test_shm_partial_offer(void **state)
{
    partial_offer(BATON_XFER_TRANSPORT_SHM);
}

void test_tcp_layer_callbacks(void **state)
{
    layer_callbacks(BATON_XFER_TRANSPORT_TCP);
}

void test_shm_layer_callbacks(void **state)
{
    layer_callbacks(BATON_XFER_TRANSPORT_SHM);
}

static void abort_race(baton_xfer_transport_t tp)
{
    start_engines(tp, tp, 0);
    T.pmode = P_ABORT_RACE;
    int port = baton_xfer_engine_listen_port(T.p);
    enum { N = 60 };
    droom_t rs[N + 1];
    memset(rs, 0, sizeof(rs));
    for (int i = 0; i < N; i++) {
        rs[i].id = 5000 + (uint64_t)i;
        rs[i].layers = 4;
        rs[i].ppl = 4;
        rs[i].page_len = 60000 + (uint32_t)i;
        rs[i].slot = 65536;
        assert_int_equal(offer_room(&rs[i], port, T.pool + (size_t)i * 16 * 65536), 0);
    }
    run_until(all_done, rs, 20000, "aborted rooms");
    /* The completion means: no write can land anymore. Reuse the pages right away. */
    for (int i = 0; i < N; i++) {
        assert_int_equal(rs[i].status, BATON_EABORTED);
        memset(rs[i].base, 0x5A, 16 * 65536);
    }
    WAIT_INT(T.rooms_closed, N, 10000);
    run_for(200);
    for (int i = 0; i < N; i++)
        for (size_t k = 0; k < 16 * 65536; k++)
            if (rs[i].base[k] != 0x5A)
                fail_msg("late write into room %d's reused pages at %zu", i, k);
    assert_int_equal(T.closed_ok, 0);
    assert_int_equal(T.last_closed, BATON_EABORTED);
    /* The peer is still fine: a normal room right after. */
    T.pmode = P_AUTO;
    memset(T.pool, XFER_POISON, 64 * 65536);
    droom_t ok[2] = {{.id = 9999, .layers = 2, .ppl = 2, .page_len = 1000, .slot = 65536}, {0}};
    assert_int_equal(offer_room(&ok[0], port, T.pool), 0);
    run_until(all_done, ok, 10000, "room after aborts");
    assert_int_equal(ok[0].status, 0);
    assert_int_equal(T.corrupt, 0);
}

void test_tcp_abort_race_reuse(void **state)
{
    abort_race(BATON_XFER_TRANSPORT_TCP);
}

void test_shm_abort_race_reuse(void **state)
{
    abort_race(BATON_XFER_TRANSPORT_SHM);
}

void test_abort_held_room_and_prefill_abort(void **state)
{
    start_engines(BATON_XFER_TRANSPORT_TCP, BATON_XFER_TRANSPORT_TCP, 0);
    T.pmode = P_HOLD;
    int port = baton_xfer_engine_listen_port(T.p);
    droom_t rs[3] = {{.id = 1, .layers = 1, .ppl = 1, .page_len = 100, .slot = 4096},
                     {.id = 2, .layers = 1, .ppl = 1, .page_len = 100, .slot = 4096},
                     {0}};
    assert_int_equal(offer_room(&rs[0], port, T.pool), 0);
    assert_int_equal(offer_room(&rs[1], port, T.pool + 4096), 0);
    assert_int_equal(API(baton_xfer_abort(T.d, 12345)), BATON_ENOTFOUND);
    WAIT_INT(T.rooms_seen, 2, 5000);
    /* Decode aborts room 1: ABORT -> ABORT_ACK. */
    assert_int_equal(API(baton_xfer_abort(T.d, 1)), 0);
    /* Prefill aborts room 2 itself: ABORT reaches the decode side, which releases. */
    baton_xfer_room_t *r2 = NULL;
    for (int i = 0; i < T.n_held; i++)
        if (T.held[i] && baton_xfer_room_id(T.held[i]) == 2)
            r2 = T.held[i];
    assert_non_null(r2);
    assert_int_equal(API(baton_xfer_room_abort(r2, BATON_ECANCELED)), 0);
    assert_int_equal(API(baton_xfer_room_abort(r2, 0)), BATON_ECANCELED);
    run_until(all_done, rs, 5000, "both aborts");
    assert_int_equal(rs[0].status, BATON_EABORTED);
    assert_int_equal(rs[1].status, BATON_EABORTED);
    WAIT_INT(T.rooms_closed, 2, 5000);
    assert_int_equal(T.closed_err, 2);
}

void test_api_sync_errors(void **state)
{
    start_engines(BATON_XFER_TRANSPORT_TCP, BATON_XFER_TRANSPORT_TCP, 0);
    T.pmode = P_HOLD;
    int port = baton_xfer_engine_listen_port(T.p);
    baton_xfer_mem_t *m = NULL;
    /* Overlapping registration. */
    assert_int_equal(
        API(baton_xfer_mem_register(T.d, T.pool + 100, 10, BATON_XFER_MEM_HOST, 0, &m)),
        BATON_EEXIST);
    assert_int_equal(API(baton_xfer_mem_register(T.d, NULL, 10, BATON_XFER_MEM_HOST, 0, &m)),
                     BATON_EINVAL);
    /* A page outside registered memory. */
    static uint8_t stray[100];
    baton_xfer_iov_t iov = {stray, sizeof(stray)};
    baton_xfer_offer_t o = {42, 1, 1, &iov, NULL};
    droom_t rr[2] = {{.id = 42}, {0}};
    droom_t *r = &rr[0];
    assert_int_equal(API(baton_xfer_offer(T.d, "127.0.0.1", port, &o, on_offer_done, r)),
                     BATON_EINVAL);
    assert_int_equal(API(baton_xfer_offer(T.d, "127.0.0.1", 0, &o, on_offer_done, r)),
                     BATON_EINVAL);
    iov.addr = T.pool;
    iov.len = 0;
    assert_int_equal(API(baton_xfer_offer(T.d, "127.0.0.1", port, &o, on_offer_done, r)),
                     BATON_EINVAL);
    iov.len = 100;
    r->layers = r->ppl = 1;
    r->page_len = 100;
    r->slot = 100;
    r->base = T.pool;
    assert_int_equal(API(baton_xfer_offer(T.d, "127.0.0.1", port, &o, on_offer_done, r)), 0);
    assert_int_equal(API(baton_xfer_offer(T.d, "127.0.0.1", port, &o, on_offer_done, r)),
                     BATON_EEXIST);
    /* The pool is in use by an open room. */
    assert_int_equal(API(baton_xfer_mem_deregister(T.d, T.pool_mem)), BATON_EBUSY);
    WAIT_INT(T.rooms_seen, 1, 5000);
    baton_xfer_room_t *room = T.held[0];
    assert_int_equal(baton_xfer_room_layers(room), 1);
    assert_int_equal(baton_xfer_room_page_len(room, 0, 0), 100);
    assert_int_equal(baton_xfer_room_page_len(room, 1, 0), 0);
    assert_string_equal(baton_xfer_room_peer_id(room), "test-decode");
    uint8_t *good = src + xfer_src_offset(42, 0, 0, SRC_LEN, 100);
    baton_xfer_iov_t s = {good, 99}; /* wrong length */
    assert_int_equal(API(baton_xfer_write_layer(room, 0, &s, 1, on_write, NULL)), BATON_EINVAL);
    s.len = 100;
    assert_int_equal(API(baton_xfer_write_layer(room, 1, &s, 1, on_write, NULL)), BATON_EINVAL);
    s.addr = stray;
    assert_int_equal(API(baton_xfer_write_layer(room, 0, &s, 1, on_write, NULL)), BATON_EINVAL);
    s.addr = good;
    assert_int_equal(API(baton_xfer_write_layer(room, 0, &s, 1, on_write, NULL)), 0);
    assert_int_equal(API(baton_xfer_write_layer(room, 0, &s, 1, on_write, NULL)), BATON_EEXIST);
    uint8_t big[BATON_XFER_DONE_PAYLOAD_MAX + 1];
    baton_xfer_done_t d = {0, 42, big, sizeof(big)};
    assert_int_equal(API(baton_xfer_room_complete(room, &d)), BATON_EINVAL);
    uint64_t id = 42;
    d.payload = (const uint8_t *)&id;
    d.payload_len = 8;
    assert_int_equal(API(baton_xfer_room_complete(room, &d)), 0);
    assert_int_equal(API(baton_xfer_write_layer(room, 0, &s, 1, on_write, NULL)), BATON_ECANCELED);
    run_until(all_done, rr, 5000, "room done");
    assert_int_equal(r->status, 0);
    WAIT_INT(T.rooms_closed, 1, 5000);
    assert_int_equal(T.writes_ok, 1);
    assert_memory_equal(T.pool, good, 100);
    assert_int_equal(T.corrupt, 0);
    /* Engine creation errors are synchronous and leave nothing behind. */
    baton_xfer_config_t cfg;
    baton_xfer_config_init(&cfg);
    cfg.listen_host = "127.0.0.1";
    cfg.listen_port = port; /* taken */
    baton_xfer_callbacks_t cbs = {on_room, on_room_closed, NULL, NULL};
    baton_xfer_engine_t *e2 = NULL;
    assert_int_equal(baton_xfer_engine_create(&loop, &cfg, &cbs, &e2), UV_EADDRINUSE);
    cbs.room_cb = NULL; /* listening without a room callback */
    cfg.listen_port = 0;
    assert_int_equal(baton_xfer_engine_create(&loop, &cfg, &cbs, &e2), BATON_EINVAL);
    cfg.listen_host = NULL;
    cfg.engine_id = "has space";
    assert_int_equal(baton_xfer_engine_create(&loop, &cfg, &cbs, &e2), BATON_EINVAL);
    assert_null(e2);
    /* Free again: deregistration works now. */
    assert_int_equal(API(baton_xfer_mem_deregister(T.d, T.pool_mem)), 0);
}

static int offers_at_least(void *arg)
{
    return T.offers_done >= (int)(intptr_t)arg;
}

void test_peer_loss_and_reconnect(void **state)
{
    start_engines(BATON_XFER_TRANSPORT_TCP, BATON_XFER_TRANSPORT_TCP, 0);
    T.pmode = P_HOLD;
    int port = baton_xfer_engine_listen_port(T.p);
    droom_t held[2] = {{.id = 1, .layers = 2, .ppl = 2, .page_len = 5000, .slot = 8192}, {0}};
    assert_int_equal(offer_room(&held[0], port, T.pool), 0);
    WAIT_INT(T.rooms_seen, 1, 5000);
    /* The prefill engine goes away with the room open: its room closes, the decode room fails
     * (after the lanes are closed, so the pages are free to reuse). */
    baton_xfer_engine_destroy(T.p, on_closed, NULL);
    T.p = NULL;
    run_until(all_done, held, 5000, "held room failed");
    assert_int_equal(held[0].status, BATON_EPEERDOWN);
    run_until(closed_n, (void *)(intptr_t)1, 5000, "prefill closed");
    assert_int_equal(T.last_closed, BATON_ESHUTDOWN);
    /* A new prefill engine (new incarnation) on the same port: rooms succeed again, without any
     * action on the decode side. */
    T.pmode = P_AUTO;
    int ups = T.peer_up_events;
    start_engines(BATON_XFER_TRANSPORT_TCP, BATON_XFER_TRANSPORT_TCP, port);
    assert_int_equal(baton_xfer_engine_listen_port(T.p), port);
    droom_t r[2];
    uint64_t id = 100;
    for (;;) {
        memset(r, 0, sizeof(r));
        r[0] = (droom_t){.id = id++, .layers = 2, .ppl = 2, .page_len = 3000, .slot = 8192};
        int before = T.offers_done;
        assert_int_equal(offer_room(&r[0], port, T.pool), 0);
        run_until(offers_at_least, (void *)(intptr_t)(before + 1), 5000, "retry");
        if (r[0].status == 0)
            break;
        assert_int_equal(r[0].status, BATON_EPEERDOWN);
        assert_true(id < 400);
        run_for(20);
    }
    assert_int_equal(T.corrupt, 0);
    assert_true(T.peer_up_events > ups);
    baton_xfer_stats_t st;
    baton_xfer_engine_stats(T.d, &st);
    assert_true(st.reconnects >= 1);
}

void test_shutdown_with_open_rooms(void **state)
{
    start_engines(BATON_XFER_TRANSPORT_SHM, BATON_XFER_TRANSPORT_SHM, 0);
    T.pmode = P_HOLD;
    droom_t rs[2] = {{.id = 3, .layers = 1, .ppl = 2, .page_len = 500, .slot = 4096}, {0}};
    assert_int_equal(offer_room(&rs[0], baton_xfer_engine_listen_port(T.p), T.pool), 0);
    WAIT_INT(T.rooms_seen, 1, 5000);
    baton_xfer_engine_destroy(T.d, on_closed, NULL);
    T.d = NULL;
    run_until(closed_n, (void *)(intptr_t)1, 5000, "decode closed");
    /* Its room's callback came before the engine's close callback. */
    assert_int_equal(rs[0].done, 1);
    assert_int_equal(rs[0].status, BATON_ESHUTDOWN);
    WAIT_INT(T.rooms_closed, 1, 5000);
    assert_int_equal(T.last_closed, BATON_EPEERDOWN);
}
