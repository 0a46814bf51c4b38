/* kvevents/decode.c — the bounded decoder of KV-event batches: a msgpack reader of its own that
 * checks every length against the bytes left, every count against the limits and every nesting
 * against a depth, so hostile input is refused and never read past, looped on or over-allocated. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvevents/wire.h"

void baton_kvev_limits_default(baton_kvev_limits_t *lim)
{
    lim->max_payload = 16u << 20;
    lim->max_events = 65536;
    lim->max_hashes = 65536;
    lim->max_tokens = 1u << 20;
    lim->max_depth = 16;
    lim->max_block = 4096;
    lim->max_alloc = 64u << 20;
}

typedef enum { MP_NIL, MP_BOOL, MP_INT, MP_FLOAT, MP_STR, MP_BIN, MP_ARRAY, MP_MAP, MP_EXT } mp_kind_t;

typedef struct {
    mp_kind_t kind;
    int64_t i;        /* MP_INT (uint64 above INT64_MAX keeps its bits), MP_BOOL */
    int neg;          /* MP_INT: the value is negative */
    double f;         /* MP_FLOAT */
    const uint8_t *s; /* MP_STR, MP_BIN */
    uint32_t len;     /* MP_STR, MP_BIN: bytes; MP_ARRAY, MP_MAP: elements */
} mp_val_t;

typedef struct {
    const uint8_t *p, *end;
    const baton_kvev_limits_t *lim;
    size_t alloc; /* bytes charged against lim->max_alloc */
    const char *err;
} rd_t;

static int fail(rd_t *r, const char *why)
{
    if (!r->err)
        r->err = why;
    return -1;
}

static uint64_t be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int k = 0; k < n; k++)
        v = (v << 8) | p[k];
    return v;
}

/* Takes n bytes; -1 when fewer are left. */
static int take(rd_t *r, size_t n, const uint8_t **out)
{
    if ((size_t)(r->end - r->p) < n)
        return fail(r, "truncated");
    *out = r->p;
    r->p += n;
    return 0;
}

static int take_uint(rd_t *r, int n, uint64_t *v)
{
    const uint8_t *q;
    if (take(r, (size_t)n, &q) < 0)
        return -1;
    *v = be(q, n);
    return 0;
}

/* Reads one value's header; strings, binaries and extensions are consumed whole. A container's
 * count is checked against the bytes left (each element takes at least one byte). */
static int rd_head(rd_t *r, mp_val_t *v)
{
    const uint8_t *q;
    uint64_t u = 0;
    if (take(r, 1, &q) < 0)
        return -1;
    uint8_t c = *q;
    memset(v, 0, sizeof(*v));
    int lenbytes = 0;
    if (c <= 0x7f) {
        v->kind = MP_INT;
        v->i = c;
        return 0;
    }
    if (c >= 0xe0) {
        v->kind = MP_INT;
        v->i = (int8_t)c;
        v->neg = 1;
        return 0;
    }
    if ((c & 0xf0) == 0x80 || (c & 0xf0) == 0x90) {
        v->kind = (c & 0xf0) == 0x80 ? MP_MAP : MP_ARRAY;
        u = c & 0x0f;
        goto container;
    }
    if ((c & 0xe0) == 0xa0) {
        v->kind = MP_STR;
        u = c & 0x1f;
        goto bytes;
    }
    switch (c) {
    case 0xc0:
        v->kind = MP_NIL;
        return 0;
    case 0xc2:
    case 0xc3:
        v->kind = MP_BOOL;
        v->i = c == 0xc3;
        return 0;
    case 0xc4: case 0xc5: case 0xc6: /* bin 8/16/32 */
        v->kind = MP_BIN;
        lenbytes = 1 << (c - 0xc4);
        break;
    case 0xd9: case 0xda: case 0xdb: /* str 8/16/32 */
        v->kind = MP_STR;
        lenbytes = 1 << (c - 0xd9);
        break;
    case 0xc7: case 0xc8: case 0xc9: { /* ext 8/16/32: skipped whole */
        v->kind = MP_EXT;
        if (take_uint(r, 1 << (c - 0xc7), &u) < 0 || take(r, 1, &q) < 0 || take(r, u, &q) < 0)
            return -1;
        return 0;
    }
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: /* fixext 1..16 */
        v->kind = MP_EXT;
        return take(r, 1 + ((size_t)1 << (c - 0xd4)), &q);
    case 0xca: case 0xcb: {
        if (take_uint(r, c == 0xca ? 4 : 8, &u) < 0)
            return -1;
        v->kind = MP_FLOAT;
        if (c == 0xca) {
            uint32_t u32 = (uint32_t)u;
            float f;
            memcpy(&f, &u32, 4);
            v->f = f;
        } else {
            memcpy(&v->f, &u, 8);
        }
        return 0;
    }
    case 0xcc: case 0xcd: case 0xce: case 0xcf: /* uint 8..64 */
        if (take_uint(r, 1 << (c - 0xcc), &u) < 0)
            return -1;
        v->kind = MP_INT;
        v->i = (int64_t)u;
        return 0;
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: { /* int 8..64 */
        int n = 1 << (c - 0xd0);
        if (take_uint(r, n, &u) < 0)
            return -1;
        if (n < 8 && (u >> (8 * n - 1)))
            u |= ~0ull << (8 * n); /* sign-extend */
        v->kind = MP_INT;
        v->i = (int64_t)u;
        v->neg = v->i < 0;
        return 0;
    }
    case 0xdc: case 0xdd:
        v->kind = MP_ARRAY;
        if (take_uint(r, c == 0xdc ? 2 : 4, &u) < 0)
            return -1;
        goto container;
    case 0xde: case 0xdf:
        v->kind = MP_MAP;
        if (take_uint(r, c == 0xde ? 2 : 4, &u) < 0)
            return -1;
        goto container;
    default: /* 0xc1, never used */
        return fail(r, "invalid msgpack byte");
    }
    if (take_uint(r, lenbytes, &u) < 0)
        return -1;
bytes:
    if (take(r, u, &v->s) < 0)
        return -1;
    v->len = (uint32_t)u;
    return 0;
container:
    if (u > (uint64_t)(r->end - r->p) / (v->kind == MP_MAP ? 2 : 1))
        return fail(r, "container count beyond the payload");
    v->len = (uint32_t)u;
    return 0;
}

