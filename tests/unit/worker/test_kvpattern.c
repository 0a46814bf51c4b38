/* test_kvpattern.c — the simulated KV bytes (golden values from tests/integration/simtext.py),
 * fill/check round trips, detection of flipped and misplaced bytes, and the model shapes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "baton/error.h"
#include "worker/kvpattern.h"
#include "worker/kvshape.h"
#include "worker/simtext.h"

static void test_golden(void **state)
{
    (void)state;
    /* printed by simtext.kv_key / simtext.kv_bytes, the independent reference */
    assert_true(wk_kv_key(0, 0, 0) == 0xe9481cedd8ace9e1ULL);
    assert_true(wk_kv_key(12345, 0, 0) == 0xd0544de0449321a2ULL);
    assert_true(wk_kv_key(7, 3, 2) == 0x73bac43cd9164b51ULL);
    assert_true(wk_kv_key(2147483647, 1000, 63) == 0x6dafb7bc1135923fULL);
    static const uint8_t want[12] = {0x51, 0x4b, 0x16, 0xd9, 0x3c, 0xc4,
                                     0xba, 0x73, 0x66, 0xc7, 0x60, 0x58};
    int64_t id = 7;
    uint8_t got[12];
    wk_kv_fill(got, sizeof(got), &id, 3, 1, 2);
    assert_memory_equal(got, want, sizeof(want));
    /* prompt token ids: the words' ids; an empty prompt is the id of "" */
    int64_t ids[4];
    assert_int_equal(wk_sim_word_ids("hello  world", 12, ids, 4), 2);
    assert_true(ids[0] == 11189515 && ids[1] == 1930201843);
    assert_int_equal(wk_sim_word_ids(" \n", 2, ids, 4), 1);
    assert_true(ids[0] == 69346085);
    /* more words than room: the count is still exact */
    assert_int_equal(wk_sim_word_ids("a b c d e", 9, ids, 2), 5);
}

/* Token bytes of every awkward size: tails of 1..7 bytes, a single byte, whole words. */
static void test_roundtrip_sizes(void **state)
{
    (void)state;
    int64_t ids[5] = {1, 99, 0, 2147483647, 5};
    for (uint64_t tb = 1; tb <= 40; tb++) {
        uint8_t *buf = malloc(5 * tb);
        assert_non_null(buf);
        wk_kv_fill(buf, tb, ids, 10, 5, 3);
        uint64_t off = 12345;
        assert_true(wk_kv_check(buf, tb, ids, 10, 5, 3, &off) == 0);
        assert_int_equal(off, 12345); /* untouched when nothing differs */
        /* each byte flipped alone is caught, at its offset */
        for (uint64_t b = 0; b < 5 * tb; b++) {
            buf[b] ^= 0x01;
            off = 0;
            assert_true(wk_kv_check(buf, tb, ids, 10, 5, 3, &off) != 0);
            assert_int_equal(off, b);
            buf[b] ^= 0x01;
        }
        free(buf);
    }
}

/* A page placed at the wrong position, layer or with the wrong token fails the check. */
static void test_misplaced(void **state)
{
    (void)state;
    const uint64_t tb = 128;
    int64_t ids[16];
    for (int i = 0; i < 16; i++)
        ids[i] = 1000 + i;
    uint8_t *a = malloc(16 * tb);
    assert_non_null(a);
    wk_kv_fill(a, tb, ids, 0, 16, 1);
    assert_true(wk_kv_check(a, tb, ids, 0, 16, 2, NULL) != 0);  /* another layer */
    assert_true(wk_kv_check(a, tb, ids, 16, 16, 1, NULL) != 0); /* another page */
    assert_true(wk_kv_check(a, tb, ids + 1, 0, 15, 1, NULL) != 0);
    int64_t other[16];
    memcpy(other, ids, sizeof(ids));
    other[9] = 7; /* another prompt token at position 9 */
    uint64_t off = 0;
    assert_true(wk_kv_check(a, tb, other, 0, 16, 1, &off) != 0);
    assert_int_equal(off, 9 * tb);
    /* zeroed memory (a page never written) is not mistaken for KV */
    memset(a, 0, 16 * tb);
    assert_true(wk_kv_check(a, tb, ids, 0, 16, 1, NULL) != 0);
    free(a);
}

static void test_shapes(void **state)
{
    (void)state;
    wk_kvshape_t s;
    assert_int_equal(wk_kvshape_preset("tiny", &s), 0);
    assert_int_equal(s.layers, 4);
    assert_int_equal(wk_kvshape_token_bytes(&s), 2 * 2 * 16 * 2);
    assert_int_equal(wk_kvshape_check(&s, NULL), 0);
    assert_int_equal(wk_kvshape_preset("llama3-8b", &s), 0);
    /* Llama 3 8B: 32 layers x 8 KV heads x 128 x bf16 x (K, V) = 128 KiB per token */
    assert_int_equal(wk_kvshape_token_bytes(&s) * s.layers, 128 * 1024);
    assert_int_equal(wk_kvshape_preset("large", &s), 0);
    assert_int_equal(s.layers, 64);
    assert_int_equal(wk_kvshape_token_bytes(&s) * s.layers, 256 * 1024);
    assert_int_equal(wk_kvshape_page_bytes(&s), 64 * 4096);
    assert_int_equal(wk_kvshape_preset("nope", &s), BATON_EINVAL);

    /* pages per layer and the short last page */
    s = (wk_kvshape_t){4, 2, 16, 2, 16};
    assert_int_equal(wk_kvshape_pages(&s, 1), 1);
    assert_int_equal(wk_kvshape_pages(&s, 16), 1);
    assert_int_equal(wk_kvshape_pages(&s, 17), 2);
    assert_int_equal(wk_kvshape_page_tokens_at(&s, 17, 0), 16);
    assert_int_equal(wk_kvshape_page_tokens_at(&s, 17, 1), 1);
    assert_int_equal(wk_kvshape_page_tokens_at(&s, 17, 2), 0);
    assert_int_equal(wk_kvshape_pages(&s, UINT32_MAX), (UINT32_MAX / 16) + 1);

    /* auto pool: 65536 tokens for tiny (32 MiB), capped at 1 GiB for big models */
    assert_int_equal(wk_kvshape_auto_pool_tokens(&s), 65536);
    assert_int_equal(wk_kvshape_preset("large", &s), 0);
    assert_int_equal(wk_kvshape_auto_pool_tokens(&s), 4096);

    /* bounds */
    const char *why = NULL;
    s = (wk_kvshape_t){0, 1, 1, 1, 1};
    assert_int_equal(wk_kvshape_check(&s, &why), BATON_EINVAL);
    assert_non_null(why);
    s = (wk_kvshape_t){1, 1, 1, 9, 1};
    assert_int_equal(wk_kvshape_check(&s, NULL), BATON_EINVAL);
    s = (wk_kvshape_t){1, 1024, 65536, 8, 65536}; /* a 64 GiB page */
    assert_int_equal(wk_kvshape_check(&s, &why), BATON_EINVAL);
    s = (wk_kvshape_t){1, 1, 1, 1, 1};
    assert_int_equal(wk_kvshape_check(&s, NULL), 0);
    assert_int_equal(wk_kvshape_auto_pool_tokens(&s), 65536);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_roundtrip_sizes),
        cmocka_unit_test(test_misplaced),
        cmocka_unit_test(test_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
