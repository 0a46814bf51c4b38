/* test_xfer_pull_rdma.c — pull mode over rdma through the whole engine (two libbaton engines in one
 * process, their rdma transport on the verbs model): the puller READs the holder's exported pages
 * (no RDMA WRITE moves a byte), DONE's payload arrives with the grant, the holder's export ends
 * when the puller says READ_DONE; a released export is not readable; a READ failing mid-pull ends
 * the pull on both sides with peer-down and the engines pull again after the reconnect; an abort
 * or a room timeout while READs are posted waits for them; the holder gone mid-read. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <uv.h>

#include "baton/transfer.h"
#include "verbs_model.h"

#define N_LAYERS 3
#define N_PAGES  4
#define PAGE_LEN (200u * 1024 + 8) /* several 64 KiB READs per page, and a short tail */
#define LEN      ((size_t)N_LAYERS * N_PAGES * PAGE_LEN)
#define WAIT_MS  30000

typedef struct {
    uv_loop_t loop;
    baton_xfer_engine_t *holder, *puller;
    baton_xfer_mem_t *src, *dst;
    int app_rooms;
    int export_cbs, export_status;
    int offer_cbs, offer_status;
    int64_t first_token;
    char payload[16];
    int closed;
    int drive; /* the model runs WRs only when the test says so (vm_run in run_until) */
} rt_t;

static rt_t T;
static uint32_t g_puller_timeout_ms; /* the puller's room_timeout_ms (setup_timeout) */

static uint8_t pattern(size_t i, unsigned salt)
{
    return (uint8_t)((i * 131u) ^ (i >> 9) ^ salt);
}

static void on_room(baton_xfer_engine_t *eng, baton_xfer_room_t *room, void *data)
{
    (void)eng;
    (void)data;
    T.app_rooms++;
    baton_xfer_room_abort(room, BATON_XFER_EABORTED); /* this application serves no offers */
}

static void on_room_closed(baton_xfer_engine_t *eng, baton_xfer_room_t *room, int status,
                           void *data)
{
    (void)eng;
    (void)room;
    (void)status;
    (void)data;
}

static void on_export(baton_xfer_engine_t *eng, uint64_t key, int status, void *data)
{
    (void)eng;
    (void)key;
    (void)data;
    T.export_cbs++;
    T.export_status = status;
}

static void on_offer(void *data, uint64_t room_id, int status, const baton_xfer_done_t *done)
{
    (void)data;
    (void)room_id;
    T.offer_cbs++;
    T.offer_status = status;
    if (status == 0) {
        T.first_token = done->first_token;
        assert_true(done->payload_len < sizeof(T.payload));
        memcpy(T.payload, done->payload, done->payload_len);
        T.payload[done->payload_len] = '\0';
    }
}

static void on_closed(baton_xfer_engine_t *eng, void *data)
{
    (void)eng;
    (void)data;
    T.closed++;
}

static void run_until(int *counter, int want)
{
    uint64_t deadline = uv_hrtime() / 1000000 + WAIT_MS;
    while (*counter < want) {
        if (uv_hrtime() / 1000000 > deadline)
            fail_msg("timed out");
        if (T.drive) {
            vm_run();
            uv_run(&T.loop, UV_RUN_NOWAIT);
            uv_sleep(1);
        } else {
            uv_run(&T.loop, UV_RUN_ONCE);
        }
    }
}