/* Skips the rest of a value whose header is v. */
static int skip_body(rd_t *r, const mp_val_t *v, uint32_t depth)
{
    if (v->kind != MP_ARRAY && v->kind != MP_MAP)
        return 0;
    if (depth >= r->lim->max_depth)
        return fail(r, "nesting too deep");
    uint64_t n = (uint64_t)v->len * (v->kind == MP_MAP ? 2 : 1);
    for (uint64_t k = 0; k < n; k++) {
        mp_val_t e;
        if (rd_head(r, &e) < 0 || skip_body(r, &e, depth + 1) < 0)
            return -1;
    }
    return 0;
}

static int skip_value(rd_t *r, uint32_t depth)
{
    mp_val_t v;
    return rd_head(r, &v) < 0 ? -1 : skip_body(r, &v, depth);
}

/* Allocates n elements of size sz, charged against the batch's budget. */
static void *rd_alloc(rd_t *r, size_t n, size_t sz)
{
    if (n == 0)
        return NULL;
    size_t bytes = n * sz; /* n <= payload bytes and sz small: no overflow */
    if (bytes > r->lim->max_alloc - r->alloc)
        return fail(r, "batch too large when decoded"), NULL;
    void *m = calloc(n, sz);
    if (!m)
        return fail(r, "out of memory"), NULL;
    r->alloc += bytes;
    return m;
}

static int rd_hash(rd_t *r, baton_kvev_hash_t *h)
{
    mp_val_t v;
    if (rd_head(r, &v) < 0)
        return -1;
    memset(h, 0, sizeof(*h));
    if (v.kind == MP_INT) {
        h->i = v.i;
        return 0;
    }
    if (v.kind == MP_BIN && v.len >= 1 && v.len <= BATON_KVEV_HASH_MAX) {
        h->len = (uint8_t)v.len;
        memcpy(h->b, v.s, v.len);
        return 0;
    }
    return fail(r, "block hash neither an integer nor a digest of 1..32 bytes");
}

static int rd_hashes(rd_t *r, baton_kvev_event_t *e)
{
    mp_val_t v;
    if (rd_head(r, &v) < 0)
        return -1;
    if (v.kind != MP_ARRAY)
        return fail(r, "block_hashes not an array");
    if (v.len > r->lim->max_hashes)
        return fail(r, "too many block hashes in one event");
    if (e->hashes)
        return fail(r, "duplicate block_hashes");
    e->hashes = rd_alloc(r, v.len, sizeof(*e->hashes));
    if (v.len && !e->hashes)
        return -1;
    e->n_hashes = v.len;
    for (uint32_t k = 0; k < v.len; k++)
        if (rd_hash(r, &e->hashes[k]) < 0)
            return -1;
    return 0;
}

