/* test_kvevents.c — src/kvevents: batches encoded in both event encodings decode to what was
 * encoded (integer and digest hashes, DP rank, nil parent); hand-made msgpack in the other forms
 * the field sends (map batch, "type" not first, older short arrays, unknown events skipped);
 * hostile payloads refused (every truncation, every byte flipped, huge counts, deep nesting,
 * inconsistent fields); sequence and replay framing in both reply forms. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvevents/index.h"
#include "kvevents/wire.h"

static baton_kvev_hash_t H_INT(int64_t v)
{
    baton_kvev_hash_t h = {.i = v};
    return h;
}

static baton_kvev_hash_t H_DIG(uint8_t seed)
{
    baton_kvev_hash_t h = {.len = 32};
    for (int k = 0; k < 32; k++)
        h.b[k] = (uint8_t)(seed + k * 7);
    return h;
}

/* A batch of three events: stored (two blocks of 4), removed, cleared. */
typedef struct {
    baton_kvev_hash_t stored[2], removed[1];
    uint32_t tokens[8];
    baton_kvev_event_t ev[3];
    baton_kvev_batch_t b;
} sample_t;

static void sample(sample_t *s, int digests, int32_t dp)
{
    memset(s, 0, sizeof(*s));
    s->stored[0] = digests ? H_DIG(1) : H_INT(-5);
    s->stored[1] = digests ? H_DIG(2) : H_INT((int64_t)0x8000000000000001ull);
    s->removed[0] = digests ? H_DIG(3) : H_INT(77);
    for (int k = 0; k < 8; k++)
        s->tokens[k] = (uint32_t)(k * 1000 + 3);
    s->tokens[7] = UINT32_MAX;
    s->ev[0] = (baton_kvev_event_t){.type = BATON_KVEV_STORED, .hashes = s->stored, .n_hashes = 2,
                                    .has_parent = 1, .parent = digests ? H_DIG(9) : H_INT(9),
                                    .token_ids = s->tokens, .n_tokens = 8, .block_size = 4,
                                    .has_lora = 1, .lora_id = 3};
    strcpy(s->ev[0].medium, "GPU");
    s->ev[1] = (baton_kvev_event_t){.type = BATON_KVEV_REMOVED, .hashes = s->removed, .n_hashes = 1};
    strcpy(s->ev[1].medium, "CPU");
    s->ev[2] = (baton_kvev_event_t){.type = BATON_KVEV_CLEARED};
    s->b = (baton_kvev_batch_t){.ts = 1234.5, .dp_rank = dp, .events = s->ev, .n_events = 3};
}

static void hash_eq(const baton_kvev_hash_t *a, const baton_kvev_hash_t *b)
{
    assert_int_equal(a->len, b->len);
    if (a->len)
        assert_memory_equal(a->b, b->b, a->len);
    else
        assert_true(a->i == b->i);
}

static void batch_eq(const baton_kvev_batch_t *a, const baton_kvev_batch_t *b)
{
    assert_true(a->ts == b->ts);
    assert_int_equal(a->dp_rank, b->dp_rank);
    assert_int_equal(a->n_events, b->n_events);
    for (uint32_t k = 0; k < a->n_events; k++) {
        const baton_kvev_event_t *x = &a->events[k], *y = &b->events[k];
        assert_int_equal(x->type, y->type);
        assert_int_equal(x->n_hashes, y->n_hashes);
        for (uint32_t j = 0; j < x->n_hashes; j++)
            hash_eq(&x->hashes[j], &y->hashes[j]);
        assert_string_equal(x->medium, y->medium);
        if (x->type != BATON_KVEV_STORED)
            continue;
        assert_int_equal(x->has_parent, y->has_parent);
        if (x->has_parent)
            hash_eq(&x->parent, &y->parent);
        assert_int_equal(x->n_tokens, y->n_tokens);
        assert_memory_equal(x->token_ids, y->token_ids, x->n_tokens * 4);
        assert_int_equal(x->block_size, y->block_size);
        assert_int_equal(x->has_lora, y->has_lora);
        assert_true(x->lora_id == y->lora_id);
    }
}

