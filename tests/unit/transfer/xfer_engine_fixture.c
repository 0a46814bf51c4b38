/* xfer_engine_fixture.c — test_xfer_engine's fixture: the caller loop, the prefill's behaviour
 * per test mode, the decode side's rooms and their byte checks, starting and stopping engines. */
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

xfer_test_t T;
xfer_auth_t AUTH;

uv_loop_t loop;
uv_timer_t keepalive;
uint8_t *src;
uint8_t *wsrc; /* what the prefill writes from: src, or a device copy of it */

void on_keepalive(uv_timer_t *t) {}

void run_until(int (*pred)(void *), void *arg, int ms, const char *what)
{
    uint64_t deadline = uv_hrtime() / 1000000 + (uint64_t)ms;
    while (!pred(arg)) {
        if (uv_hrtime() / 1000000 > deadline)
            fail_msg("timed out after %d ms waiting for %s", ms, what);
        uv_run(&loop, UV_RUN_ONCE);
    }
}

void run_for(int ms)
{
    uint64_t deadline = uv_hrtime() / 1000000 + (uint64_t)ms;
    while (uv_hrtime() / 1000000 < deadline)
        uv_run(&loop, UV_RUN_ONCE);
}

void check_not_inside(void)
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

void on_write(baton_xfer_room_t *room, uint32_t layer, int status, void *data)
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

uint32_t g_first_page_seen;

void on_room(baton_xfer_engine_t *e, baton_xfer_room_t *room, void *data)
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

void on_room_closed(baton_xfer_engine_t *e, baton_xfer_room_t *room, int status, void *data)
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

uint8_t *page_at(const droom_t *r, uint32_t l, uint32_t j)
{
    return r->base + ((size_t)l * r->ppl + j) * r->slot;
}

void on_offer_done(void *data, uint64_t room_id, int status, const baton_xfer_done_t *done)
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
void check_pages(const droom_t *r)
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
void on_layer(void *data, uint64_t room_id, uint32_t layer)
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

int offer_room(droom_t *r, int port, uint8_t *base)
{
    return offer_room_cb(r, port, base, NULL);
}

int offer_room_cb(droom_t *r, int port, uint8_t *base, baton_xfer_layer_cb layer_cb)
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

int all_done(void *arg)
{
    droom_t *rs = arg;
    for (int i = 0; rs[i].id; i++)
        if (!rs[i].done)
            return 0;
    return 1;
}

int int_at_least(void *arg)
{
    int *p = ((int **)arg)[0];
    int want = (int)(intptr_t)((int **)arg)[1];
    return *p >= want;
}

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

void start_engines(baton_xfer_transport_t tp_p, baton_xfer_transport_t tp_d, int listen_port)
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

void on_closed(baton_xfer_engine_t *e, void *data)
{
    T.engine_closed++;
}

int closed_n(void *arg)
{
    return T.engine_closed >= (int)(intptr_t)arg;
}

void stop_engines(void)
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

int setup(void **state)
{
    memset(&T, 0, sizeof(T));
    memset(&AUTH, 0, sizeof(AUTH));
    return 0;
}

int teardown(void **state)
{
    if (T.p || T.d)
        stop_engines();
    assert_int_equal(T.cb_inside_call, 0);
    return 0;
}
