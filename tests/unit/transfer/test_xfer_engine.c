/* test_xfer_engine.c — two libbaton engines on one loop over loopback (tcp and shm): rooms of
 * mixed sizes byte-verified, layer-wise writes, abort races then page reuse, peer loss and
 * reconnect, synchronous API errors; plus a raw-socket fake prefill that sends out-of-bounds
 * writes and malformed frames, and rogue clients against the authenticated KV bootstrap. The
 * list of tests; the fixture and the tests themselves are the xfer_engine_*.c files. */
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