static baton_buf_t encoded(const baton_kvev_batch_t *b, baton_kvev_encoding_t enc)
{
    baton_buf_t out = BATON_BUF_INIT;
    assert_int_equal(baton_kvev_encode(b, enc, &out), 0);
    return out;
}

static void test_round_trip(void **state)
{
    (void)state;
    for (int enc = 0; enc < 2; enc++)
        for (int dig = 0; dig < 2; dig++)
            for (int dp = -1; dp < 2; dp += 2) {
                sample_t s;
                sample(&s, dig, dp);
                baton_buf_t e = encoded(&s.b, (baton_kvev_encoding_t)enc);
                baton_kvev_batch_t d;
                char err[128];
                assert_int_equal(baton_kvev_decode((uint8_t *)e.data, e.len, NULL, &d, err, sizeof(err)), 0);
                batch_eq(&s.b, &d);
                baton_kvev_batch_free(&d);
                baton_buf_free(&e);
            }
}

/* msgpack written by hand: the forms a real publisher sends that baton's encoder does not. */
typedef struct {
    uint8_t b[512];
    size_t n;
} mp_t;

static void put(mp_t *m, const void *p, size_t n)
{
    assert_true(m->n + n <= sizeof(m->b));
    memcpy(m->b + m->n, p, n);
    m->n += n;
}
static void u8(mp_t *m, uint8_t c) { put(m, &c, 1); }
static void str(mp_t *m, const char *s)
{
    size_t n = strlen(s);
    assert_true(n < 32);
    u8(m, (uint8_t)(0xa0 | n));
    put(m, s, n);
}

static int dec(const mp_t *m, baton_kvev_batch_t *d, char *err)
{
    return baton_kvev_decode(m->b, m->n, NULL, d, err, 128);
}

/* {"events": [{"block_hashes": [7], "medium": nil, "type": "BlockRemoved"},
 *             {"type": "Heartbeat", "x": [1]}], "ts": 1, "data_parallel_rank": 2}:
 * the map batch, "type" named last, an unknown event skipped. */
static void test_map_batch_type_last(void **state)
{
    (void)state;
    mp_t m = {0};
    u8(&m, 0x83);
    str(&m, "events");
    u8(&m, 0x92);
    u8(&m, 0x83);
    str(&m, "block_hashes");
    u8(&m, 0x91);
    u8(&m, 7);
    str(&m, "medium");
    u8(&m, 0xc0);
    str(&m, "type");
    str(&m, "BlockRemoved");
    u8(&m, 0x82);
    str(&m, "type");
    str(&m, "Heartbeat");
    str(&m, "x");
    u8(&m, 0x91);
    u8(&m, 1);
    str(&m, "ts");
    u8(&m, 1);
    str(&m, "data_parallel_rank");
    u8(&m, 2);
    baton_kvev_batch_t d;
    char err[128];
    assert_int_equal(dec(&m, &d, err), 0);
    assert_int_equal(d.n_events, 1);
    assert_int_equal(d.n_skipped, 1);
    assert_int_equal(d.dp_rank, 2);
    assert_int_equal(d.events[0].type, BATON_KVEV_REMOVED);
    assert_true(d.events[0].hashes[0].i == 7);
    assert_string_equal(d.events[0].medium, "");
    baton_kvev_batch_free(&d);
}

