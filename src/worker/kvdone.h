/* kvdone.h — the payload of a room's DONE between two baton-workers: what the prefill computed
 * (prompt length, seed, model shape), so the decode can tell a mismatch from corruption. */
#ifndef BATON_WORKER_KVDONE_H
#define BATON_WORKER_KVDONE_H

#include <stddef.h>
#include <stdint.h>

/*
 * 40 bytes, little-endian: magic "BWKV", version, n_tokens, layers, token_bytes (8),
 * page_tokens, 4 bytes of zero, seed (8); then, from a prefill with HiCache tiers, 12 more: the
 * prompt tokens it found in L1, L2 and L3 (4 each). A decoder reads the first 40 bytes of any
 * longer payload, so either side may be the older one. Pure functions (any thread).
 * The DONE's own status field says whether the prefill wrote the room or refused the offer.
 */
#define WK_KVDONE_MAGIC       0x564B5742u /* "BWKV" */
#define WK_KVDONE_VERSION     1u
#define WK_KVDONE_LEN         52 /* what wk_kvdone_encode writes */
#define WK_KVDONE_LEN_MIN     40 /* what a decode needs */
#define WK_KVDONE_ST_OK       0
#define WK_KVDONE_ST_MISMATCH 1

typedef struct wk_kvdone_s {
    uint32_t n_tokens;
    uint32_t layers;
    uint64_t token_bytes;
    uint32_t page_tokens;
    uint64_t seed;
    int has_hits; /* the prefill's tier hits follow (decode: the payload had them) */
    uint32_t hit_l1, hit_l2, hit_l3;
} wk_kvdone_t;

void wk_kvdone_encode(const wk_kvdone_t *d, uint8_t out[WK_KVDONE_LEN]);
/* 0 and *d, or -1 when the payload is short or not a baton-worker hand-off (magic, version). */
int wk_kvdone_decode(const uint8_t *payload, size_t len, wk_kvdone_t *d);

#endif