static int rd_tokens(rd_t *r, baton_kvev_event_t *e)
{
    mp_val_t v;
    if (rd_head(r, &v) < 0)
        return -1;
    if (v.kind != MP_ARRAY)
        return fail(r, "token_ids not an array");
    if (v.len > r->lim->max_tokens)
        return fail(r, "too many token ids in one event");
    if (e->token_ids)
        return fail(r, "duplicate token_ids");
    e->token_ids = rd_alloc(r, v.len, sizeof(*e->token_ids));
    if (v.len && !e->token_ids)
        return -1;
    e->n_tokens = v.len;
    for (uint32_t k = 0; k < v.len; k++) {
        mp_val_t t;
        if (rd_head(r, &t) < 0)
            return -1;
        if (t.kind != MP_INT || t.neg || (uint64_t)t.i > UINT32_MAX)
            return fail(r, "token id not an integer in 0..2^32-1");
        e->token_ids[k] = (uint32_t)t.i;
    }
    return 0;
}

static int rd_parent(rd_t *r, baton_kvev_event_t *e)
{
    const uint8_t *save = r->p;
    mp_val_t v;
    if (rd_head(r, &v) < 0)
        return -1;
    if (v.kind == MP_NIL) {
        e->has_parent = 0;
        return 0;
    }
    r->p = save;
    e->has_parent = 1;
    return rd_hash(r, &e->parent);
}

static int rd_block_size(rd_t *r, baton_kvev_event_t *e)
{
    mp_val_t v;
    if (rd_head(r, &v) < 0)
        return -1;
    if (v.kind != MP_INT || v.neg || v.i < 1 || v.i > r->lim->max_block)
        return fail(r, "block_size out of range");
    e->block_size = (uint32_t)v.i;
    return 0;
}

static int rd_lora(rd_t *r, baton_kvev_event_t *e)
{
    mp_val_t v;
    if (rd_head(r, &v) < 0)
        return -1;
    if (v.kind == MP_NIL)
        return 0;
    if (v.kind != MP_INT)
        return fail(r, "lora_id neither nil nor an integer");
    e->has_lora = 1;
    e->lora_id = v.i;
    return 0;
}

static int rd_medium(rd_t *r, baton_kvev_event_t *e)
{
    mp_val_t v;
    if (rd_head(r, &v) < 0)
        return -1;
    if (v.kind == MP_NIL)
        return 0;
    if (v.kind != MP_STR || v.len > BATON_KVEV_MEDIUM_MAX || memchr(v.s, 0, v.len))
        return fail(r, "medium neither nil nor a short string");
    memcpy(e->medium, v.s, v.len);
    e->medium[v.len] = '\0';
    return 0;
}

static int str_is(const mp_val_t *v, const char *s)
{
    return v->kind == MP_STR && v->len == strlen(s) && memcmp(v->s, s, v->len) == 0;
}

/* 0 for an unknown tag (the event is skipped). */
static int tag_of(const mp_val_t *v)
{
    if (str_is(v, "BlockStored"))
        return BATON_KVEV_STORED;
    if (str_is(v, "BlockRemoved"))
        return BATON_KVEV_REMOVED;
    if (str_is(v, "AllBlocksCleared"))
        return BATON_KVEV_CLEARED;
    return 0;
}

/* The fields each type requires are there and agree with each other. */
static int check_event(rd_t *r, baton_kvev_event_t *e, unsigned seen)
{
    enum { F_HASHES = 1, F_PARENT = 2, F_TOKENS = 4, F_BSIZE = 8 };
    if (e->type == BATON_KVEV_STORED) {
        if ((seen & (F_HASHES | F_PARENT | F_TOKENS | F_BSIZE)) != (F_HASHES | F_PARENT | F_TOKENS | F_BSIZE))
            return fail(r, "BlockStored without block_hashes, parent_block_hash, token_ids or block_size");
        if ((uint64_t)e->n_hashes * e->block_size != e->n_tokens)
            return fail(r, "BlockStored token_ids not block_size per block hash");
    } else if (e->type == BATON_KVEV_REMOVED && !(seen & F_HASHES)) {
        return fail(r, "BlockRemoved without block_hashes");
    }
    return 0;
}