/* [ts, [["BlockStored", [1], nil, [5, 6], 2, nil]]]: the oldest form (no medium, no DP rank). */
static void test_old_short_arrays(void **state)
{
    (void)state;
    mp_t m = {0};
    u8(&m, 0x92);
    u8(&m, 0xcb);
    put(&m, "\x3f\xf0\0\0\0\0\0\0", 8); /* 1.0 */
    u8(&m, 0x91);
    u8(&m, 0x96);
    str(&m, "BlockStored");
    u8(&m, 0x91);
    u8(&m, 1);
    u8(&m, 0xc0);
    u8(&m, 0x92);
    u8(&m, 5);
    u8(&m, 6);
    u8(&m, 2);
    u8(&m, 0xc0);
    baton_kvev_batch_t d;
    char err[128];
    assert_int_equal(dec(&m, &d, err), 0);
    assert_true(d.ts == 1.0);
    assert_int_equal(d.dp_rank, -1);
    assert_int_equal(d.n_events, 1);
    assert_int_equal(d.events[0].has_parent, 0);
    assert_int_equal(d.events[0].n_tokens, 2);
    baton_kvev_batch_free(&d);
}

static void expect_refused(const mp_t *m, const char *why)
{
    baton_kvev_batch_t d;
    char err[128] = "";
    assert_int_equal(dec(m, &d, err), -1);
    if (!strstr(err, why))
        fail_msg("refused for \"%s\", expected \"%s\"", err, why);
    assert_int_equal(d.n_events, 0);
    assert_null(d.events);
}

static void test_hostile(void **state)
{
    (void)state;
    mp_t m = {0};
    /* An array claiming 4 G elements in a 6-byte payload. */
    u8(&m, 0xdd);
    put(&m, "\xff\xff\xff\xff", 4);
    u8(&m, 1);
    expect_refused(&m, "container count beyond the payload");
    /* [1, [], nil, [[[[...]]]]] nested past the depth in a field skipped. */
    m.n = 0;
    u8(&m, 0x94);
    u8(&m, 1);
    u8(&m, 0x90);
    u8(&m, 0xc0);
    for (int k = 0; k < 40; k++)
        u8(&m, 0x91);
    u8(&m, 0xc0);
    expect_refused(&m, "nesting too deep");
    /* A stored event whose tokens are not block_size per hash. */
    m.n = 0;
    u8(&m, 0x92);
    u8(&m, 1);
    u8(&m, 0x91);
    u8(&m, 0x95);
    str(&m, "BlockStored");
    u8(&m, 0x91);
    u8(&m, 1);
    u8(&m, 0xc0);
    u8(&m, 0x91);
    u8(&m, 5);
    u8(&m, 2);
    expect_refused(&m, "token_ids not block_size per block hash");
    /* A hash of 33 bytes; a string as a hash. */
    m.n = 0;
    u8(&m, 0x92);
    u8(&m, 1);
    u8(&m, 0x91);
    u8(&m, 0x92);
    str(&m, "BlockRemoved");
    u8(&m, 0x91);
    u8(&m, 0xc4);
    u8(&m, 33);
    for (int k = 0; k < 33; k++)
        u8(&m, 0);
    expect_refused(&m, "block hash");
    m.n -= 35;
    str(&m, "abc");
    expect_refused(&m, "block hash");
    /* Trailing bytes; the reserved byte 0xc1; a batch of one element. */
    m.n = 0;
    u8(&m, 0x92);
    u8(&m, 1);
    u8(&m, 0x90);
    u8(&m, 0);
    expect_refused(&m, "bytes after the batch");
    m.n = 0;
    u8(&m, 0xc1);
    expect_refused(&m, "invalid msgpack byte");
    m.n = 0;
    u8(&m, 0x91);
    u8(&m, 1);
    expect_refused(&m, "shorter than");
    /* A DP rank of 2^64 - 2 (uint 64: no rank, however its bits read as int64). */
    m.n = 0;
    u8(&m, 0x93);
    u8(&m, 1);
    u8(&m, 0x90);
    u8(&m, 0xcf);
    put(&m, "\xff\xff\xff\xff\xff\xff\xff\xfe", 8);
    expect_refused(&m, "data_parallel_rank");
    /* A negative token id. */
    m.n = 0;
    u8(&m, 0x92);
    u8(&m, 1);
    u8(&m, 0x91);
    u8(&m, 0x95);
    str(&m, "BlockStored");
    u8(&m, 0x91);
    u8(&m, 1);
    u8(&m, 0xc0);
    u8(&m, 0x91);
    u8(&m, 0xff);
    u8(&m, 1);
    expect_refused(&m, "token id");
}

