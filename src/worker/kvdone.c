/* kvdone.c — encodes and decodes the payload of a room's DONE (see kvdone.h). */
#include "worker/kvdone.h"

#include <endian.h>
#include <string.h>

static void put32(uint8_t *p, uint32_t v)
{
    v = htole32(v);
    memcpy(p, &v, 4);
}

static void put64(uint8_t *p, uint64_t v)
{
    v = htole64(v);
    memcpy(p, &v, 8);
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return le32toh(v);
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return le64toh(v);
}

void wk_kvdone_encode(const wk_kvdone_t *d, uint8_t out[WK_KVDONE_LEN])
{
    memset(out, 0, WK_KVDONE_LEN);
    put32(out + 0, WK_KVDONE_MAGIC);
    put32(out + 4, WK_KVDONE_VERSION);
    put32(out + 8, d->n_tokens);
    put32(out + 12, d->layers);
    put64(out + 16, d->token_bytes);
    put32(out + 24, d->page_tokens);
    put64(out + 32, d->seed);
    put32(out + 40, d->hit_l1);
    put32(out + 44, d->hit_l2);
    put32(out + 48, d->hit_l3);
}

int wk_kvdone_decode(const uint8_t *payload, size_t len, wk_kvdone_t *d)
{
    if (payload == NULL || len < WK_KVDONE_LEN_MIN || get32(payload) != WK_KVDONE_MAGIC ||
        get32(payload + 4) != WK_KVDONE_VERSION)
        return -1;
    d->n_tokens = get32(payload + 8);
    d->layers = get32(payload + 12);
    d->token_bytes = get64(payload + 16);
    d->page_tokens = get32(payload + 24);
    d->seed = get64(payload + 32);
    d->has_hits = len >= WK_KVDONE_LEN;
    d->hit_l1 = d->has_hits ? get32(payload + 40) : 0;
    d->hit_l2 = d->has_hits ? get32(payload + 44) : 0;
    d->hit_l3 = d->has_hits ? get32(payload + 48) : 0;
    return 0;
}
