/* test_xfer_engine.c — two libbaton engines on one loop over loopback (tcp and shm): rooms of
 * mixed sizes byte-verified, layer-wise writes, abort races then page reuse, peer loss and
 * reconnect, synchronous API errors; plus a raw-socket fake prefill that sends out-of-bounds
 * writes and malformed frames, and rogue clients against the authenticated KV bootstrap. */
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

#define SRC_LEN  (4u << 20)
#define POOL_LEN (64u << 20)

static uv_loop_t loop;
static uv_timer_t keepalive;
static uint8_t *src;
static uint8_t *wsrc; /* what the prefill writes from: src, or a device copy of it */

/* P_CHAIN: layer i+1 is written only once layer i's write callback confirmed it (strictly
 * in-order writes); P_WHOLE: one baton_xfer_write_room call. */
typedef enum { P_AUTO, P_HOLD, P_LAYERWISE, P_ABORT_RACE, P_CHAIN, P_WHOLE } pmode_t;

/* What the tests observe, reset per test. */
static struct {
    pmode_t pmode;
    baton_xfer_engine_t *p, *d; /* prefill, decode */
    baton_xfer_mem_t *src_mem, *pool_mem;
    uint8_t *pool;
    int in_api; /* set around API calls: no callback may run inside one */
    int rooms_seen, rooms_closed, closed_ok, closed_err, last_closed;
    int writes_ok, writes_err;
    int offers_done, offers_ok, offers_err, last_offer_status;
    int corrupt;
    int cb_inside_call;
    baton_xfer_room_t *held[64];
    int n_held;
    int peer_up_events;
    int engine_closed;
    uint32_t layer_order[64];
    int n_layer_order;
    uint64_t abort_on_arrival; /* P_ABORT_RACE: room id the decode aborts */
    /* the prefill listener's pending caps and budget (0: libbaton's defaults) */
    uint32_t max_pending, max_pending_per_addr;
    uint64_t pending_buffer_bytes;
} T;

/* KV bootstrap secrets of the engines start_engines() creates (NULL: none), and a count of the
 * prefill engine's log lines by event (its log callback runs on its progress thread). */
static struct {
    const char *p, *d;
    atomic_int refused_lines, suppressed_lines, disabled_lines;
} AUTH;

static void on_keepalive(uv_timer_t *t) {}

static void run_until(int (*pred)(void *), void *arg, int ms, const char *what)
{
    uint64_t deadline = uv_hrtime() / 1000000 + (uint64_t)ms;
    while (!pred(arg)) {
        if (uv_hrtime() / 1000000 > deadline)
            fail_msg("timed out after %d ms waiting for %s", ms, what);
        uv_run(&loop, UV_RUN_ONCE);
    }
}

static void run_for(int ms)
{
    uint64_t deadline = uv_hrtime() / 1000000 + (uint64_t)ms;
    while (uv_hrtime() / 1000000 < deadline)
        uv_run(&loop, UV_RUN_ONCE);
}

#define API(expr)                                                                                  \
    ({                                                                                             \
        T.in_api++;                                                                                \
        __typeof__(expr) r_ = (expr);                                                              \
        T.in_api--;                                                                                \
        r_;                                                                                        \
    })

static void check_not_inside(void)
{
    if (T.in_api)
        T.cb_inside_call++;
}

/* ---- prefill behaviour ------------------------------------------------------------------ */

typedef struct {
    baton_xfer_room_t *room;
    uv_timer_t timer;
    uint32_t next;
    int timer_on;
} lw_t;

static int write_layer(baton_xfer_room_t *room, uint32_t l);
static void complete_room(baton_xfer_room_t *room);

static void on_write(baton_xfer_room_t *room, uint32_t layer, int status, void *data)
{
    check_not_inside();
    if (T.pmode == P_CHAIN && status == 0) {
        if (layer + 1 < baton_xfer_room_layers(room))
            assert_int_equal(write_layer(room, layer + 1), 0);
        else
            complete_room(room);
    }
    if (status == 0) {
        T.writes_ok++;
        if (T.n_layer_order < 64)
            T.layer_order[T.n_layer_order++] = layer;
    } else {
        T.writes_err++;
    }
}

