/* tier_key.c — SGLang's chained SHA-256 page keys and their object names (see tier_key.h). */
#include "worker/tier_key.h"

#include <stdio.h>
#include <string.h>

#include <mbedtls/sha256.h>

static int unhex(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : 0;
}

void wk_tier_key_next(const wk_tier_key_t *prev, const int64_t *ids, uint32_t page_tokens,
                      wk_tier_key_t *out)
{
    static const char digits[] = "0123456789abcdef";
    mbedtls_sha256_context c;
    uint8_t buf[256], md[32];
    mbedtls_sha256_init(&c);
    mbedtls_sha256_starts_ret(&c, 0);
    if (prev) {
        for (int i = 0; i < 32; i++)
            buf[i] = (uint8_t)(unhex(prev->hex[2 * i]) << 4 | unhex(prev->hex[2 * i + 1]));
        mbedtls_sha256_update_ret(&c, buf, 32);
    }
    /* u32 little-endian, 64 ids per update */
    size_t k = 0;
    for (uint32_t i = 0; i < page_tokens; i++) {
        uint32_t v = (uint32_t)ids[i];
        buf[k++] = (uint8_t)v;
        buf[k++] = (uint8_t)(v >> 8);
        buf[k++] = (uint8_t)(v >> 16);
        buf[k++] = (uint8_t)(v >> 24);
        if (k == sizeof(buf)) {
            mbedtls_sha256_update_ret(&c, buf, k);
            k = 0;
        }
    }
    if (k)
        mbedtls_sha256_update_ret(&c, buf, k);
    mbedtls_sha256_finish_ret(&c, md);
    mbedtls_sha256_free(&c);
    for (int i = 0; i < 32; i++) {
        out->hex[2 * i] = digits[md[i] >> 4];
        out->hex[2 * i + 1] = digits[md[i] & 15];
    }
    out->hex[WK_TIER_KEY_HEX] = '\0';
}

uint32_t wk_tier_keys(const int64_t *ids, uint32_t n, uint32_t page_tokens, uint32_t max_pages,
                      wk_tier_key_t *out)
{
    if (page_tokens == 0)
        return 0;
    uint32_t pages = n / page_tokens;
    if (pages > max_pages)
        pages = max_pages;
    for (uint32_t i = 0; i < pages; i++)
        wk_tier_key_next(i ? &out[i - 1] : NULL, ids + (size_t)i * page_tokens, page_tokens,
                         &out[i]);
    return pages;
}

int wk_tier_object_name(char *out, size_t cap, const char *model, const wk_tier_key_t *key,
                        unsigned tp_rank, char kind)
{
    size_t o = 0;
    if (model && *model) {
        for (const char *m = model; *m; m++) {
            if (o + 1 >= cap)
                return -1;
            out[o++] = *m == '/' ? '-' : *m;
        }
        if (o + 1 >= cap)
            return -1;
        out[o++] = '_';
    }
    int n = snprintf(out + o, cap - o, "%s_%u_%c", key->hex, tp_rank, kind);
    if (n < 0 || (size_t)n >= cap - o)
        return -1;
    return (int)(o + (size_t)n);
}
