/* test_hash.c — common/hash.h: FNV-1a 64 and 32 against published vectors, incremental use equal
 * to one pass, and the table mixer spreading keys into low bits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "common/hash.h"

static void test_fnv1a64_vectors(void **state)
{
    (void)state;
    /* Published FNV-1a 64 test vectors (Fowler/Noll/Vo). */
    assert_true(baton_fnv1a64("", 0) == 0xcbf29ce484222325ull);
    assert_true(baton_fnv1a64("a", 1) == 0xaf63dc4c8601ec8cull);
    assert_true(baton_fnv1a64("foobar", 6) == 0x85944171f73967e8ull);
    assert_true(baton_fnv1a64_add_str(BATON_FNV1A64_INIT, "foobar") == 0x85944171f73967e8ull);
}

static void test_fnv1a32_vectors(void **state)
{
    (void)state;
    assert_true(baton_fnv1a32_add_str(BATON_FNV1A32_INIT, "") == 0x811c9dc5u);
    assert_true(baton_fnv1a32_add_str(BATON_FNV1A32_INIT, "a") == 0xe40c292cu);
    assert_true(baton_fnv1a32_add_str(BATON_FNV1A32_INIT, "foobar") == 0xbf9cf968u);
}

static void test_incremental_equals_one_pass(void **state)
{
    (void)state;
    const char *text = "the quick brown fox";
    size_t n = strlen(text);
    uint64_t whole = baton_fnv1a64(text, n);
    for (size_t cut = 0; cut <= n; cut++) {
        uint64_t h = baton_fnv1a64_add(BATON_FNV1A64_INIT, text, cut);
        h = baton_fnv1a64_add(h, text + cut, n - cut);
        assert_true(h == whole);
    }
    uint64_t h = BATON_FNV1A64_INIT;
    for (size_t i = 0; i < n; i++)
        h = baton_fnv1a64_step(h, (unsigned char)text[i]);
    assert_true(h == whole);
    /* a different byte gives a different hash */
    assert_true(baton_fnv1a64("the quick brown fix", n) != whole);
}

static void test_hash_u64_spreads_low_bits(void **state)
{
    (void)state;
    /* Keys that differ only above bit 32 (page addresses, ids << 32) must not share a bucket of a
     * 256-slot table: count distinct low bytes over 256 such keys. */
    int seen[256] = {0};
    int distinct = 0;
    for (uint64_t k = 0; k < 256; k++) {
        unsigned b = (unsigned)(baton_hash_u64(k << 32) & 255);
        distinct += seen[b]++ == 0;
    }
    assert_true(distinct > 128); /* a random map hits ~162 of 256 */
    assert_true(baton_hash_u64(0) == 0);
    assert_true(baton_hash_u64(1) != 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fnv1a64_vectors),
        cmocka_unit_test(test_fnv1a32_vectors),
        cmocka_unit_test(test_incremental_equals_one_pass),
        cmocka_unit_test(test_hash_u64_spreads_low_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