static int write_layer(baton_xfer_room_t *room, uint32_t l)
{
    uint32_t ppl = baton_xfer_room_pages_per_layer(room);
    baton_xfer_iov_t iov[64];
    assert_true(ppl <= 64);
    uint64_t id = baton_xfer_room_id(room);
    for (uint32_t j = 0; j < ppl; j++) {
        uint64_t len = baton_xfer_room_page_len(room, l, j);
        iov[j].addr = wsrc + xfer_src_offset(id, l, j, SRC_LEN, (size_t)len);
        iov[j].len = len;
    }
    return API(baton_xfer_write_layer(room, l, iov, ppl, on_write, NULL));
}

static void complete_room(baton_xfer_room_t *room)
{
    uint64_t id = baton_xfer_room_id(room);
    baton_xfer_done_t done = {0, (int64_t)(id % 1000), (const uint8_t *)&id, 8};
    int rc = API(baton_xfer_room_complete(room, &done));
    assert_int_equal(rc, 0);
    assert_int_equal(API(baton_xfer_room_complete(room, &done)), BATON_ECANCELED);
}

static void lw_tick(uv_timer_t *t)
{
    lw_t *c = t->data;
    assert_int_equal(write_layer(c->room, c->next++), 0);
    if (c->next == baton_xfer_room_layers(c->room)) {
        uv_timer_stop(t);
        complete_room(c->room);
    }
}

static uint32_t g_first_page_seen; /* the last room's first page, as the prefill sees it */

static void on_room(baton_xfer_engine_t *e, baton_xfer_room_t *room, void *data)
{
    check_not_inside();
    T.rooms_seen++;
    g_first_page_seen = baton_xfer_room_first_page(room);
    uint32_t layers = baton_xfer_room_layers(room);
    switch (T.pmode) {
    case P_AUTO:
        for (uint32_t l = 0; l < layers; l++)
            assert_int_equal(write_layer(room, l), 0);
        assert_int_equal(write_layer(room, 0), BATON_EEXIST);
        complete_room(room);
        break;
    case P_HOLD:
        if (T.n_held < 64)
            T.held[T.n_held++] = room;
        break;
    case P_LAYERWISE: {
        lw_t *c = calloc(1, sizeof(*c));
        assert_non_null(c);
        c->room = room;
        baton_xfer_room_set_data(room, c);
        uv_timer_init(&loop, &c->timer);
        c->timer.data = c;
        c->timer_on = 1;
        uv_timer_start(&c->timer, lw_tick, 5, 5);
        break;
    }
    case P_CHAIN:
        assert_int_equal(write_layer(room, 0), 0);
        break;
    case P_WHOLE: {
        uint32_t ppl = baton_xfer_room_pages_per_layer(room);
        baton_xfer_iov_t iov[256];
        assert_true((size_t)layers * ppl <= 256);
        uint64_t id = baton_xfer_room_id(room);
        for (uint32_t l = 0; l < layers; l++)
            for (uint32_t j = 0; j < ppl; j++) {
                uint64_t len = baton_xfer_room_page_len(room, l, j);
                iov[l * ppl + j].addr = src + xfer_src_offset(id, l, j, SRC_LEN, (size_t)len);
                iov[l * ppl + j].len = len;
            }
        assert_int_equal(
            API(baton_xfer_write_room(room, iov, (size_t)layers * ppl, on_write, NULL)), 0);
        complete_room(room);
        break;
    }
    case P_ABORT_RACE:
        /* Writes go out while the decode side's abort is on its way. */
        for (uint32_t l = 0; l < layers; l++)
            assert_int_equal(write_layer(room, l), 0);
        assert_int_equal(API(baton_xfer_abort(T.d, baton_xfer_room_id(room))), 0);
        break;
    }
}

static void free_lw(uv_handle_t *h)
{
    free(h->data);
}

