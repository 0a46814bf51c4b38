/* kvevents/index.h — the exact KV block index a router keeps from its workers' KV events: per
 * source (a worker's DP rank) the blocks it holds and in which tier, keyed by the index's own
 * hash of the token ids the events carry, never by the engine's (seeded) hash. */
#ifndef BATON_KVEVENTS_INDEX_H
#define BATON_KVEVENTS_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "kvevents/wire.h"

/*
 * A block's key is a chain: mix(parent's key, block_size, its token ids), the root's parent a
 * constant. Two engines that hold the same prefix in blocks of the same size give the same keys
 * whatever their hash seeds, and a request's token ids hash to the same keys. The engine's hash
 * only names a block again: each source maps engine hash -> key for its removals and for the
 * parents of later blocks. A stored block whose parent the source never announced cannot be
 * keyed (its prefix is unknown) and is counted as orphaned, not indexed.
 *
 * Sources are numbered 0..BATON_KVIDX_MAX_SOURCES-1 by the caller (a worker's DP rank each).
 * A block's holders are two bit sets (L1 "GPU" or nil medium, L2 "CPU" or anything else).
 *
 * Threading: one writer (apply, clear) and any number of readers (match) at once, under the
 * index's read-write lock. The writer holds it for at most BATON_KVIDX_WRITE_SLICE blocks at a
 * time (a large batch is applied in slices, the lock released between them), so a reader on a
 * request path waits for one slice at most, never for a whole batch; readers see the batch
 * partly applied meanwhile, which a routing guess tolerates.
 */
#define BATON_KVIDX_WRITE_SLICE 256
#define BATON_KVIDX_MAX_SOURCES 64

typedef struct baton_kvidx baton_kvidx_t;

typedef struct {
    uint64_t blocks;         /* blocks this source holds, both tiers (engine hashes known) */
    uint64_t blocks_l1;      /* distinct indexed blocks it holds in L1 */
    uint64_t blocks_l2;      /* ... and in L2 only */
    uint64_t orphaned;       /* stored blocks whose parent was unknown */
    uint64_t unknown_removes; /* removals of blocks never stored here */
    uint64_t requests_hit;   /* matches where this source held at least the first block */
} baton_kvidx_source_stats_t;

/* block_size: the token count of a block (the engines' page size); every event must use it. */
baton_kvidx_t *baton_kvidx_create(uint32_t block_size);
void baton_kvidx_destroy(baton_kvidx_t *x);

/* Applies one decoded batch from source src. 0, or -1 when an event's block_size differs from
 * the index's (the batch is applied up to it). */
int baton_kvidx_apply(baton_kvidx_t *x, int src, const baton_kvev_batch_t *b);
/* Forgets everything source src holds (AllBlocksCleared, a new incarnation, a removed worker). */
void baton_kvidx_clear(baton_kvidx_t *x, int src);

/* For each source, how many leading whole blocks of ids[0..n) it holds in L1 and how many more
 * (after them, continuing the prefix) in L2: l1[s], l2[s] for s < n_sources. Returns the number
 * of blocks of the request (n / block_size). */
uint32_t baton_kvidx_match(baton_kvidx_t *x, const uint32_t *ids, uint32_t n, int n_sources,
                           uint32_t *l1, uint32_t *l2);

/* The same for a request already keyed: keys[0..nb) (baton_kvidx_chain), the sources a set of
 * bits (bit s: source s); l1[] and l2[] have BATON_KVIDX_MAX_SOURCES entries, those of sources
 * outside the set are 0. */
void baton_kvidx_match_keys(baton_kvidx_t *x, const uint64_t *keys, uint32_t nb, uint64_t sources,
                            uint32_t *l1, uint32_t *l2);
/* The keys of the whole blocks of ids[0..n) in blocks of block_size: keys[0..n / block_size),
 * returned. */
uint32_t baton_kvidx_chain(uint32_t block_size, const uint32_t *ids, uint32_t n, uint64_t *keys);
uint32_t baton_kvidx_block_size(const baton_kvidx_t *x);

void baton_kvidx_source_stats(baton_kvidx_t *x, int src, baton_kvidx_source_stats_t *out);
/* Distinct blocks indexed and the bytes the index holds. */
void baton_kvidx_size(baton_kvidx_t *x, uint64_t *blocks, size_t *bytes);

/* The index's key of a chain: exposed for tests and for callers that key requests themselves. */
uint64_t baton_kvidx_key(uint64_t parent_key, uint32_t block_size, const uint32_t *ids);
#define BATON_KVIDX_ROOT 0x6b76696478726f6full

#endif
