/* xfer_engine.h — test_xfer_engine's shared fixture: one caller loop, the prefill and decode
 * engines it starts, what the tests observe (T), the decode side's rooms, and each file's tests. */
#ifndef BATON_TEST_XFER_ENGINE_H
#define BATON_TEST_XFER_ENGINE_H

#include <stdatomic.h>
#include <stdint.h>
#include <uv.h>

#include "baton/transfer.h"
#include "common/buf.h"
#include "transfer/ctrl_frame.h"

#define SRC_LEN  (4u << 20)
#define POOL_LEN (64u << 20)

extern uv_loop_t loop;
extern uv_timer_t keepalive;
extern uint8_t *src;
extern uint8_t *wsrc; /* what the prefill writes from: src, or a device copy of it */

/* P_CHAIN: layer i+1 is written only once layer i's write callback confirmed it (strictly
 * in-order writes); P_WHOLE: one baton_xfer_write_room call. */
typedef enum { P_AUTO, P_HOLD, P_LAYERWISE, P_ABORT_RACE, P_CHAIN, P_WHOLE } pmode_t;

/* What the tests observe, reset per test. */
typedef struct {
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
} xfer_test_t;
extern xfer_test_t T;
extern uint32_t g_first_page_seen; /* the last room's first page, as the prefill sees it */

/* KV bootstrap secrets of the engines start_engines() creates (NULL: none), and a count of the
 * prefill engine's log lines by event (its log callback runs on its progress thread). */
typedef struct {
    const char *p, *d;
    atomic_int refused_lines, suppressed_lines, disabled_lines;
} xfer_auth_t;
extern xfer_auth_t AUTH;

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

#define API(expr)                                                                                  \
    ({                                                                                             \
        T.in_api++;                                                                                \
        __typeof__(expr) r_ = (expr);                                                              \
        T.in_api--;                                                                                \
        r_;                                                                                        \
    })

#define WAIT_INT(var, want, ms)                                                                    \
    do {                                                                                           \
        void *a_[2] = {&(var), (void *)(intptr_t)(want)};                                          \
        run_until(int_at_least, a_, ms, #var " >= " #want);                                        \
    } while (0)

/* The loop until pred(arg) holds (a failure after ms: a bound, not a timing expectation). */
void run_until(int (*pred)(void *), void *arg, int ms, const char *what);
/* WAIT_INT's predicate: ((int **)arg)[0] is at least (intptr_t)((int **)arg)[1]. */
int int_at_least(void *arg);

/* xfer_engine_fixture.c: the loop, the prefill's behaviour, the decode's rooms, the engines. */
void on_keepalive(uv_timer_t *t); /* keeps UV_RUN_ONCE from blocking for long */
void run_for(int ms);
void check_not_inside(void);
void on_write(baton_xfer_room_t *room, uint32_t layer, int status, void *data);
void on_room(baton_xfer_engine_t *e, baton_xfer_room_t *room, void *data);
void on_room_closed(baton_xfer_engine_t *e, baton_xfer_room_t *room, int status, void *data);
uint8_t *page_at(const droom_t *r, uint32_t l, uint32_t j);
void on_offer_done(void *data, uint64_t room_id, int status, const baton_xfer_done_t *done);
void check_pages(const droom_t *r);
void on_layer(void *data, uint64_t room_id, uint32_t layer);
int offer_room(droom_t *r, int port, uint8_t *base);
int offer_room_cb(droom_t *r, int port, uint8_t *base, baton_xfer_layer_cb layer_cb);
int all_done(void *arg);
void start_engines(baton_xfer_transport_t tp_p, baton_xfer_transport_t tp_d, int listen_port);
void on_closed(baton_xfer_engine_t *e, void *data);
int closed_n(void *arg);
void stop_engines(void);
int setup(void **state);
int teardown(void **state);

/* xfer_engine_rooms.c: two real engines over tcp and shm. */
void test_tcp_mixed_rooms(void **state);
void test_shm_mixed_rooms(void **state);
void test_layerwise(void **state);
void test_tcp_partial_offer(void **state);
void test_shm_partial_offer(void **state);
void test_tcp_layer_callbacks(void **state);
void test_shm_layer_callbacks(void **state);
void test_tcp_abort_race_reuse(void **state);
void test_shm_abort_race_reuse(void **state);
void test_abort_held_room_and_prefill_abort(void **state);
void test_api_sync_errors(void **state);
void test_peer_loss_and_reconnect(void **state);
void test_shutdown_with_open_rooms(void **state);

/* xfer_engine_fake.c: raw-socket peers against a real engine. */
int send_buf(int fd, const baton_buf_t *b);
int read_frame(int fd, uint8_t *buf, size_t cap, baton__frame_t *f);
void test_fake_prefill_bounds_and_garbage(void **state);
void test_fake_prefill_layer_done(void **state);
void test_puller_refuses_bad_grants(void **state);
void test_partial_offer_to_old_prefill(void **state);
void test_prefill_refuses_bad_frames(void **state);
int tcp_connect(int port);
void test_listener_pending_caps(void **state);

/* xfer_engine_cuda.c: device memory. */
void test_cuda_device_memory(void **state);

/* xfer_engine_auth.c: the authenticated KV bootstrap. */
void test_kv_auth_rogues(void **state);
void test_kv_auth_mismatch(void **state);

#endif