/* Field k (by position or by name) of an event of type t; unknown ones are skipped. */
static int rd_field(rd_t *r, baton_kvev_event_t *e, int t, const char *name, unsigned *seen)
{
    if (strcmp(name, "block_hashes") == 0 && t != BATON_KVEV_CLEARED) {
        *seen |= 1;
        return rd_hashes(r, e);
    }
    if (t == BATON_KVEV_STORED) {
        if (strcmp(name, "parent_block_hash") == 0)
            return *seen |= 2, rd_parent(r, e);
        if (strcmp(name, "token_ids") == 0)
            return *seen |= 4, rd_tokens(r, e);
        if (strcmp(name, "block_size") == 0)
            return *seen |= 8, rd_block_size(r, e);
        if (strcmp(name, "lora_id") == 0)
            return rd_lora(r, e);
    }
    if (strcmp(name, "medium") == 0 && t != BATON_KVEV_CLEARED)
        return rd_medium(r, e);
    return skip_value(r, 2);
}

static const char *const STORED_POS[] = {"block_hashes", "parent_block_hash", "token_ids",
                                         "block_size", "lora_id", "medium"};
static const char *const REMOVED_POS[] = {"block_hashes", "medium"};

/* One event; *keep 0 when its type is unknown (consumed, not stored). */
static int rd_event(rd_t *r, baton_kvev_event_t *e, int *keep)
{
    mp_val_t v;
    unsigned seen = 0;
    if (rd_head(r, &v) < 0)
        return -1;
    if (v.kind == MP_ARRAY) {
        mp_val_t tag;
        if (v.len < 1 || rd_head(r, &tag) < 0 || tag.kind != MP_STR)
            return fail(r, "array event without its tag first");
        int t = tag_of(&tag);
        e->type = (baton_kvev_type_t)t;
        const char *const *pos = t == BATON_KVEV_STORED ? STORED_POS : REMOVED_POS;
        uint32_t npos = t == BATON_KVEV_STORED ? 6 : t == BATON_KVEV_REMOVED ? 2 : 0;
        for (uint32_t k = 1; k < v.len; k++) {
            int rc = k - 1 < npos ? rd_field(r, e, t, pos[k - 1], &seen) : skip_value(r, 1);
            if (rc < 0)
                return -1;
        }
        *keep = t != 0;
        return t ? check_event(r, e, seen) : 0;
    }
    if (v.kind != MP_MAP)
        return fail(r, "event neither a map nor an array");
    /* The "type" key comes first from msgspec; a map that names it later is read in two passes. */
    const uint8_t *start = r->p;
    int t = -1;
    for (uint32_t k = 0; k < v.len && t < 0; k++) {
        mp_val_t key;
        if (rd_head(r, &key) < 0)
            return -1;
        if (str_is(&key, "type")) {
            mp_val_t tag;
            if (rd_head(r, &tag) < 0 || tag.kind != MP_STR)
                return fail(r, "event type not a string");
            t = tag_of(&tag);
        } else if (skip_body(r, &key, 1) < 0 || skip_value(r, 1) < 0) {
            return -1;
        }
    }
    if (t < 0)
        return fail(r, "map event without a type");
    r->p = start;
    e->type = (baton_kvev_type_t)t;
    for (uint32_t k = 0; k < v.len; k++) {
        mp_val_t key;
        char name[32];
        if (rd_head(r, &key) < 0)
            return -1;
        if (key.kind != MP_STR || key.len >= sizeof(name)) {
            if (skip_body(r, &key, 1) < 0 || skip_value(r, 1) < 0)
                return -1;
            continue;
        }
        memcpy(name, key.s, key.len);
        name[key.len] = '\0';
        if (memchr(key.s, 0, key.len))
            name[0] = '\0';
        if (t == 0 || strcmp(name, "type") == 0) {
            if (skip_value(r, 1) < 0)
                return -1;
        } else if (rd_field(r, e, t, name, &seen) < 0) {
            return -1;
        }
    }
    *keep = t != 0;
    return t ? check_event(r, e, seen) : 0;
}

static void event_free(baton_kvev_event_t *e)
{
    free(e->hashes);
    free(e->token_ids);
    memset(e, 0, sizeof(*e));
}

