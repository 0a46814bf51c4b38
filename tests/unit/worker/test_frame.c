/* test_frame.c — bootstrap frame codec (round trips, truncation, garbage) and the room map. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "baton/error.h"
#include "worker/frame.h"
#include "worker/roommap.h"

static void test_roundtrip(void **state)
{
    wk_frame_t in[] = {
        {.type = WK_FRAME_WAIT, .room = 0x0123456789abcdefULL},
        {.type = WK_FRAME_DONE,
         .room = UINT64_MAX >> 1,
         .status = 0,
         .prompt_tokens = 4000000000u,
         .first_token = 63},
        {.type = WK_FRAME_DONE, .room = 1, .status = BATON_EKVCORRUPT, .first_token = -1},
        {.type = WK_FRAME_ABORT, .room = 7, .status = BATON_ETIMEOUT},
    };
    size_t sizes[] = {16, 28, 28, 20};
    uint8_t buf[WK_FRAME_MAX * 4];
    size_t off = 0;
    for (size_t i = 0; i < 4; i++) {
        size_t n = wk_frame_encode(&in[i], buf + off);
        assert_int_equal(n, sizes[i]);
        off += n;
    }
    /* byte layout of the first: 'B' 'T' 1 1, length 8, room big-endian */
    static const uint8_t wait_bytes[] = {'B',  'T',  1,    1,    0,    0,    0,    8,
                                         0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef};
    assert_memory_equal(buf, wait_bytes, sizeof(wait_bytes));
    /* decode back-to-back frames from one buffer */
    size_t pos = 0;
    for (size_t i = 0; i < 4; i++) {
        wk_frame_t f;
        const char *why = NULL;
        int n = wk_frame_decode(buf + pos, off - pos, &f, &why);
        assert_int_equal(n, (int)sizes[i]);
        assert_int_equal(f.type, in[i].type);
        assert_true(f.room == in[i].room);
        if (f.type != WK_FRAME_WAIT)
            assert_int_equal(f.status, in[i].status);
        if (f.type == WK_FRAME_DONE) {
            assert_int_equal(f.prompt_tokens, in[i].prompt_tokens);
            assert_int_equal(f.first_token, in[i].first_token);
        }
        pos += (size_t)n;
    }
    assert_int_equal(pos, off);
}

static void test_truncated(void **state)
{
    wk_frame_t in = {.type = WK_FRAME_DONE, .room = 42, .prompt_tokens = 3, .first_token = 5};
    uint8_t buf[WK_FRAME_MAX];
    size_t n = wk_frame_encode(&in, buf);
    for (size_t len = 0; len < n; len++) {
        wk_frame_t f;
        const char *why = NULL;
        assert_int_equal(wk_frame_decode(buf, len, &f, &why), 0); /* need more */
    }
}

static void expect_bad(const uint8_t *b, size_t len, const char *why_want)
{
    wk_frame_t f;
    const char *why = NULL;
    assert_int_equal(wk_frame_decode(b, len, &f, &why), BATON_EPROTO);
    assert_non_null(why);
    assert_string_equal(why, why_want);
}

static void test_malformed(void **state)
{
    /* refused on the first wrong byte, without waiting for a whole header */
    expect_bad((const uint8_t *)"G", 1, "bad magic");
    expect_bad((const uint8_t *)"GET / HTTP/1.1\r\n", 16, "bad magic");
    expect_bad((const uint8_t *)"BX", 2, "bad magic");
    expect_bad((const uint8_t *)"BT\x02", 3, "unsupported version");
    expect_bad((const uint8_t *)"BT\x01\x00", 4, "unknown frame type");
    expect_bad((const uint8_t *)"BT\x01\x09", 4, "unknown frame type");
    /* length must match the type exactly (also huge lengths: nothing is buffered for them) */
    const uint8_t wrong_len[] = {'B', 'T', 1, WK_FRAME_WAIT, 0, 0, 0, 9};
    expect_bad(wrong_len, sizeof(wrong_len), "wrong payload length");
    const uint8_t huge[] = {'B', 'T', 1, WK_FRAME_DONE, 0xff, 0xff, 0xff, 0xff};
    expect_bad(huge, sizeof(huge), "wrong payload length");
}

static void test_fuzz(void **state)
{
    /* random and mutated input: every answer is "need more", a frame within bounds, or EPROTO */
    srand(12345);
    uint8_t buf[64];
    for (int iter = 0; iter < 200000; iter++) {
        size_t len = (size_t)(rand() % (int)sizeof(buf));
        if (iter % 2 == 0) {
            wk_frame_t f = {.type = (wk_frame_type_t)(1 + rand() % 3), .room = (uint64_t)rand()};
            size_t n = wk_frame_encode(&f, buf);
            for (size_t k = n; k < sizeof(buf); k++)
                buf[k] = (uint8_t)rand();
            buf[rand() % (int)n] ^= (uint8_t)(1u << (rand() % 8)); /* one flipped bit */
        } else {
            for (size_t k = 0; k < sizeof(buf); k++)
                buf[k] = (uint8_t)rand();
        }
        wk_frame_t f;
        const char *why = NULL;
        int rc = wk_frame_decode(buf, len, &f, &why);
        assert_true(rc == 0 || rc == BATON_EPROTO ||
                    (rc >= WK_FRAME_HEADER + 8 && rc <= WK_FRAME_MAX && (size_t)rc <= len));
        if (rc > 0)
            assert_true(f.type >= WK_FRAME_WAIT && f.type <= WK_FRAME_ABORT);
        if (rc == BATON_EPROTO)
            assert_non_null(why);
    }
}

static void test_roommap(void **state)
{
    wk_roommap_t m = WK_ROOMMAP_INIT;
    assert_null(wk_roommap_get(&m, 1));
    assert_null(wk_roommap_del(&m, 1));
    /* random insert/delete against a plain array model */
    enum { N = 2000 };
    static uint64_t keys[N];
    static int present[N];
    int marker[N];
    srand(7);
    for (int i = 0; i < N; i++)
        keys[i] = ((uint64_t)rand() << 32) ^ (uint64_t)rand() ^ ((uint64_t)i << 50);
    size_t count = 0;
    for (int iter = 0; iter < 50000; iter++) {
        int i = rand() % N;
        if (present[i]) {
            assert_ptr_equal(wk_roommap_del(&m, keys[i]), &marker[i]);
            present[i] = 0;
            count--;
        } else {
            assert_int_equal(wk_roommap_put(&m, keys[i], &marker[i]), 0);
            present[i] = 1;
            count++;
        }
        if (iter % 997 == 0) {
            for (int k = 0; k < N; k++)
                assert_ptr_equal(wk_roommap_get(&m, keys[k]), present[k] ? &marker[k] : NULL);
        }
        assert_int_equal(m.n, count);
    }
    int i = 0;
    while (!present[i])
        i++;
    assert_int_equal(wk_roommap_put(&m, keys[i], &marker[i]), BATON_EEXIST);
    assert_int_equal(wk_roommap_put(&m, 12345, NULL), BATON_EINVAL);
    /* room 0 is a valid key */
    assert_int_equal(wk_roommap_put(&m, 0, &marker[0]), 0);
    assert_ptr_equal(wk_roommap_get(&m, 0), &marker[0]);
    wk_roommap_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip), cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_malformed), cmocka_unit_test(test_fuzz),
        cmocka_unit_test(test_roommap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
