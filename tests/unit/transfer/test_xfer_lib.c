/* test_xfer_lib.c — libbaton as a library: two engines in one process, own-progress mode driven
 * through the fd (no uv loop on the host thread), per-engine log callbacks, config size, error
 * table and version. */
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <uv.h>

#include "baton/error.h"
#include "baton/transfer.h"

#define N_LAYERS 4
#define N_PAGES  6
#define PAGE_LEN (32u * 1024)
#define ROOM_LEN ((size_t)N_LAYERS * N_PAGES * PAGE_LEN)
#define WAIT_MS  30000

/* One engine playing both roles: it serves the room its twin offers and offers one to it. */
typedef struct side_s {
    const char *id;
    int seed; /* the pattern its prefill side writes */
    baton_xfer_engine_t *eng;
    baton_xfer_mem_t *src, *dst;
    struct side_s *twin;
    int rooms_closed, room_status;
    int offer_done, offer_status, offer_bad_bytes;
    int closed;
    /* its log callback */
    pthread_mutex_t log_lock;
    int log_lines, log_below_level, log_own_start, log_foreign_start, log_peer_up;
    int log_level;
    pthread_t host; /* own-progress mode: the thread every callback must run on */
    int wrong_thread;
} side_t;

static uint8_t pattern(int seed, size_t i)
{
    return (uint8_t)(seed * 101 + i * 7 + (i >> 12));
}

static void on_log(void *data, baton_xfer_log_level_t level, const char *msg)
{
    side_t *s = data;
    char own[96], other[96];
    snprintf(own, sizeof(own), "engine_started id=%s ", s->id);
    snprintf(other, sizeof(other), "engine_started id=%s ", s->twin->id);
    pthread_mutex_lock(&s->log_lock);
    s->log_lines++;
    if (s->log_level >= 0 && (int)level < s->log_level)
        s->log_below_level++;
    if (strstr(msg, own) != NULL)
        s->log_own_start++;
    if (strstr(msg, other) != NULL)
        s->log_foreign_start++; /* the twin's line reached this engine's callback */
    if (strncmp(msg, "comp=xfer peer_up ", 18) == 0)
        s->log_peer_up++; /* logged on the engine's progress thread */
    pthread_mutex_unlock(&s->log_lock);
}

static void check_thread(side_t *s)
{
    if (s->host && !pthread_equal(s->host, pthread_self()))
        s->wrong_thread++;
}

static void on_written(baton_xfer_room_t *room, uint32_t layer, int status, void *data)
{
    side_t *s = data;
    check_thread(s);
    if (status != 0)
        return;
    baton_xfer_done_t done = {0, s->seed, (const uint8_t *)s->id, strlen(s->id)};
    assert_int_equal(baton_xfer_room_complete(room, &done), 0);
}

static void on_room(baton_xfer_engine_t *eng, baton_xfer_room_t *room, void *data)
{
    side_t *s = data;
    check_thread(s);
    assert_int_equal(baton_xfer_room_layers(room), N_LAYERS);
    assert_int_equal(baton_xfer_room_pages_per_layer(room), N_PAGES);
    baton_xfer_iov_t src[N_LAYERS * N_PAGES];
    uint8_t *base = baton_xfer_mem_addr(s->src);
    for (int j = 0; j < N_LAYERS * N_PAGES; j++) {
        src[j].addr = base + (size_t)j * PAGE_LEN;
        src[j].len = PAGE_LEN;
    }
    assert_int_equal(baton_xfer_write_room(room, src, N_LAYERS * N_PAGES, on_written, s), 0);
}

static void on_room_closed(baton_xfer_engine_t *eng, baton_xfer_room_t *room, int status,
                           void *data)
{
    side_t *s = data;
    check_thread(s);
    s->room_status = status;
    s->rooms_closed++;
}

static void on_offer_done(void *data, uint64_t room_id, int status, const baton_xfer_done_t *done)
{
    side_t *s = data;
    check_thread(s);
    s->offer_status = status;
    s->offer_done++;
    if (status != 0)
        return;
    /* What the twin's prefill side wrote, and its DONE payload. */
    assert_int_equal(done->first_token, s->twin->seed);
    assert_int_equal(done->payload_len, strlen(s->twin->id));
    assert_memory_equal(done->payload, s->twin->id, done->payload_len);
    const uint8_t *p = baton_xfer_mem_addr(s->dst);
    for (size_t i = 0; i < ROOM_LEN; i++)
        s->offer_bad_bytes += p[i] != pattern(s->twin->seed, i);
}

