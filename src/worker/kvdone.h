/* kvdone.h — the payload of a room's DONE between two baton-workers: what the prefill computed
 * (prompt length, seed, model shape), so the decode can tell a mismatch from corruption. */
#ifndef BATON_WORKER_KVDONE_H
#define BATON_WORKER_KVDONE_H

#include <stddef.h>
#include <stdint.h>

/*
 * 40 bytes, little-endian: magic "BWKV", version, n_tokens, layers, token_bytes (8),
 * page_tokens, 4 bytes of zero, seed (8). Pure functions of their arguments (any thread).
 * The DONE's own status field says whether the prefill wrote the room or refused the offer.
 */
#define WK_KVDONE_MAGIC       0x564B5742u /* "BWKV" */
#define WK_KVDONE_VERSION     1u
#define WK_KVDONE_LEN         40
#define WK_KVDONE_ST_OK       0
#define WK_KVDONE_ST_MISMATCH 1

typedef struct wk_kvdone_s {
    uint32_t n_tokens;
    uint32_t layers;
    uint64_t token_bytes;
    uint32_t page_tokens;
    uint64_t seed;
} wk_kvdone_t;

void wk_kvdone_encode(const wk_kvdone_t *d, uint8_t out[WK_KVDONE_LEN]);
/* 0 and *d, or -1 when the payload is short or not a baton-worker hand-off (magic, version). */
int wk_kvdone_decode(const uint8_t *payload, size_t len, wk_kvdone_t *d);

#endif
