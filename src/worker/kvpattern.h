/* kvpattern.h — the simulated KV cache's bytes: a pure function of (token id, position, layer)
 * that the prefill writes and the decode checks byte for byte. */
#ifndef BATON_WORKER_KVPATTERN_H
#define BATON_WORKER_KVPATTERN_H

#include <stddef.h>
#include <stdint.h>

/*
 * Definition (docs/WORKER.md; tests/integration/simtext.py is the reference):
 *
 *   mix(a, k)    = splitmix64 finalizer of (a + k * 0x9E3779B97F4A7C15)   (wk_sim_mix)
 *   key(t, p, l) = mix(mix(mix(WK_KV_SALT, t), p + 1), l + 1)
 *   word(i)      = key + i * 0x9E3779B97F4A7C15                            (mod 2^64)
 *
 * The K and V bytes of token id t at prompt position p in layer l are the first token_bytes bytes
 * of word(0), word(1), ... each stored little-endian. Neighbouring tokens, positions and layers
 * get unrelated keys, so a byte placed in the wrong page, layer, room or offset is caught as
 * surely as a flipped one. The stream is an add per 8 bytes: filling and checking run at memory
 * speed, which matters for the large presets (hundreds of MiB per prompt).
 */

#define WK_KV_SALT 0x6B762D6361636865ULL /* "kv-cache" */

uint64_t wk_kv_key(int64_t token, uint32_t pos, uint32_t layer);

/*
 * Writes the bytes of n_tokens consecutive tokens (ids[0..n_tokens), at positions first_pos...)
 * of `layer` into dst (n_tokens * token_bytes bytes).
 */
void wk_kv_fill(uint8_t *dst, uint64_t token_bytes, const int64_t *ids, uint32_t first_pos,
                uint32_t n_tokens, uint32_t layer);

/*
 * Checks src against what wk_kv_fill would write. Returns 0 when every byte matches, else the
 * OR of the XOR differences of the mismatching words (never 0), with the offset of the first
 * differing byte in *bad_off_p (may be NULL).
 */
uint64_t wk_kv_check(const uint8_t *src, uint64_t token_bytes, const int64_t *ids,
                     uint32_t first_pos, uint32_t n_tokens, uint32_t layer, uint64_t *bad_off_p);

#endif