static void on_closed(baton_xfer_engine_t *eng, void *data)
{
    side_t *s = data;
    check_thread(s);
    s->closed = 1;
}

static void side_init(side_t *s, const char *id, int seed, side_t *twin, int log_level)
{
    memset(s, 0, sizeof(*s));
    s->id = id;
    s->seed = seed;
    s->twin = twin;
    s->log_level = log_level;
    s->offer_status = 1;
    s->room_status = 1;
    pthread_mutex_init(&s->log_lock, NULL);
}

static void side_create(side_t *s, uv_loop_t *loop, baton_xfer_transport_t tp)
{
    baton_xfer_config_t cfg;
    baton_xfer_config_init(&cfg);
    cfg.engine_id = s->id;
    cfg.listen_host = "127.0.0.1";
    cfg.transports[0] = tp;
    cfg.n_transports = 1;
    cfg.log_cb = on_log;
    cfg.log_data = s;
    cfg.log_level = s->log_level;
    baton_xfer_callbacks_t cbs = {on_room, on_room_closed, NULL, s};
    assert_int_equal(baton_xfer_engine_create(loop, &cfg, &cbs, &s->eng), 0);
    assert_int_equal(baton_xfer_mem_alloc(s->eng, ROOM_LEN, &s->src), 0);
    assert_int_equal(baton_xfer_mem_alloc(s->eng, ROOM_LEN, &s->dst), 0);
    uint8_t *p = baton_xfer_mem_addr(s->src);
    for (size_t i = 0; i < ROOM_LEN; i++)
        p[i] = pattern(s->seed, i);
}

/* Offers a room of s's dst pages to its twin. */
static int side_offer(side_t *s, uint64_t room_id)
{
    baton_xfer_iov_t pages[N_LAYERS * N_PAGES];
    uint8_t *base = baton_xfer_mem_addr(s->dst);
    for (int j = 0; j < N_LAYERS * N_PAGES; j++) {
        pages[j].addr = base + (size_t)j * PAGE_LEN;
        pages[j].len = PAGE_LEN;
    }
    baton_xfer_offer_t offer = {room_id, N_LAYERS, N_PAGES, pages, NULL};
    return baton_xfer_offer(s->eng, "127.0.0.1", baton_xfer_engine_listen_port(s->twin->eng),
                            &offer, on_offer_done, s);
}

static int handoffs_done(side_t *a, side_t *b)
{
    return a->offer_done && b->offer_done && a->rooms_closed && b->rooms_closed;
}

static void check_handoffs(side_t *a, side_t *b)
{
    side_t *sides[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        side_t *s = sides[i];
        assert_int_equal(s->offer_done, 1);
        assert_int_equal(s->offer_status, 0);
        assert_int_equal(s->offer_bad_bytes, 0);
        assert_int_equal(s->rooms_closed, 1);
        assert_int_equal(s->room_status, 0);
        assert_int_equal(s->wrong_thread, 0);
        /* Counters are per engine: one room served, one received, nothing of the twin's. */
        baton_xfer_stats_t st;
        baton_xfer_engine_stats(s->eng, &st);
        assert_int_equal(st.rooms_done, 2);
        assert_int_equal(st.rooms_failed, 0);
        assert_int_equal(st.bytes_written, ROOM_LEN);
        assert_int_equal(st.bytes_received, ROOM_LEN);
    }
}

static void check_logs(side_t *s)
{
    pthread_mutex_lock(&s->log_lock);
    assert_true(s->log_lines > 0);
    assert_int_equal(s->log_own_start, 1);     /* its own engine_started came to it ... */
    assert_int_equal(s->log_foreign_start, 0); /* ... and the twin's did not */
    assert_int_equal(s->log_below_level, 0);
    assert_true(s->log_peer_up >= 1); /* the progress thread's lines come here too */
    pthread_mutex_unlock(&s->log_lock);
}

/* ---- two engines on one caller loop ----------------------------------------------------- */

