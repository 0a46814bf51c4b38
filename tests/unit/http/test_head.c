/* test_head.c — the one head parser of server and client: limits, finish, the trailer guard. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "http/head.h"

static void field(baton__http_head_t *h, const char *name, const char *value)
{
    /* Split as llhttp may deliver them across reads. */
    assert_int_equal(baton__http_head_field(h, name, 1), 0);
    assert_int_equal(baton__http_head_field(h, name + 1, strlen(name) - 1), 0);
    assert_int_equal(baton__http_head_field_done(h), 0);
    assert_int_equal(baton__http_head_value(h, value, strlen(value)), 0);
    assert_int_equal(baton__http_head_value_done(h), 0);
}

static void test_headers(void **state)
{
    baton__http_head_t h = {0};
    baton__http_head_begin(&h, 1024, 10);
    field(&h, "Host", "x");
    field(&h, "X-Empty", "");
    const baton_http_header_t *hs;
    size_t n;
    assert_int_equal(baton__http_head_finish(&h, &hs, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(hs[0].name, "Host");
    assert_string_equal(hs[0].value, "x");
    assert_string_equal(hs[1].name, "X-Empty");
    assert_string_equal(hs[1].value, "");
    baton_buf_free(&h.arena);
    baton_buf_free(&h.hdrs);
}

/* After finish, fields are trailers: counted against the byte limit, never stored, so the
 * arena the headers point into neither moves nor grows. */
static void test_trailer_guard(void **state)
{
    baton__http_head_t h = {0};
    baton__http_head_begin(&h, 64 * 1024, 2);
    field(&h, "A", "1");
    const baton_http_header_t *hs;
    size_t n;
    assert_int_equal(baton__http_head_finish(&h, &hs, &n), 0);
    const char *arena = h.arena.data, *name = hs[0].name;
    size_t len = h.arena.len, bytes = h.bytes;
    char big[4096];
    memset(big, 'v', sizeof(big));
    for (int i = 0; i < 8; i++) { /* more trailers than max_headers, 32 KiB of them */
        assert_int_equal(baton__http_head_field(&h, "T", 1), 0);
        assert_int_equal(baton__http_head_field_done(&h), 0);
        assert_int_equal(baton__http_head_value(&h, big, sizeof(big)), 0);
        assert_int_equal(baton__http_head_value_done(&h), 0);
    }
    assert_ptr_equal(h.arena.data, arena);
    assert_int_equal(h.arena.len, len);
    assert_int_equal(h.n_hdrs, 1);
    assert_ptr_equal(hs[0].name, name);
    assert_string_equal(hs[0].value, "1");
    assert_true(h.bytes > bytes + 8 * sizeof(big) - 1);
    /* ... and still bounded by the byte limit. */
    for (int i = 0; i < 16; i++)
        if (baton__http_head_value(&h, big, sizeof(big)) != 0) {
            assert_int_equal(baton__http_head_value(&h, "x", 1), BATON__HEAD_TOO_LARGE);
            baton_buf_free(&h.arena);
            baton_buf_free(&h.hdrs);
            return;
        }
    fail_msg("trailers passed the byte limit");
}

static void test_limits(void **state)
{
    baton__http_head_t h = {0};
    baton__http_head_begin(&h, 1024, 1);
    field(&h, "A", "1");
    assert_int_equal(baton__http_head_field(&h, "B", 1), BATON__HEAD_TOO_MANY);
    baton__http_head_begin(&h, 8, 10); /* begin empties the head and sets new limits */
    assert_int_equal(h.n_hdrs, 0);
    assert_int_equal(baton__http_head_append(&h, "GET /", 5), 0);
    assert_int_equal(baton__http_head_append(&h, "abcd", 4), BATON__HEAD_TOO_LARGE);
    baton_buf_free(&h.arena);
    baton_buf_free(&h.hdrs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_headers),
        cmocka_unit_test(test_trailer_guard),
        cmocka_unit_test(test_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