static void on_room_closed(baton_xfer_engine_t *e, baton_xfer_room_t *room, int status, void *data)
{
    check_not_inside();
    T.rooms_closed++;
    T.last_closed = status;
    if (status == 0)
        T.closed_ok++;
    else
        T.closed_err++;
    for (int i = 0; i < T.n_held; i++)
        if (T.held[i] == room)
            T.held[i] = NULL;
    lw_t *c = baton_xfer_room_get_data(room);
    if (c != NULL && c->timer_on) {
        uv_timer_stop(&c->timer);
        uv_close((uv_handle_t *)&c->timer, free_lw);
    }
}

static void on_peer(baton_xfer_engine_t *e, const baton_xfer_peer_info_t *info, void *data)
{
    check_not_inside();
    if (info->state == BATON_XFER_PEER_UP)
        T.peer_up_events++;
}

/* ---- decode side ------------------------------------------------------------------------ */

typedef struct {
    uint64_t id;
    uint32_t layers, ppl, page_len;
    uint8_t *base; /* the room's pages are consecutive slots of slot bytes from here */
    size_t slot;
    int status;
    int done;
    /* layer callbacks (offer_room_layers) */
    uint32_t layer_seq[64]; /* arrival order */
    int n_layer_cbs;
    int layer_after_done; /* a layer callback after the room's completion */
    int layer_bad;        /* a layer's bytes were not in place when its callback ran */
    int layer_dup;
    int device; /* pages in device memory: the test copies them back and checks them itself */
} droom_t;

static uint8_t *page_at(const droom_t *r, uint32_t l, uint32_t j)
{
    return r->base + ((size_t)l * r->ppl + j) * r->slot;
}

static void check_pages(const droom_t *r);

static void on_offer_done(void *data, uint64_t room_id, int status, const baton_xfer_done_t *done)
{
    check_not_inside();
    droom_t *r = data;
    assert_int_equal(room_id, r->id);
    assert_int_equal(r->done, 0); /* exactly once */
    r->done = 1;
    r->status = status;
    T.offers_done++;
    T.last_offer_status = status;
    if (status != 0) {
        T.offers_err++;
        assert_null(done);
        return;
    }
    T.offers_ok++;
    assert_non_null(done);
    assert_int_equal(done->first_token, (int64_t)(r->id % 1000));
    assert_int_equal(done->payload_len, 8);
    assert_memory_equal(done->payload, &r->id, 8);
    if (!r->device)
        check_pages(r);
}

/* Every page holds its bytes of the source and nothing was written past a page's end. */
static void check_pages(const droom_t *r)
{
    for (uint32_t l = 0; l < r->layers; l++)
        for (uint32_t j = 0; j < r->ppl; j++) {
            const uint8_t *pg = page_at(r, l, j);
            size_t off = xfer_src_offset(r->id, l, j, SRC_LEN, r->page_len);
            if (memcmp(pg, src + off, r->page_len) != 0)
                T.corrupt++;
            for (size_t k = r->page_len; k < r->slot; k++)
                if (pg[k] != XFER_POISON) {
                    T.corrupt++;
                    break;
                }
        }
}

/* The layer's pages must already hold the source pattern, and nothing past the page end. */
static void on_layer(void *data, uint64_t room_id, uint32_t layer)
{
    check_not_inside();
    droom_t *r = data;
    assert_int_equal(room_id, r->id);
    assert_true(layer < r->layers);
    if (r->done)
        r->layer_after_done++;
    for (int i = 0; i < r->n_layer_cbs; i++)
        if (r->layer_seq[i] == layer)
            r->layer_dup++;
    if (r->n_layer_cbs < 64)
        r->layer_seq[r->n_layer_cbs] = layer;
    r->n_layer_cbs++;
    for (uint32_t j = 0; j < r->ppl; j++) {
        const uint8_t *pg = page_at(r, layer, j);
        size_t off = xfer_src_offset(r->id, layer, j, SRC_LEN, r->page_len);
        if (memcmp(pg, src + off, r->page_len) != 0)
            r->layer_bad++;
        for (size_t k = r->page_len; k < r->slot; k++)
            if (pg[k] != XFER_POISON) {
                r->layer_bad++;
                break;
            }
    }
}