static void run_loop_until(uv_loop_t *loop, side_t *a, side_t *b, int (*pred)(side_t *, side_t *))
{
    uint64_t deadline = uv_hrtime() / 1000000 + WAIT_MS;
    while (!pred(a, b)) {
        if (uv_hrtime() / 1000000 > deadline)
            fail_msg("timed out");
        uv_run(loop, UV_RUN_ONCE);
    }
}

static int both_closed(side_t *a, side_t *b)
{
    return a->closed && b->closed;
}

static void two_engines_loop_mode(baton_xfer_transport_t tp)
{
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    side_t a, b;
    side_init(&a, "lib-a", 1, &b, BATON_XFER_LOG_INFO);
    side_init(&b, "lib-b", 2, &a, BATON_XFER_LOG_DEBUG);
    side_create(&a, &loop, tp);
    side_create(&b, &loop, tp);
    /* Loop mode has no fd and no dispatch. */
    assert_int_equal(baton_xfer_engine_fd(a.eng), -1);
    assert_int_equal(baton_xfer_engine_dispatch(a.eng), BATON_XFER_EINVAL);
    /* Both directions at once, with the same room id: rooms are per engine. */
    assert_int_equal(side_offer(&a, 77), 0);
    assert_int_equal(side_offer(&b, 77), 0);
    run_loop_until(&loop, &a, &b, handoffs_done);
    check_handoffs(&a, &b);
    baton_xfer_transport_t got;
    assert_int_equal(baton_xfer_engine_transports(a.eng, &got, 1), 1);
    assert_int_equal(got, tp);
    assert_int_equal(baton_xfer_mem_deregister(a.eng, a.src), 0);
    assert_int_equal(baton_xfer_mem_deregister(b.eng, b.dst), 0);
    baton_xfer_engine_destroy(a.eng, on_closed, &a);
    baton_xfer_engine_destroy(b.eng, on_closed, &b);
    run_loop_until(&loop, &a, &b, both_closed);
    check_logs(&a);
    check_logs(&b);
    assert_int_equal(uv_loop_close(&loop), 0);
}

static void test_two_engines_tcp(void **state)
{
    two_engines_loop_mode(BATON_XFER_TRANSPORT_TCP);
}

static void test_two_engines_shm(void **state)
{
    two_engines_loop_mode(BATON_XFER_TRANSPORT_SHM);
}

/* ---- own-progress mode: the host thread never runs a uv loop ----------------------------- */

/* Polls both engines' fds and dispatches on this thread until pred holds. */
static void pump_until(side_t *a, side_t *b, int (*pred)(side_t *, side_t *))
{
    uint64_t deadline = uv_hrtime() / 1000000 + WAIT_MS;
    while (!pred(a, b)) {
        if (uv_hrtime() / 1000000 > deadline)
            fail_msg("timed out");
        side_t *sides[2] = {a, b};
        struct pollfd pfd[2];
        int n = 0;
        for (int i = 0; i < 2; i++)
            if (!sides[i]->closed)
                pfd[n++] =
                    (struct pollfd){.fd = baton_xfer_engine_fd(sides[i]->eng), .events = POLLIN};
        assert_true(poll(pfd, (nfds_t)n, 200) >= 0);
        for (int i = 0; i < 2; i++)
            if (!sides[i]->closed)
                assert_true(baton_xfer_engine_dispatch(sides[i]->eng) >= 0);
    }
}

static void *offer_thread(void *arg)
{
    side_t *s = arg;
    intptr_t rc = side_offer(s, 0xfeedull);
    return (void *)rc;
}