/* Drive mode: runs the loop until the model holds at least one posted READ not yet run. */
static void run_until_reads_queued(void)
{
    uint64_t deadline = uv_hrtime() / 1000000 + WAIT_MS;
    while (vm_queued() == 0) {
        if (uv_hrtime() / 1000000 > deadline)
            fail_msg("no READ was posted");
        uv_run(&T.loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
}

/* Drive mode: loop turns until every QP on the holder's NICs (0, 1) has left RTS. */
static void run_until_holder_qps_down(void)
{
    uint64_t deadline = uv_hrtime() / 1000000 + WAIT_MS;
    for (;;) {
        uint32_t qpns[64];
        int n = vm_qp_list(qpns, 64), up = 0;
        for (int i = 0; i < n && i < 64; i++) {
            vm_qp_info_t qi;
            vm_qp_info(qpns[i], &qi);
            up += qi.dev < 2 && !qi.destroyed && qi.state == IBV_QPS_RTS;
        }
        if (up == 0)
            return;
        if (uv_hrtime() / 1000000 > deadline)
            fail_msg("the holder's QPs stayed up");
        uv_run(&T.loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
}

/* Drive mode: a few loop turns while the model runs nothing (what must not happen yet). */
static void idle_turns(void)
{
    for (int i = 0; i < 50; i++) {
        uv_run(&T.loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
}

static int setup(void **state)
{
    (void)state;
    memset(&T, 0, sizeof(T));
    vm_reset();
    for (int i = 0; i < 4; i++) {
        vm_dev_cfg_t c;
        vm_dev_cfg_default(&c, i);
        assert_int_equal(vm_add_device(&c), i);
    }
    vm_set_auto_execute(1); /* the engines' threads post; WRs run inside their posts */
    assert_int_equal(uv_loop_init(&T.loop), 0);
    baton_xfer_config_t cfg;
    baton_xfer_config_init(&cfg);
    cfg.transports[0] = BATON_XFER_TRANSPORT_RDMA;
    cfg.n_transports = 1;
    cfg.engine_id = "holder";
    cfg.listen_host = "127.0.0.1";
    cfg.listen_port = 0;
    cfg.heartbeat_interval_ms = 100;
    cfg.reconnect_min_ms = 10;
    cfg.reconnect_max_ms = 50;
    baton_xfer_callbacks_t cbs = {on_room, on_room_closed, NULL, NULL};
    vm_set_visible(0, 2); /* the holder's NICs */
    assert_int_equal(baton_xfer_engine_create(&T.loop, &cfg, &cbs, &T.holder), 0);
    cfg.engine_id = "puller";
    cfg.listen_host = NULL;
    cfg.room_timeout_ms = g_puller_timeout_ms;
    baton_xfer_callbacks_t none = {NULL, NULL, NULL, NULL};
    vm_set_visible(2, 2); /* the puller's */
    assert_int_equal(baton_xfer_engine_create(&T.loop, &cfg, &none, &T.puller), 0);
    vm_set_visible(0, -1);
    assert_int_equal(baton_xfer_mem_alloc(T.holder, LEN, &T.src), 0);
    assert_int_equal(baton_xfer_mem_alloc(T.puller, LEN, &T.dst), 0);
    return 0;
}

static int setup_timeout(void **state)
{
    g_puller_timeout_ms = 1500; /* long enough for the grant to arrive on a loaded machine */
    int rc = setup(state);
    g_puller_timeout_ms = 0;
    return rc;
}

static int teardown(void **state)
{
    (void)state;
    T.drive = 1; /* whatever the test left queued runs (or flushes) */
    vm_set_auto_execute(1);
    assert_int_equal(baton_xfer_mem_deregister(T.holder, T.src), 0);
    assert_int_equal(baton_xfer_mem_deregister(T.puller, T.dst), 0);
    baton_xfer_engine_destroy(T.holder, on_closed, NULL);
    baton_xfer_engine_destroy(T.puller, on_closed, NULL);
    run_until(&T.closed, 2);
    assert_int_equal(uv_loop_close(&T.loop), 0);
    vm_stats_t st;
    vm_stats(&st);
    assert_int_equal(st.misuse, 0);
    assert_int_equal(vm_live_objects(), 0);
    return 0;
}

static void fill(unsigned salt)
{
    uint8_t *p = baton_xfer_mem_addr(T.src);
    for (size_t i = 0; i < LEN; i++)
        p[i] = pattern(i, salt);
    memset(baton_xfer_mem_addr(T.dst), 0, LEN);
}

static int do_export(uint64_t key)
{
    baton_xfer_iov_t src[N_LAYERS * N_PAGES];
    uint8_t *base = baton_xfer_mem_addr(T.src);
    for (int j = 0; j < N_LAYERS * N_PAGES; j++)
        src[j] = (baton_xfer_iov_t){base + (size_t)j * PAGE_LEN, PAGE_LEN};
    baton_xfer_export_t ex = {key, N_LAYERS, N_PAGES,
                              src, 0,        {0, 4242, (const uint8_t *)"rdma-kv", 7}};
    return baton_xfer_export(T.holder, &ex, on_export, NULL);
}

static int do_pull(uint64_t key)
{
    baton_xfer_iov_t pages[N_LAYERS * N_PAGES];
    uint8_t *base = baton_xfer_mem_addr(T.dst);
    for (int j = 0; j < N_LAYERS * N_PAGES; j++)
        pages[j] = (baton_xfer_iov_t){base + (size_t)j * PAGE_LEN, PAGE_LEN};
    baton_xfer_offer_t offer = {key, N_LAYERS, N_PAGES, pages, NULL};
    return baton_xfer_pull(T.puller, "127.0.0.1", baton_xfer_engine_listen_port(T.holder), &offer,
                           on_offer, NULL);
}

/* The pull is served by the puller's RDMA READs: every byte in place, DONE's payload from the
 * grant, the export's callback once (after READ_DONE), no RDMA WRITE anywhere. */
static void test_pull_by_rdma_read(void **state)
{
    (void)state;
    fill(0x5a);
    assert_int_equal(do_export(7), 0);
    assert_int_equal(do_pull(7), 0);
    run_until(&T.offer_cbs, 1);
    run_until(&T.export_cbs, 1);
    assert_int_equal(T.offer_status, 0);
    assert_int_equal(T.export_status, 0);
    assert_int_equal(T.first_token, 4242);
    assert_string_equal(T.payload, "rdma-kv");
    assert_memory_equal(baton_xfer_mem_addr(T.dst), baton_xfer_mem_addr(T.src), LEN);
    assert_int_equal(T.app_rooms, 0);
    vm_stats_t st;
    vm_stats(&st);
    assert_true(st.reads_run >= LEN / (64 * 1024)); /* 64 KiB slices */
    assert_int_equal(st.bytes_landed, 0);           /* no RDMA WRITE moved a byte */
    assert_true(st.max_reads_queued <= 16);
    baton_xfer_stats_t hs, ps;
    baton_xfer_engine_stats(T.holder, &hs);
    baton_xfer_engine_stats(T.puller, &ps);
    assert_int_equal(hs.bytes_written, LEN); /* what the holder's grant served */
    assert_int_equal(ps.bytes_received, LEN);
    /* the export is over: its key is free */
    assert_int_equal(baton_xfer_export_release(T.holder, 7), BATON_XFER_ENOTFOUND);

    /* a released export is not readable: the pull is an ordinary offer (refused by this
     * application), and no READ ran for it */
    uint64_t reads = st.reads_run;
    assert_int_equal(do_export(8), 0);
    assert_int_equal(baton_xfer_export_release(T.holder, 8), 0);
    assert_int_equal(do_pull(8), 0);
    run_until(&T.offer_cbs, 2);
    assert_int_equal(T.offer_status, BATON_XFER_EABORTED);
    assert_int_equal(T.app_rooms, 1);
    vm_stats(&st);
    assert_int_equal(st.reads_run, reads);
    assert_int_equal(T.export_cbs, 1); /* a release fires no callback */
}

/* A READ completing in error mid-pull: the puller's connection fails (QPs to ERROR, fenced), its
 * pull ends with peer-down; the holder's export ends with peer-down too (its sources are free);
 * exactly one callback each. The engines reconnect and the next pull works. */
static void test_pull_read_fails_mid_way(void **state)
{
    (void)state;
    fill(0x33);
    assert_int_equal(do_export(9), 0);
    vm_fail_wr(5, IBV_WC_REM_ACCESS_ERR); /* the 5th WR to run: a READ of this pull */
    assert_int_equal(do_pull(9), 0);
    run_until(&T.offer_cbs, 1);
    run_until(&T.export_cbs, 1);
    assert_int_equal(T.offer_status, BATON_XFER_EPEERDOWN);
    assert_int_equal(T.export_status, BATON_XFER_EPEERDOWN);
    vm_stats_t st;
    vm_stats(&st);
    assert_true(st.wrs_failed >= 1);
    assert_int_equal(baton_xfer_export_release(T.holder, 9), BATON_XFER_ENOTFOUND);

    /* after the reconnect (back-off bounded by reconnect_max_ms) a new export is pulled whole */
    fill(0x77);
    assert_int_equal(do_export(10), 0);
    uint64_t deadline = uv_hrtime() / 1000000 + WAIT_MS;
    int want = 2;
    for (;;) {
        assert_int_equal(do_pull(10), 0);
        run_until(&T.offer_cbs, want);
        if (T.offer_status == 0)
            break;
        /* the peer may still be down between attempts: offers then fail fast */
        assert_int_equal(T.offer_status, BATON_XFER_EPEERDOWN);
        if (uv_hrtime() / 1000000 > deadline)
            fail_msg("no pull after the reconnect");
        want++;
        uv_sleep(20);
    }
    run_until(&T.export_cbs, 2);
    assert_int_equal(T.export_status, 0);
    assert_memory_equal(baton_xfer_mem_addr(T.dst), baton_xfer_mem_addr(T.src), LEN);
}

/* An abort while the READs are posted cannot recall them: the room waits for them (the pages
 * are still being written by our own NIC), then ends with EABORTED, and READ_DONE makes the
 * holder's export end with EABORTED too. Meanwhile the holder's region cannot be deregistered. */
static void test_abort_while_reading(void **state)
{
    (void)state;
    fill(0x44);
    vm_set_auto_execute(0);
    T.drive = 0;
    assert_int_equal(do_export(11), 0);
    assert_int_equal(do_pull(11), 0);
    run_until_reads_queued(); /* the grant arrived, READs are posted, none ran */
    assert_int_equal(baton_xfer_abort(T.puller, 11), 0);
    idle_turns();
    assert_int_equal(T.offer_cbs, 0); /* not while READs may still land */
    assert_int_equal(T.export_cbs, 0);
    assert_int_equal(baton_xfer_mem_deregister(T.holder, T.src), BATON_XFER_EBUSY);
    assert_int_equal(baton_xfer_export_release(T.holder, 11), BATON_XFER_EBUSY);
    T.drive = 1;
    run_until(&T.offer_cbs, 1);
    run_until(&T.export_cbs, 1);
    assert_int_equal(T.offer_status, BATON_XFER_EABORTED);
    assert_int_equal(T.export_status, BATON_XFER_EABORTED);
    assert_int_equal(vm_queued(), 0);
}

/* room_timeout_ms passing while the READs are posted: the timeout is recorded, the room ends
 * when they complete, with ETIMEOUT on both sides (READ_DONE carries it). */
static void test_timeout_while_reading(void **state)
{
    (void)state;
    fill(0x66);
    vm_set_auto_execute(0);
    T.drive = 0;
    assert_int_equal(do_export(13), 0);
    assert_int_equal(do_pull(13), 0);
    run_until_reads_queued();
    for (int i = 0; i < 50; i++) /* >= 2.5 s: well past the 1.5 s room timeout */
        idle_turns();
    assert_int_equal(T.offer_cbs, 0); /* not while READs may still land */
    T.drive = 1;
    run_until(&T.offer_cbs, 1);
    run_until(&T.export_cbs, 1);
    assert_int_equal(T.offer_status, BATON_XFER_ETIMEOUT);
    assert_int_equal(T.export_status, BATON_XFER_ETIMEOUT);
}

/* The holder's engine goes away while the puller's READs are posted (as when its process dies):
 * its connection is fenced (QPs to ERROR), the READs fail at its NIC, the puller's connection
 * fails and fences, and the pull ends once with peer-down. */
static void test_holder_gone_mid_read(void **state)
{
    (void)state;
    fill(0x21);
    vm_set_auto_execute(0);
    T.drive = 0;
    assert_int_equal(do_export(12), 0);
    assert_int_equal(do_pull(12), 0);
    run_until_reads_queued();
    baton_xfer_engine_destroy(T.holder, on_closed, NULL); /* drops nothing: the pull is served */
    run_until_holder_qps_down(); /* fenced before any of the puller's READs reached it */
    assert_int_equal(T.offer_cbs, 0);
    T.drive = 1;
    run_until(&T.offer_cbs, 1);
    assert_int_equal(T.offer_status, BATON_XFER_EPEERDOWN);
    run_until(&T.closed, 1);
    assert_int_equal(T.export_cbs, 1); /* the served pull ended with the engine */
    assert_int_equal(T.export_status, BATON_XFER_ESHUTDOWN);
    assert_int_equal(baton_xfer_mem_deregister(T.puller, T.dst), 0);
    baton_xfer_engine_destroy(T.puller, on_closed, NULL);
    run_until(&T.closed, 2);
    assert_int_equal(uv_loop_close(&T.loop), 0);
    vm_stats_t st;
    vm_stats(&st);
    assert_int_equal(st.misuse, 0);
    assert_int_equal(vm_live_objects(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_pull_by_rdma_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pull_read_fails_mid_way, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_while_reading, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timeout_while_reading, setup_timeout, teardown),
        cmocka_unit_test_setup(test_holder_gone_mid_read, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