static int offer_room_cb(droom_t *r, int port, uint8_t *base, baton_xfer_layer_cb layer_cb);

static int offer_room(droom_t *r, int port, uint8_t *base)
{
    return offer_room_cb(r, port, base, NULL);
}

static int offer_room_cb(droom_t *r, int port, uint8_t *base, baton_xfer_layer_cb layer_cb)
{
    baton_xfer_iov_t iov[256];
    uint32_t n = r->layers * r->ppl;
    assert_true(n <= 256);
    r->base = base;
    for (uint32_t i = 0; i < n; i++) {
        iov[i].addr = base + (size_t)i * r->slot;
        iov[i].len = r->page_len;
    }
    baton_xfer_offer_t o = {r->id, r->layers, r->ppl, iov, layer_cb};
    return API(baton_xfer_offer(T.d, "127.0.0.1", port, &o, on_offer_done, r));
}

static int all_done(void *arg)
{
    droom_t *rs = arg;
    for (int i = 0; rs[i].id; i++)
        if (!rs[i].done)
            return 0;
    return 1;
}

static int int_at_least(void *arg)
{
    int *p = ((int **)arg)[0];
    int want = (int)(intptr_t)((int **)arg)[1];
    return *p >= want;
}

#define WAIT_INT(var, want, ms)                                                                    \
    do {                                                                                           \
        void *a_[2] = {&(var), (void *)(intptr_t)(want)};                                          \
        run_until(int_at_least, a_, ms, #var " >= " #want);                                        \
    } while (0)

/* ---- fixtures --------------------------------------------------------------------------- */

static void count_prefill_log(void *data, baton_xfer_log_level_t level, const char *msg)
{
    if (strstr(msg, "kv_auth_refused_suppressed") != NULL)
        atomic_fetch_add(&AUTH.suppressed_lines, 1);
    else if (strstr(msg, "kv_auth_refused") != NULL)
        atomic_fetch_add(&AUTH.refused_lines, 1);
    else if (strstr(msg, "kv_auth_disabled") != NULL)
        atomic_fetch_add(&AUTH.disabled_lines, 1);
    if (level >= BATON_XFER_LOG_WARN)
        fprintf(stderr, "[prefill] %s\n", msg);
}

static void start_engines(baton_xfer_transport_t tp_p, baton_xfer_transport_t tp_d, int listen_port)
{
    baton_xfer_config_t cfg;
    baton_xfer_callbacks_t cbs = {on_room, on_room_closed, on_peer, NULL};
    if (T.p == NULL) {
        baton_xfer_config_init(&cfg);
        cfg.engine_id = "test-prefill";
        cfg.listen_host = "127.0.0.1";
        cfg.listen_port = listen_port;
        cfg.transports[0] = tp_p;
        cfg.transports[1] = BATON_XFER_TRANSPORT_TCP;
        cfg.n_transports = 2;
        cfg.heartbeat_interval_ms = 100;
        cfg.heartbeat_misses = 10;
        cfg.lanes = 3;
        cfg.slice_size = 16 * 1024; /* many slices per page: exercises striping and acks */
        if (AUTH.p != NULL) {
            cfg.secret = AUTH.p;
            cfg.secret_len = strlen(AUTH.p);
        }
        cfg.log_cb = count_prefill_log;
        cfg.max_pending_conns = T.max_pending;
        cfg.max_pending_per_addr = T.max_pending_per_addr;
        cfg.pending_buffer_bytes = T.pending_buffer_bytes;
        assert_int_equal(baton_xfer_engine_create(&loop, &cfg, &cbs, &T.p), 0);
        assert_true(baton_xfer_engine_listen_port(T.p) > 0);
        assert_int_equal(
            API(baton_xfer_mem_register(T.p, src, SRC_LEN, BATON_XFER_MEM_HOST, 0, &T.src_mem)), 0);
    }
    if (T.d == NULL) {
        baton_xfer_config_init(&cfg);
        cfg.engine_id = "test-decode";
        cfg.transports[0] = tp_d;
        cfg.transports[1] = BATON_XFER_TRANSPORT_TCP;
        cfg.n_transports = 2;
        cfg.heartbeat_interval_ms = 100;
        cfg.heartbeat_misses = 10;
        cfg.reconnect_min_ms = 10;
        cfg.reconnect_max_ms = 100;
        cfg.lanes = 3;
        if (AUTH.d != NULL) {
            cfg.secret = AUTH.d;
            cfg.secret_len = strlen(AUTH.d);
        }
        baton_xfer_callbacks_t dcbs = {NULL, NULL, on_peer, NULL};
        assert_int_equal(baton_xfer_engine_create(&loop, &cfg, &dcbs, &T.d), 0);
        assert_int_equal(API(baton_xfer_mem_alloc(T.d, POOL_LEN, &T.pool_mem)), 0);
        T.pool = baton_xfer_mem_addr(T.pool_mem);
        memset(T.pool, XFER_POISON, POOL_LEN);
    }
}

static void on_closed(baton_xfer_engine_t *e, void *data)
{
    T.engine_closed++;
}

static int closed_n(void *arg)
{
    return T.engine_closed >= (int)(intptr_t)arg;
}

static void stop_engines(void)
{
    int n = T.engine_closed;
    if (T.d) {
        baton_xfer_engine_destroy(T.d, on_closed, NULL);
        n++;
    }
    if (T.p) {
        baton_xfer_engine_destroy(T.p, on_closed, NULL);
        n++;
    }
    run_until(closed_n, (void *)(intptr_t)n, 10000, "engines closed");
    T.p = T.d = NULL;
}

static int setup(void **state)
{
    memset(&T, 0, sizeof(T));
    memset(&AUTH, 0, sizeof(AUTH));
    return 0;
}

static int teardown(void **state)
{
    if (T.p || T.d)
        stop_engines();
    assert_int_equal(T.cb_inside_call, 0);
    return 0;
}

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

static void test_tcp_mixed_rooms(void **state)
{
    mixed_rooms(BATON_XFER_TRANSPORT_TCP, 40);
}

static void test_shm_mixed_rooms(void **state)
{
    mixed_rooms(BATON_XFER_TRANSPORT_SHM, 40);
}

static void test_layerwise(void **state)
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

static void test_tcp_partial_offer(void **state)
{
    partial_offer(BATON_XFER_TRANSPORT_TCP);
}

static void test_shm_partial_offer(void **state)
{
    partial_offer(BATON_XFER_TRANSPORT_SHM);
}

static void test_tcp_layer_callbacks(void **state)
{
    layer_callbacks(BATON_XFER_TRANSPORT_TCP);
}

static void test_shm_layer_callbacks(void **state)
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

static void test_tcp_abort_race_reuse(void **state)
{
    abort_race(BATON_XFER_TRANSPORT_TCP);
}

static void test_shm_abort_race_reuse(void **state)
{
    abort_race(BATON_XFER_TRANSPORT_SHM);
}

static void test_abort_held_room_and_prefill_abort(void **state)
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

static void test_api_sync_errors(void **state)
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

static void test_peer_loss_and_reconnect(void **state)
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

static void test_shutdown_with_open_rooms(void **state)
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

static int send_buf(int fd, const baton_buf_t *b)
{
    return send(fd, b->data, b->len, MSG_NOSIGNAL) == (ssize_t)b->len ? 0 : -1;
}

/* Reads one frame (header + body) into buf; returns its decoded form. */
static int read_frame(int fd, uint8_t *buf, size_t cap, baton__frame_t *f)
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
    baton__frame_t f;
    int c = accept(F.lfd, NULL, NULL);
    if (c < 0 || read_frame(c, buf, sizeof(buf), &f) != 0 || f.type != BATON__F_HELLO)
        return NULL;
    uint64_t decode_gen = f.u.hello.generation, decode_inc = f.u.hello.incarnation;
    baton__hello_t h;
    memset(&h, 0, sizeof(h));
    h.proto = 1;
    h.role = BATON__ROLE_PREFILL;
    strcpy(h.engine_id, "fake-prefill");
    h.incarnation = 77;
    h.generation = 5;
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
    int lane = accept(F.lfd, NULL, NULL);
    if (lane < 0 || read_frame(lane, buf, sizeof(buf), &f) != 0 || f.type != BATON__F_LANE_HELLO ||
        f.u.lane_hello.incarnation != decode_inc || f.u.lane_hello.generation != decode_gen)
        return NULL;
    baton__enc_lane_ack(&b, 0, 0);
    send_buf(lane, &b);
    baton_buf_reset(&b);
    /* MEM frames, then the OFFER. */
    for (;;) {
        if (read_frame(c, buf, sizeof(buf), &f) != 0)
            return NULL;
        if (f.type == BATON__F_OFFER)
            break;
    }
    F.room = f.u.offer.room;
    baton__offer_page(&f.u.offer, 0, &F.page);
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

static void test_fake_prefill_bounds_and_garbage(void **state)
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

static int fake_handshake(int *c_p, int *lane_p, uint8_t *buf, size_t cap)
{
    baton__frame_t f;
    int c = accept(G.lfd, NULL, NULL);
    if (c < 0 || read_frame(c, buf, cap, &f) != 0 || f.type != BATON__F_HELLO ||
        f.u.hello.proto < BATON__PROTO_LAYER_DONE)
        return -1;
    uint64_t gen = f.u.hello.generation;
    baton__hello_t h;
    memset(&h, 0, sizeof(h));
    h.proto = G.proto ? G.proto : BATON__PROTO_VERSION;
    h.role = BATON__ROLE_PREFILL;
    strcpy(h.engine_id, "fake-prefill-2");
    h.incarnation = 78;
    h.generation = 6;
    h.echo_generation = gen;
    h.heartbeat_ms = 1000;
    h.n_tp = 1;
    static const uint8_t tcp_blob[2] = {1, 1};
    h.tp[0].id = BATON_XFER_TRANSPORT_TCP;
    h.tp[0].len = 2;
    h.tp[0].blob = tcp_blob;
    baton_buf_t b = BATON_BUF_INIT;
    baton__enc_hello(&b, &h);
    send_buf(c, &b);
    baton_buf_reset(&b);
    int lane = accept(G.lfd, NULL, NULL);
    if (lane < 0 || read_frame(lane, buf, cap, &f) != 0 || f.type != BATON__F_LANE_HELLO)
        return -1;
    baton__enc_lane_ack(&b, 0, 0);
    send_buf(lane, &b);
    baton_buf_free(&b);
    *c_p = c;
    *lane_p = lane;
    return 0;
}

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

static void *fake_prefill_layers(void *arg)
{
    static uint8_t buf[1 << 20];
    int c, lane;
    baton__frame_t f;
    baton__offer_page_t pg;
    if (fake_handshake(&c, &lane, buf, sizeof(buf)) != 0 ||
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

static void test_fake_prefill_layer_done(void **state)
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
    if (fake_handshake(&c, &lane, buf, sizeof(buf)) != 0)
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

static void test_puller_refuses_bad_grants(void **state)
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
    if (fake_handshake(&c, &lane, buf, sizeof(buf)) != 0)
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
static void test_partial_offer_to_old_prefill(void **state)
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
static void test_prefill_refuses_bad_frames(void **state)
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

static int tcp_connect(int port);

/* The listener before a handshake ends: connections over the per-address cap are closed at
 * once, a frame other than a handshake's is refused from its header, read buffers stay within
 * their budget, and the engines' own rooms go on. */
static void test_listener_pending_caps(void **state)
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

/* CUDA device memory over tcp, both ways: a device source (the sender stages it through its
 * bounce buffers) into host pages and into device pages, and a host source into device pages
 * (the receiver fills them from its bounce buffers before it acknowledges). Every byte is copied
 * back and compared; the stats count the staged bytes and bound the bounce buffers. Runs on a
 * real driver, or on tests/gpu/fake_cuda.c (whose device memory faults if the CPU touches it:
 * test xfer_engine_cuda_fake); skips visibly without either. */
/* A visible skip; a failure where the run promised a driver (XFER_CUDA_REQUIRED: the fake). */
#define cuda_skip(why)                                                                             \
    do {                                                                                           \
        if (getenv("XFER_CUDA_REQUIRED") != NULL)                                                  \
            fail_msg("no skip allowed here: %s", why);                                             \
        print_message("SKIP: %s\n", why);                                                          \
        skip();                                                                                    \
    } while (0)

static void test_cuda_device_memory(void **state)
{
#ifndef BATON_HAVE_CUDA
    cuda_skip("built without CUDA");
#else
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        cuda_skip("no CUDA driver (libcuda.so.1) on this host");
    }
    typedef unsigned long long dptr_t;
    int (*cu_init)(unsigned) = (int (*)(unsigned))dlsym(h, "cuInit");
    int (*cu_count)(int *) = (int (*)(int *))dlsym(h, "cuDeviceGetCount");
    int (*cu_get)(int *, int) = (int (*)(int *, int))dlsym(h, "cuDeviceGet");
    int (*cu_retain)(void **, int) = (int (*)(void **, int))dlsym(h, "cuDevicePrimaryCtxRetain");
    int (*cu_set)(void *) = (int (*)(void *))dlsym(h, "cuCtxSetCurrent");
    int (*cu_alloc)(dptr_t *, size_t) = (int (*)(dptr_t *, size_t))dlsym(h, "cuMemAlloc_v2");
    int (*cu_free)(dptr_t) = (int (*)(dptr_t))dlsym(h, "cuMemFree_v2");
    int (*cu_htod)(dptr_t, const void *, size_t) =
        (int (*)(dptr_t, const void *, size_t))dlsym(h, "cuMemcpyHtoD_v2");
    int (*cu_dtoh)(void *, dptr_t, size_t) =
        (int (*)(void *, dptr_t, size_t))dlsym(h, "cuMemcpyDtoH_v2");
    int n = 0, dev = 0;
    void *ctx = NULL;
    if (!cu_init || !cu_count || cu_init(0) != 0 || cu_count(&n) != 0 || n == 0) {
        cuda_skip("no CUDA device");
    }
    assert_non_null(cu_htod);
    assert_non_null(cu_dtoh);
    assert_int_equal(cu_get(&dev, 0), 0);
    assert_int_equal(cu_retain(&ctx, dev), 0);
    assert_int_equal(cu_set(ctx), 0);
    const size_t dlen = 1 << 20;
    dptr_t dsrc = 0, ddst = 0;
    assert_int_equal(cu_alloc(&dsrc, SRC_LEN), 0);
    assert_int_equal(cu_alloc(&ddst, dlen), 0);
    assert_int_equal(cu_htod(dsrc, src, SRC_LEN), 0);
    uint8_t *poison = malloc(dlen), *mirror = malloc(dlen);
    assert_non_null(poison);
    assert_non_null(mirror);
    memset(poison, XFER_POISON, dlen);
    start_engines(BATON_XFER_TRANSPORT_TCP, BATON_XFER_TRANSPORT_TCP, 0);
    baton_xfer_mem_t *ms = NULL, *md = NULL;
    assert_int_equal(API(baton_xfer_mem_register(T.p, (void *)(uintptr_t)dsrc, SRC_LEN,
                                                 BATON_XFER_MEM_CUDA, 0, &ms)),
                     0);
    assert_int_equal(API(baton_xfer_mem_register(T.d, (void *)(uintptr_t)ddst, dlen,
                                                 BATON_XFER_MEM_CUDA, 0, &md)),
                     0);
    T.pmode = P_AUTO;
    int port = baton_xfer_engine_listen_port(T.p);
    /* page_len 40000: not a multiple of the 16 KiB slices or of the receiver's chunk */
    const struct {
        int dev_src, dev_dst;
    } cases[] = {{1, 0}, {1, 1}, {0, 1}};
    uint64_t want_p = 0, want_d = 0;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        droom_t r[2] = {{.id = 808 + c, .layers = 3, .ppl = 8, .page_len = 40000, .slot = 40960},
                        {0}};
        uint64_t bytes = (uint64_t)r[0].layers * r[0].ppl * r[0].page_len;
        r[0].device = cases[c].dev_dst;
        wsrc = cases[c].dev_src ? (uint8_t *)(uintptr_t)dsrc : src;
        if (cases[c].dev_dst)
            assert_int_equal(cu_htod(ddst, poison, dlen), 0);
        assert_int_equal(
            offer_room(&r[0], port, cases[c].dev_dst ? (uint8_t *)(uintptr_t)ddst : T.pool), 0);
        run_until(all_done, r, 10000, "device-memory room");
        assert_int_equal(r[0].status, 0);
        if (cases[c].dev_dst) {
            assert_int_equal(cu_dtoh(mirror, ddst, dlen), 0);
            r[0].base = mirror;
            check_pages(&r[0]);
        }
        assert_int_equal(T.corrupt, 0);
        want_p += cases[c].dev_src ? bytes : 0;
        want_d += cases[c].dev_dst ? bytes : 0;
    }
    wsrc = src;
    baton_xfer_stats_t sp, sd;
    baton_xfer_engine_stats_sized(T.p, &sp, sizeof(sp));
    baton_xfer_engine_stats_sized(T.d, &sd, sizeof(sd));
    assert_int_equal(sp.staged_bytes, want_p);
    assert_int_equal(sd.staged_bytes, want_d);
    assert_true(sp.stage_buffer_bytes > 0 && sp.stage_buffer_bytes <= (8u << 20));
    assert_true(sd.stage_buffer_bytes > 0 && sd.stage_buffer_bytes <= 3 * (512u << 10));
    assert_int_equal(API(baton_xfer_mem_deregister(T.d, md)), 0);
    assert_int_equal(API(baton_xfer_mem_deregister(T.p, ms)), 0);
    stop_engines();
    free(poison);
    free(mirror);
    cu_free(dsrc);
    cu_free(ddst);
    dlclose(h);
#endif
}

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

static int tcp_connect(int port)
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
static void test_kv_auth_rogues(void **state)
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
static void test_kv_auth_mismatch(void **state)
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

int main(void)
{
    uv_loop_init(&loop);
    uv_timer_init(&loop, &keepalive);
    uv_timer_start(&keepalive, on_keepalive, 5, 5); /* UV_RUN_ONCE never blocks for long */
    src = aligned_alloc(4096, SRC_LEN);
    xfer_fill_source(src, SRC_LEN, 42);
    wsrc = src;
    if (getenv("XFER_TEST_FILTER") != NULL) /* e.g. the fake-driver run of the CUDA test */
        cmocka_set_test_filter(getenv("XFER_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_tcp_mixed_rooms, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shm_mixed_rooms, setup, teardown),
        cmocka_unit_test_setup_teardown(test_layerwise, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tcp_partial_offer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shm_partial_offer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tcp_layer_callbacks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shm_layer_callbacks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tcp_abort_race_reuse, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shm_abort_race_reuse, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_held_room_and_prefill_abort, setup, teardown),
        cmocka_unit_test_setup_teardown(test_api_sync_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_loss_and_reconnect, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shutdown_with_open_rooms, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fake_prefill_bounds_and_garbage, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fake_prefill_layer_done, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prefill_refuses_bad_frames, setup, teardown),
        cmocka_unit_test_setup_teardown(test_listener_pending_caps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_partial_offer_to_old_prefill, setup, teardown),
        cmocka_unit_test_setup_teardown(test_puller_refuses_bad_grants, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cuda_device_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kv_auth_rogues, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kv_auth_mismatch, setup, teardown),
        cmocka_unit_test(test_no_refused_phase_moves),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    uv_close((uv_handle_t *)&keepalive, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0); /* nothing leaked on the caller loop */
    free(src);
    return rc;
}