static void own_progress_mode(baton_xfer_transport_t tp)
{
    side_t a, b;
    side_init(&a, "own-a", 3, &b, BATON_XFER_LOG_INFO);
    side_init(&b, "own-b", 4, &a, BATON_XFER_LOG_WARN);
    a.host = b.host = pthread_self();
    side_create(&a, NULL, tp);
    side_create(&b, NULL, tp);
    assert_true(baton_xfer_engine_fd(a.eng) >= 0);
    assert_true(baton_xfer_engine_fd(b.eng) >= 0);
    assert_int_not_equal(baton_xfer_engine_fd(a.eng), baton_xfer_engine_fd(b.eng));
    /* The functions are thread-safe in this mode: a's offer comes from another thread, while
     * this thread may be dispatching; callbacks still run only on this (polling) thread. */
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, offer_thread, &a), 0);
    assert_int_equal(side_offer(&b, 0xfeedull), 0);
    void *rc;
    assert_int_equal(pthread_join(t, &rc), 0);
    assert_int_equal((intptr_t)rc, 0);
    pump_until(&a, &b, handoffs_done);
    check_handoffs(&a, &b);
    baton_xfer_engine_destroy(a.eng, on_closed, &a);
    baton_xfer_engine_destroy(b.eng, on_closed, &b);
    pump_until(&a, &b, both_closed);
    check_logs(&a);
    /* b logs only warnings and errors: engine_started (info) never reached it. */
    pthread_mutex_lock(&b.log_lock);
    assert_int_equal(b.log_own_start, 0);
    assert_int_equal(b.log_below_level, 0);
    pthread_mutex_unlock(&b.log_lock);
}

static void test_own_progress_tcp(void **state)
{
    own_progress_mode(BATON_XFER_TRANSPORT_TCP);
}

static void test_own_progress_shm(void **state)
{
    own_progress_mode(BATON_XFER_TRANSPORT_SHM);
}

/* ---- config, errors, version ------------------------------------------------------------- */

static void test_config_size(void **state)
{
    baton_xfer_config_t cfg;
    baton_xfer_config_init(&cfg);
    assert_int_equal(cfg.size, sizeof(cfg));
    assert_int_equal(cfg.log_level, -1);
    assert_null(cfg.log_cb);
    baton_xfer_engine_t *eng = NULL;
    cfg.size = 0; /* never initialized */
    assert_int_equal(baton_xfer_engine_create(NULL, &cfg, NULL, &eng), BATON_XFER_EINVAL);
    cfg.size = offsetof(baton_xfer_config_t, log_cb); /* older than this library reads */
    assert_int_equal(baton_xfer_engine_create(NULL, &cfg, NULL, &eng), BATON_XFER_EINVAL);
    baton_xfer_config_init(&cfg);
    cfg.log_level = BATON_XFER_LOG_ERROR + 1;
    assert_int_equal(baton_xfer_engine_create(NULL, &cfg, NULL, &eng), BATON_XFER_EINVAL);
    assert_null(eng);
}

static void test_error_table(void **state)
{
    int n = 0;
#define XX(name, value, msg)                                                                       \
    assert_int_equal(BATON_XFER_##name, value);                                                    \
    assert_int_equal(BATON_##name, value); /* error.h keeps the tree's names and values */         \
    assert_string_equal(baton_xfer_strerror(value), msg);                                          \
    assert_string_equal(baton_xfer_strerror(value), baton_strerror(value));                        \
    assert_string_equal(baton_xfer_err_name(value), "BATON_XFER_" #name);                          \
    n++;
    BATON_XFER_ERRNO_MAP(XX)
#undef XX
    assert_int_equal(n, 19);
    /* The router's codes stay in error.h only, with their values. */
    assert_int_equal(BATON_ENOWORKER, -20025);
    assert_int_equal(BATON_ETIMEOUT_IDLE, -20014);
    /* libuv / errno codes pass through. */
    assert_string_equal(baton_xfer_strerror(UV_ECONNREFUSED), uv_strerror(UV_ECONNREFUSED));
    assert_string_equal(baton_xfer_err_name(UV_ECONNREFUSED), "ECONNREFUSED");
    assert_string_equal(baton_xfer_strerror(0), "success");
}

static void test_version(void **state)
{
    assert_int_equal(baton_version(), BATON_VERSION_HEX);
    char v[32];
    snprintf(v, sizeof(v), "%d.%d.%d", BATON_VERSION_MAJOR, BATON_VERSION_MINOR,
             BATON_VERSION_PATCH);
    assert_string_equal(baton_version_string(), v);
    assert_string_equal(BATON_VERSION_STRING, v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),          cmocka_unit_test(test_error_table),
        cmocka_unit_test(test_config_size),      cmocka_unit_test(test_two_engines_tcp),
        cmocka_unit_test(test_two_engines_shm),  cmocka_unit_test(test_own_progress_tcp),
        cmocka_unit_test(test_own_progress_shm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