/* Limits: events, hashes, tokens, decoded bytes, payload. */
static void test_limits(void **state)
{
    (void)state;
    sample_t s;
    sample(&s, 1, 0);
    baton_buf_t e = encoded(&s.b, BATON_KVEV_ENC_MAP);
    baton_kvev_limits_t lim;
    baton_kvev_batch_t d;
    char err[128];
    baton_kvev_limits_default(&lim);
    lim.max_events = 2;
    assert_int_equal(baton_kvev_decode((uint8_t *)e.data, e.len, &lim, &d, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "too many events"));
    baton_kvev_limits_default(&lim);
    lim.max_hashes = 1;
    assert_int_equal(baton_kvev_decode((uint8_t *)e.data, e.len, &lim, &d, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "too many block hashes"));
    baton_kvev_limits_default(&lim);
    lim.max_tokens = 7;
    assert_int_equal(baton_kvev_decode((uint8_t *)e.data, e.len, &lim, &d, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "too many token ids"));
    baton_kvev_limits_default(&lim);
    lim.max_alloc = 100;
    assert_int_equal(baton_kvev_decode((uint8_t *)e.data, e.len, &lim, &d, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "too large when decoded"));
    baton_kvev_limits_default(&lim);
    lim.max_payload = e.len - 1;
    assert_int_equal(baton_kvev_decode((uint8_t *)e.data, e.len, &lim, &d, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "payload limit"));
    baton_buf_free(&e);
}

/* Every prefix of a valid batch is refused; every single byte changed either decodes or is
 * refused (the sanitizer build sees any read out of bounds or leak). */
static void test_truncations_and_flips(void **state)
{
    (void)state;
    for (int enc = 0; enc < 2; enc++) {
        sample_t s;
        sample(&s, enc, 1);
        baton_buf_t e = encoded(&s.b, (baton_kvev_encoding_t)enc);
        uint8_t *copy = malloc(e.len);
        baton_kvev_batch_t d;
        char err[128];
        for (size_t n = 0; n < e.len; n++) {
            memcpy(copy, e.data, n);
            assert_int_equal(baton_kvev_decode(copy, n, NULL, &d, err, sizeof(err)), -1);
        }
        static const uint8_t vals[] = {0x00, 0x7f, 0x80, 0x9f, 0xc0, 0xc1, 0xc4, 0xcf, 0xd3,
                                       0xdc, 0xdd, 0xde, 0xdf, 0xff};
        for (size_t i = 0; i < e.len; i++)
            for (size_t v = 0; v < sizeof(vals); v++) {
                memcpy(copy, e.data, e.len);
                copy[i] = vals[v];
                if (baton_kvev_decode(copy, e.len, NULL, &d, err, sizeof(err)) == 0)
                    baton_kvev_batch_free(&d);
            }
        free(copy);
        baton_buf_free(&e);
    }
}