void baton_kvev_batch_free(baton_kvev_batch_t *b)
{
    for (uint32_t k = 0; k < b->n_events; k++)
        event_free(&b->events[k]);
    free(b->events);
    memset(b, 0, sizeof(*b));
    b->dp_rank = -1;
}

static int rd_events(rd_t *r, baton_kvev_batch_t *b)
{
    mp_val_t v;
    if (rd_head(r, &v) < 0)
        return -1;
    if (v.kind != MP_ARRAY)
        return fail(r, "events not an array");
    if (v.len > r->lim->max_events)
        return fail(r, "too many events in one batch");
    if (b->events)
        return fail(r, "duplicate events");
    b->events = rd_alloc(r, v.len, sizeof(*b->events));
    if (v.len && !b->events)
        return -1;
    for (uint32_t k = 0; k < v.len; k++) {
        int keep = 0;
        baton_kvev_event_t *e = &b->events[b->n_events];
        int rc = rd_event(r, e, &keep);
        if (rc < 0 || !keep) {
            event_free(e);
            if (rc < 0)
                return -1;
            b->n_skipped++;
            continue;
        }
        b->n_events++;
    }
    return 0;
}

static int rd_ts(rd_t *r, baton_kvev_batch_t *b)
{
    mp_val_t v;
    if (rd_head(r, &v) < 0)
        return -1;
    if (v.kind == MP_FLOAT)
        b->ts = v.f;
    else if (v.kind == MP_INT)
        b->ts = (double)v.i;
    else
        return fail(r, "ts not a number");
    return 0;
}

static int rd_dp_rank(rd_t *r, baton_kvev_batch_t *b)
{
    mp_val_t v;
    if (rd_head(r, &v) < 0)
        return -1;
    if (v.kind == MP_NIL)
        return 0;
    /* v.i < 0 without neg: a uint 64 above INT64_MAX, no rank either. */
    if (v.kind != MP_INT || v.neg || v.i < 0 || v.i > INT32_MAX)
        return fail(r, "data_parallel_rank neither nil nor a rank");
    b->dp_rank = (int32_t)v.i;
    return 0;
}

static int rd_batch(rd_t *r, baton_kvev_batch_t *b)
{
    mp_val_t v;
    if (rd_head(r, &v) < 0)
        return -1;
    if (v.kind == MP_ARRAY) {
        if (v.len < 2)
            return fail(r, "batch array shorter than [ts, events]");
        if (rd_ts(r, b) < 0 || rd_events(r, b) < 0)
            return -1;
        if (v.len >= 3 && rd_dp_rank(r, b) < 0)
            return -1;
        for (uint32_t k = 3; k < v.len; k++)
            if (skip_value(r, 1) < 0)
                return -1;
    } else if (v.kind == MP_MAP) {
        int have_events = 0;
        for (uint32_t k = 0; k < v.len; k++) {
            mp_val_t key;
            if (rd_head(r, &key) < 0)
                return -1;
            int rc;
            if (str_is(&key, "ts"))
                rc = rd_ts(r, b);
            else if (str_is(&key, "events"))
                rc = (have_events = 1, rd_events(r, b));
            else if (str_is(&key, "data_parallel_rank"))
                rc = rd_dp_rank(r, b);
            else
                rc = skip_body(r, &key, 1) < 0 ? -1 : skip_value(r, 1);
            if (rc < 0)
                return -1;
        }
        if (!have_events)
            return fail(r, "batch map without events");
    } else {
        return fail(r, "batch neither an array nor a map");
    }
    if (r->p != r->end)
        return fail(r, "bytes after the batch");
    return 0;
}

int baton_kvev_decode(const uint8_t *p, size_t n, const baton_kvev_limits_t *lim,
                      baton_kvev_batch_t *out, char *err, size_t errlen)
{
    baton_kvev_limits_t def;
    if (!lim) {
        baton_kvev_limits_default(&def);
        lim = &def;
    }
    memset(out, 0, sizeof(*out));
    out->dp_rank = -1;
    rd_t r = {.p = p, .end = p + n, .lim = lim};
    int rc = n > lim->max_payload ? fail(&r, "batch larger than the payload limit") : rd_batch(&r, out);
    if (rc < 0) {
        baton_kvev_batch_free(out);
        if (err && errlen)
            snprintf(err, errlen, "%s", r.err ? r.err : "malformed batch");
        return -1;
    }
    return 0;
}
