/* tests/support/xfer_pattern.h — the deterministic KV byte pattern shared by the transfer test
 * peers (tools/xfer), baton-xfer-bench and the engine tests: both sides derive identical source
 * bytes from a seed, so the decode side can verify every received byte without being told what
 * was sent. Test data, not library code: reached through the target baton_test_support. */
#ifndef BATON_TEST_XFER_PATTERN_H
#define BATON_TEST_XFER_PATTERN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/rand.h"

#define XFER_POISON 0xEE

/* The pattern's mixer is common/rand.h's (splitmix64's output function): one generator. */
static inline uint64_t xfer_mix(uint64_t x)
{
    return baton_mix64(x);
}

/* Fills buf with the pattern of `seed`. */
static inline void xfer_fill_source(uint8_t *buf, size_t len, uint64_t seed)
{
    uint64_t s = xfer_mix(seed | 1);
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        s = xfer_mix(s + BATON_GOLDEN_GAMMA);
        memcpy(buf + i, &s, 8);
    }
    for (; i < len; i++)
        buf[i] = (uint8_t)xfer_mix(s + i);
}

/* Where in the source the bytes of (room, layer, page) start: any offset, so neighbouring pages
 * differ and a byte placed in the wrong page, layer or room is caught. */
static inline size_t xfer_src_offset(uint64_t room, uint32_t layer, uint32_t page, size_t src_len,
                                     size_t page_len)
{
    uint64_t h = xfer_mix(room ^ xfer_mix(((uint64_t)layer << 32) | page));
    return (size_t)(h % (src_len - page_len + 1));
}

/* The layer count, pages per layer and page length a room uses, from its id: the prefill side
 * learns the shape from the offer anyway; the decode side uses this to build it. */
static inline void xfer_room_shape(uint64_t room, uint32_t max_layers, uint32_t max_ppl,
                                   uint32_t max_page, uint32_t *layers, uint32_t *ppl,
                                   uint32_t *page_len)
{
    uint64_t h = xfer_mix(room * 3 + 1);
    *layers = 1 + (uint32_t)(h % max_layers);
    *ppl = 1 + (uint32_t)((h >> 16) % max_ppl);
    /* Mixed sizes: mostly large pages, some tiny and odd ones. */
    uint32_t r = (uint32_t)(h >> 32);
    if (r % 4 == 0)
        *page_len = 1 + r % 97;
    else
        *page_len = 1 + r % max_page;
}

#endif
