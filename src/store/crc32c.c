/* store/crc32c.c — CRC32C (Castagnoli), the store's object checksum: SSE4.2's crc32 instruction
 * when the CPU has it, a slicing-by-8 table otherwise; and baton_store_strerror. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "baton/store.h"

#define POLY 0x82f63b78u /* reflected Castagnoli polynomial */

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

/* The portable path (also what the tests compare the hardware path with). */
uint32_t baton__crc32c_sw(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&table_once, table_init);
    const uint8_t *p = buf;
    crc = ~crc;
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        v ^= crc; /* little-endian hosts: the low four bytes meet the running CRC */
        crc = table[7][v & 0xff] ^ table[6][(v >> 8) & 0xff] ^ table[5][(v >> 16) & 0xff] ^
              table[4][(v >> 24) & 0xff] ^ table[3][(v >> 32) & 0xff] ^ table[2][(v >> 40) & 0xff] ^
              table[1][(v >> 48) & 0xff] ^ table[0][v >> 56];
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const void *buf,
                                                            size_t len)
{
    const uint8_t *p = buf;
    uint64_t c = ~crc;
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
        p += 8;
        len -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (len--)
        c32 = __builtin_ia32_crc32qi(c32, *p++);
    return ~c32;
}

int baton__crc32c_hw_available(void)
{
    return __builtin_cpu_supports("sse4.2") != 0;
}
#else
static uint32_t crc32c_hw(uint32_t crc, const void *buf, size_t len)
{
    return baton__crc32c_sw(crc, buf, len);
}

int baton__crc32c_hw_available(void)
{
    return 0;
}
#endif

uint32_t baton_store_crc32c(uint32_t crc, const void *buf, size_t len)
{
    static int hw = -1; /* races only between threads that compute the same answer */
    if (hw < 0)
        hw = baton__crc32c_hw_available();
    return hw ? crc32c_hw(crc, buf, len) : baton__crc32c_sw(crc, buf, len);
}

const char *baton_store_strerror(int err)
{
    switch (err) {
#define XX(name, value, msg)                                                                       \
    case value:                                                                                    \
        return msg;
        BATON_STORE_ERRNO_MAP(XX)
#undef XX
    default:
        return baton_xfer_strerror(err);
    }
}
