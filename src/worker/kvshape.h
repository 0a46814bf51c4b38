/* kvshape.h — the simulated model's KV-cache shape: layers, KV heads, head size, dtype, page
 * size, the named presets, and the sizes derived from them. */
#ifndef BATON_WORKER_KVSHAPE_H
#define BATON_WORKER_KVSHAPE_H

#include <stdint.h>

/*
 * A page holds `page_tokens` consecutive prompt tokens of ONE layer; every token of a layer takes
 *     token_bytes = 2 (K and V) x kv_heads x head_dim x dtype_bytes
 * bytes, tokens one after the other inside the page. A prompt of T tokens needs
 * ceil(T / page_tokens) pages per layer; the last page of a layer holds the remainder and is
 * shorter (only its used bytes travel).
 */
typedef struct wk_kvshape_s {
    uint32_t layers;
    uint32_t kv_heads;
    uint32_t head_dim;
    uint32_t dtype_bytes;
    uint32_t page_tokens;
} wk_kvshape_t;

/* Bounds accepted by wk_kvshape_check (the command line enforces them). */
#define WK_KV_MAX_LAYERS      1024
#define WK_KV_MAX_HEADS       1024
#define WK_KV_MAX_HEAD_DIM    65536
#define WK_KV_MAX_DTYPE_BYTES 8
#define WK_KV_MAX_PAGE_TOKENS 65536
#define WK_KV_MAX_PAGE_BYTES  (64ull << 20) /* one page at most */

/* Pool size when --kv-pool-tokens is 0 (auto): this many tokens, fewer when the pool would
 * exceed WK_KV_AUTO_POOL_BYTES. */
#define WK_KV_AUTO_POOL_TOKENS 65536ull
#define WK_KV_AUTO_POOL_BYTES  (1ull << 30)

/* The default preset ("tiny"). */
#define WK_KV_DEFAULT_PRESET "tiny"

/* Fills *out with a named preset: "tiny", "llama3-8b", "large". 0 or BATON_EINVAL. */
int wk_kvshape_preset(const char *name, wk_kvshape_t *out);
/* "tiny, llama3-8b, large" (for usage texts). */
const char *wk_kvshape_preset_names(void);

/* 0 when every field is inside its bounds and a page fits WK_KV_MAX_PAGE_BYTES; else
 * BATON_EINVAL with a static reason in *why_p (may be NULL). */
int wk_kvshape_check(const wk_kvshape_t *s, const char **why_p);

/* Bytes of one token in one layer (K and V). */
uint64_t wk_kvshape_token_bytes(const wk_kvshape_t *s);
/* Bytes of one full page. */
uint64_t wk_kvshape_page_bytes(const wk_kvshape_t *s);
/* Pages per layer for a prompt of `tokens` tokens (tokens >= 1). */
uint32_t wk_kvshape_pages(const wk_kvshape_t *s, uint32_t tokens);
/* Tokens in page `page` of a prompt of `tokens` tokens (0 past the end). */
uint32_t wk_kvshape_page_tokens_at(const wk_kvshape_t *s, uint32_t tokens, uint32_t page);
/* Pool size in tokens for --kv-pool-tokens 0: WK_KV_AUTO_POOL_TOKENS capped so that the pool
 * (every layer) stays within WK_KV_AUTO_POOL_BYTES; a whole number of pages, at least one. */
uint64_t wk_kvshape_auto_pool_tokens(const wk_kvshape_t *s);

#endif
