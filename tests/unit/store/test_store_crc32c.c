/* test_store_crc32c.c — the object checksum: the CRC32C check value, the SSE4.2 path against the
 * table at every length and alignment, chaining, and (printed, not asserted) the cost per GiB. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "baton/store.h"

uint32_t baton__crc32c_sw(uint32_t crc, const void *buf, size_t len);
int baton__crc32c_hw_available(void);

static void test_check_value(void **state)
{
    (void)state;
    /* The CRC-32C check value (RFC 3720, B.4): "123456789" → 0xE3069283. */
    assert_int_equal(baton_store_crc32c(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(baton__crc32c_sw(0, "123456789", 9), 0xE3069283u);
    uint8_t zeros[32] = {0};
    assert_int_equal(baton_store_crc32c(0, zeros, 32), 0x8A9136AAu); /* RFC 3720 B.4 */
    assert_int_equal(baton_store_crc32c(0, NULL, 0), 0);
}

static void test_hw_matches_sw(void **state)
{
    (void)state;
    uint8_t buf[4096 + 16];
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (uint8_t)(i * 2654435761u >> 13);
    for (size_t off = 0; off < 8; off++)
        for (size_t len = 0; len < 300; len++)
            assert_int_equal(baton_store_crc32c(0, buf + off, len),
                             baton__crc32c_sw(0, buf + off, len));
    /* chaining: crc(a|b) == crc(crc(a), b) */
    uint32_t whole = baton_store_crc32c(0, buf, 4096);
    uint32_t part = baton_store_crc32c(baton_store_crc32c(0, buf, 1000), buf + 1000, 3096);
    assert_int_equal(whole, part);
    /* one flipped bit changes it */
    buf[77] ^= 4;
    assert_int_not_equal(baton_store_crc32c(0, buf, 4096), whole);
}

static double gib_per_s(uint32_t (*f)(uint32_t, const void *, size_t), const uint8_t *b, size_t len,
                        int rounds)
{
    struct timespec t0, t1;
    uint32_t sink = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < rounds; i++)
        sink ^= f(0, b, len);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    if (sink == 0x12345678u)
        printf("#");
    return (double)len * rounds / s / (1024.0 * 1024.0 * 1024.0);
}

/* The cost the store's docs state: printed, never asserted (the machine may be loaded). */
static void test_cost(void **state)
{
    (void)state;
    size_t len = 4u << 20;
    uint8_t *b = malloc(len);
    assert_non_null(b);
    memset(b, 0x5a, len);
    printf("crc32c hw=%d: %.2f GiB/s (hardware path), %.2f GiB/s (table), 4 MiB buffer\n",
           baton__crc32c_hw_available(), gib_per_s(baton_store_crc32c, b, len, 64),
           gib_per_s(baton__crc32c_sw, b, len, 16));
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_value),
        cmocka_unit_test(test_hw_matches_sw),
        cmocka_unit_test(test_cost),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
