/* tier_key.h — HiCache page keys as SGLang names them: chained SHA-256 over each page's token
 * ids, and the Mooncake-style object names (model, hash, tensor-parallel rank, K or V). */
#ifndef BATON_WORKER_TIER_KEY_H
#define BATON_WORKER_TIER_KEY_H

#include <stddef.h>
#include <stdint.h>

/*
 * Page i's key (docs/WORKER.md "Page keys", SGLang's get_hash_str):
 *
 *   key(0) = hex(SHA-256(ids[0..P) as u32 little-endian))
 *   key(i) = hex(SHA-256(bytes(key(i-1)) || ids[i*P..(i+1)*P) as u32 little-endian))
 *
 * where bytes(k) is the 32 raw bytes of the previous key (its hex decoded) and P the page size
 * in tokens. Only whole pages have keys. The object names in the store (SGLang's Mooncake
 * backend, MHA layout) are "<model>_<key>_<tp_rank>_k" and "..._v", <model> being the model name
 * with every '/' replaced by '-' (left out with the '_' after it when there is no model name).
 */

#define WK_TIER_KEY_HEX 64 /* hex digits of a page key */

typedef struct {
    char hex[WK_TIER_KEY_HEX + 1];
} wk_tier_key_t;

/* Keys of the first min(n / page_tokens, max_pages) whole pages of ids[0..n) into out. Token ids
 * are taken modulo 2^32 (a vocabulary's ids are far below). Returns how many were written. */
uint32_t wk_tier_keys(const int64_t *ids, uint32_t n, uint32_t page_tokens, uint32_t max_pages,
                      wk_tier_key_t *out);

/* The key of one page after `prev` (NULL: the first page). */
void wk_tier_key_next(const wk_tier_key_t *prev, const int64_t *ids, uint32_t page_tokens,
                      wk_tier_key_t *out);

/* The object name of a page's K ('k') or V ('v') half into out[0..cap). Returns its length, or
 * -1 when it does not fit (the store's keys are at most 255 bytes: check at start-up). */
int wk_tier_object_name(char *out, size_t cap, const char *model, const wk_tier_key_t *key,
                        unsigned tp_rank, char kind);

#endif
