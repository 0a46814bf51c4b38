/* kvpattern.c — fills and checks the simulated KV bytes (definition in kvpattern.h). */
#include "worker/kvpattern.h"

#include <endian.h>
#include <string.h>

#include "worker/simtext.h"

uint64_t wk_kv_key(int64_t token, uint32_t pos, uint32_t layer)
{
    uint64_t k = wk_sim_mix(WK_KV_SALT, (uint64_t)token);
    k = wk_sim_mix(k, (uint64_t)pos + 1);
    return wk_sim_mix(k, (uint64_t)layer + 1);
}

void wk_kv_fill(uint8_t *dst, uint64_t token_bytes, const int64_t *ids, uint32_t first_pos,
                uint32_t n_tokens, uint32_t layer)
{
    uint64_t full = token_bytes / 8, tail = token_bytes % 8;
    for (uint32_t t = 0; t < n_tokens; t++) {
        uint64_t w = wk_kv_key(ids[t], first_pos + t, layer);
        uint8_t *p = dst + (uint64_t)t * token_bytes;
        for (uint64_t i = 0; i < full; i++, w += WK_SIM_GOLDEN) {
            uint64_t le = htole64(w);
            memcpy(p + i * 8, &le, 8);
        }
        if (tail) {
            uint64_t le = htole64(w);
            memcpy(p + full * 8, &le, tail);
        }
    }
}

uint64_t wk_kv_check(const uint8_t *src, uint64_t token_bytes, const int64_t *ids,
                     uint32_t first_pos, uint32_t n_tokens, uint32_t layer, uint64_t *bad_off_p)
{
    uint64_t full = token_bytes / 8, tail = token_bytes % 8;
    uint64_t diff = 0;
    int found = 0;
    for (uint32_t t = 0; t < n_tokens; t++) {
        uint64_t w = wk_kv_key(ids[t], first_pos + t, layer);
        const uint8_t *p = src + (uint64_t)t * token_bytes;
        uint64_t d_tok = 0;
        for (uint64_t i = 0; i < full; i++, w += WK_SIM_GOLDEN) {
            uint64_t got;
            memcpy(&got, p + i * 8, 8);
            d_tok |= le64toh(got) ^ w;
        }
        if (tail) {
            /* raw byte images of the tail, zero-padded the same way on both sides */
            uint64_t got = 0, want = 0, le = htole64(w);
            memcpy(&got, p + full * 8, tail);
            memcpy(&want, &le, tail);
            d_tok |= got ^ want;
        }
        if (d_tok == 0)
            continue;
        diff |= d_tok;
        if (!found && bad_off_p) {
            /* Only the first bad token is searched byte by byte: the slow path runs once. */
            uint8_t want[8];
            uint64_t v = wk_kv_key(ids[t], first_pos + t, layer);
            for (uint64_t b = 0; b < token_bytes; b++) {
                if (b % 8 == 0) {
                    uint64_t le = htole64(v + (b / 8) * WK_SIM_GOLDEN);
                    memcpy(want, &le, 8);
                }
                if (p[b] != want[b % 8]) {
                    *bad_off_p = (uint64_t)t * token_bytes + b;
                    break;
                }
            }
        }
        found = 1;
    }
    return diff;
}
