/* kvshape.c — KV-cache shape presets and derived sizes (see kvshape.h). */
#include "worker/kvshape.h"

#include <string.h>

#include "baton/error.h"

typedef struct preset_s {
    const char *name;
    wk_kvshape_t shape;
} preset_t;

/*
 * tiny: small enough that tests move every byte in microseconds.
 * llama3-8b: Llama 3 8B (32 layers, 32 query heads sharing 8 KV heads, head size 128), bf16:
 *   128 KiB of KV per token.
 * large: a 64-layer GQA model of the Qwen2.5-32B class (8 KV heads, head size 128), bf16:
 *   256 KiB of KV per token.
 */
static const preset_t presets[] = {
    {"tiny", {4, 2, 16, 2, 16}},
    {"llama3-8b", {32, 8, 128, 2, 64}},
    {"large", {64, 8, 128, 2, 64}},
};

int wk_kvshape_preset(const char *name, wk_kvshape_t *out)
{
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
        if (strcmp(presets[i].name, name) == 0) {
            *out = presets[i].shape;
            return 0;
        }
    }
    return BATON_EINVAL;
}

const char *wk_kvshape_preset_names(void)
{
    return "tiny, llama3-8b, large";
}

int wk_kvshape_check(const wk_kvshape_t *s, const char **why_p)
{
    const char *why = NULL;
    if (s->layers < 1 || s->layers > WK_KV_MAX_LAYERS)
        why = "layers must be in [1, 1024]";
    else if (s->kv_heads < 1 || s->kv_heads > WK_KV_MAX_HEADS)
        why = "kv heads must be in [1, 1024]";
    else if (s->head_dim < 1 || s->head_dim > WK_KV_MAX_HEAD_DIM)
        why = "head dim must be in [1, 65536]";
    else if (s->dtype_bytes < 1 || s->dtype_bytes > WK_KV_MAX_DTYPE_BYTES)
        why = "dtype bytes must be in [1, 8]";
    else if (s->page_tokens < 1 || s->page_tokens > WK_KV_MAX_PAGE_TOKENS)
        why = "page tokens must be in [1, 65536]";
    else if (wk_kvshape_page_bytes(s) > WK_KV_MAX_PAGE_BYTES)
        why = "a page would exceed 64 MiB (fewer page tokens)";
    if (why_p)
        *why_p = why;
    return why ? BATON_EINVAL : 0;
}

uint64_t wk_kvshape_token_bytes(const wk_kvshape_t *s)
{
    return 2ull * s->kv_heads * s->head_dim * s->dtype_bytes;
}

uint64_t wk_kvshape_page_bytes(const wk_kvshape_t *s)
{
    return wk_kvshape_token_bytes(s) * s->page_tokens;
}

uint32_t wk_kvshape_pages(const wk_kvshape_t *s, uint32_t tokens)
{
    return (uint32_t)(((uint64_t)tokens + s->page_tokens - 1) / s->page_tokens);
}

uint32_t wk_kvshape_page_tokens_at(const wk_kvshape_t *s, uint32_t tokens, uint32_t page)
{
    uint64_t first = (uint64_t)page * s->page_tokens;
    if (first >= tokens)
        return 0;
    uint64_t left = tokens - first;
    return (uint32_t)(left < s->page_tokens ? left : s->page_tokens);
}

uint64_t wk_kvshape_auto_pool_tokens(const wk_kvshape_t *s)
{
    uint64_t per_token = wk_kvshape_token_bytes(s) * s->layers;
    uint64_t tokens = WK_KV_AUTO_POOL_TOKENS;
    if (per_token > 0 && tokens > WK_KV_AUTO_POOL_BYTES / per_token)
        tokens = WK_KV_AUTO_POOL_BYTES / per_token;
    tokens -= tokens % s->page_tokens;
    if (tokens < s->page_tokens)
        tokens = s->page_tokens;
    return tokens;
}