static void test_framing(void **state)
{
    (void)state;
    uint8_t s8[8], m1[8];
    int64_t seq;
    baton_kvev_seq_put(s8, 0x0102030405060708ll);
    assert_memory_equal(s8, "\x01\x02\x03\x04\x05\x06\x07\x08", 8);
    assert_int_equal(baton_kvev_seq_get(s8, 8, &seq), 0);
    assert_true(seq == 0x0102030405060708ll);
    assert_int_equal(baton_kvev_seq_get(s8, 7, &seq), -1);
    baton_kvev_seq_put(m1, -1);
    assert_memory_equal(m1, "\xff\xff\xff\xff\xff\xff\xff\xff", 8);

    baton_kvev_frame_t payload;
    baton_kvev_frame_t pub[3] = {{(const uint8_t *)"kv", 2}, {s8, 8}, {(const uint8_t *)"P", 1}};
    assert_int_equal(baton_kvev_parse_pub(pub, 3, &seq, &payload), BATON_KVEV_MSG_BATCH);
    assert_int_equal(payload.len, 1);
    assert_int_equal(baton_kvev_parse_pub(pub, 2, &seq, &payload), BATON_KVEV_MSG_BAD);
    pub[1].len = 4;
    assert_int_equal(baton_kvev_parse_pub(pub, 3, &seq, &payload), BATON_KVEV_MSG_BAD);

    /* Current vLLM: [topic, seq, payload], end ["", -1, ""]; older and SGLang: [seq, payload],
     * end [-1, ""]. */
    baton_kvev_frame_t r3[3] = {{(const uint8_t *)"kv", 2}, {s8, 8}, {(const uint8_t *)"P", 1}};
    assert_int_equal(baton_kvev_parse_replay(r3, 3, &seq, &payload), BATON_KVEV_MSG_BATCH);
    baton_kvev_frame_t e3[3] = {{(const uint8_t *)"", 0}, {m1, 8}, {(const uint8_t *)"", 0}};
    assert_int_equal(baton_kvev_parse_replay(e3, 3, &seq, &payload), BATON_KVEV_MSG_END);
    assert_int_equal(baton_kvev_parse_replay(r3 + 1, 2, &seq, &payload), BATON_KVEV_MSG_BATCH);
    assert_int_equal(baton_kvev_parse_replay(e3 + 1, 2, &seq, &payload), BATON_KVEV_MSG_END);
    e3[2].len = 1; /* an end marker with a payload */
    assert_int_equal(baton_kvev_parse_replay(e3, 3, &seq, &payload), BATON_KVEV_MSG_BAD);
    assert_int_equal(baton_kvev_parse_replay(r3, 1, &seq, &payload), BATON_KVEV_MSG_BAD);
    assert_int_equal(baton_kvev_parse_replay(r3, 4, &seq, &payload), BATON_KVEV_MSG_BAD);
}

/* One BlockStored of n blocks of 2 tokens, ids from base, engine hashes from h0 (digests when
 * dig), below parent (none when parent < 0). */
typedef struct {
    baton_kvev_hash_t h[8];
    uint32_t ids[16];
    baton_kvev_event_t e;
    baton_kvev_batch_t b;
} one_t;

static void stored_ev(one_t *o, int n, uint32_t base, int64_t h0, int dig, int64_t parent,
                      const char *medium)
{
    memset(o, 0, sizeof(*o));
    for (int k = 0; k < n; k++)
        o->h[k] = dig ? H_DIG((uint8_t)(h0 + k)) : H_INT(h0 + k);
    for (int k = 0; k < 2 * n; k++)
        o->ids[k] = base + (uint32_t)k;
    o->e = (baton_kvev_event_t){.type = BATON_KVEV_STORED, .hashes = o->h, .n_hashes = (uint32_t)n,
                                .token_ids = o->ids, .n_tokens = 2u * n, .block_size = 2};
    if (parent >= 0) {
        o->e.has_parent = 1;
        o->e.parent = dig ? H_DIG((uint8_t)parent) : H_INT(parent);
    }
    strcpy(o->e.medium, medium);
    o->b = (baton_kvev_batch_t){.dp_rank = -1, .events = &o->e, .n_events = 1};
}

static void removed_ev(one_t *o, int64_t h, int dig)
{
    memset(o, 0, sizeof(*o));
    o->h[0] = dig ? H_DIG((uint8_t)h) : H_INT(h);
    o->e = (baton_kvev_event_t){.type = BATON_KVEV_REMOVED, .hashes = o->h, .n_hashes = 1};
    o->b = (baton_kvev_batch_t){.dp_rank = -1, .events = &o->e, .n_events = 1};
}

/* Sources 0 (integer hashes) and 1 (digests, other values) store the same tokens: both match,
 * keyed by tokens, not by engine hashes; a chain continued through a parent; L2 after L1;
 * removal cuts the prefix; clear forgets one source; orphans and wrong block sizes. */
static void test_index(void **state)
{
    (void)state;
    baton_kvidx_t *x = baton_kvidx_create(2);
    one_t o;
    uint32_t req[9] = {100, 101, 102, 103, 104, 105, 106, 107, 999};
    uint32_t l1[3], l2[3];
    stored_ev(&o, 2, 100, 50, 0, -1, "GPU"); /* blocks [100 101] [102 103] */
    assert_int_equal(baton_kvidx_apply(x, 0, &o.b), 0);
    stored_ev(&o, 2, 104, 52, 0, 51, "CPU"); /* continues below hash 51 in L2 */
    assert_int_equal(baton_kvidx_apply(x, 0, &o.b), 0);
    stored_ev(&o, 3, 100, 7, 1, -1, ""); /* source 1: digests, nil medium (L1) */
    assert_int_equal(baton_kvidx_apply(x, 1, &o.b), 0);
    assert_int_equal(baton_kvidx_match(x, req, 9, 3, l1, l2), 4);
    assert_int_equal(l1[0], 2);
    assert_int_equal(l2[0], 2);
    assert_int_equal(l1[1], 3);
    assert_int_equal(l2[1], 0);
    assert_int_equal(l1[2] + l2[2], 0);
    uint64_t blocks;
    size_t bytes;
    baton_kvidx_size(x, &blocks, &bytes);
    assert_int_equal(blocks, 4);
    /* Removing source 1's second block leaves it the first only. */
    removed_ev(&o, 8, 1);
    baton_kvidx_apply(x, 1, &o.b);
    baton_kvidx_match(x, req, 9, 3, l1, l2);
    assert_int_equal(l1[1], 1);
    assert_int_equal(l1[0], 2);
    /* An orphan (parent never announced) is counted, not indexed; unknown removals counted. */
    stored_ev(&o, 1, 500, 90, 0, 12345, "GPU");
    baton_kvidx_apply(x, 0, &o.b);
    removed_ev(&o, 4242, 0);
    baton_kvidx_apply(x, 0, &o.b);
    baton_kvidx_source_stats_t st;
    baton_kvidx_source_stats(x, 0, &st);
    assert_int_equal(st.orphaned, 1);
    assert_int_equal(st.unknown_removes, 1);
    assert_int_equal(st.blocks, 4);
    assert_true(st.requests_hit >= 2);
    /* AllBlocksCleared on source 0: source 1 keeps its block. */
    baton_kvev_event_t clr = {.type = BATON_KVEV_CLEARED};
    baton_kvev_batch_t cb = {.dp_rank = -1, .events = &clr, .n_events = 1};
    baton_kvidx_apply(x, 0, &cb);
    baton_kvidx_match(x, req, 9, 3, l1, l2);
    assert_int_equal(l1[0] + l2[0], 0);
    assert_int_equal(l1[1], 1);
    baton_kvidx_clear(x, 1);
    baton_kvidx_size(x, &blocks, &bytes);
    assert_int_equal(blocks, 0);
    /* Another block size is refused. */
    stored_ev(&o, 1, 1, 1, 0, -1, "GPU");
    o.e.block_size = 1;
    o.e.n_tokens = 1;
    assert_int_equal(baton_kvidx_apply(x, 0, &o.b), -1);
    baton_kvidx_destroy(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_map_batch_type_last),
        cmocka_unit_test(test_old_short_arrays),
        cmocka_unit_test(test_hostile),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_truncations_and_flips),
        cmocka_unit_test(test_framing),
        cmocka_unit_test(test_index),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
