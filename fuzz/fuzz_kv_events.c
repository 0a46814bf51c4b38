/* fuzz/fuzz_kv_events.c — libFuzzer harness for the KV-event decoder (src/kvevents): arbitrary
 * bytes are decoded under tight limits; what decodes is encoded again in both event encodings and
 * must decode to the same batch; the replay framing is parsed on frames cut from the input. */
#include <string.h>

#include "fuzz_check.h"
#include "kvevents/wire.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

static int hash_same(const baton_kvev_hash_t *a, const baton_kvev_hash_t *b)
{
    return a->len == b->len && (a->len ? memcmp(a->b, b->b, a->len) == 0 : a->i == b->i);
}

static void check_same(const baton_kvev_batch_t *a, const baton_kvev_batch_t *b)
{
    CHECK(a->n_events == b->n_events && a->dp_rank == b->dp_rank);
    CHECK(a->ts == b->ts || (a->ts != a->ts && b->ts != b->ts)); /* NaN stays NaN */
    for (uint32_t k = 0; k < a->n_events; k++) {
        const baton_kvev_event_t *x = &a->events[k], *y = &b->events[k];
        CHECK(x->type == y->type && x->n_hashes == y->n_hashes && strcmp(x->medium, y->medium) == 0);
        for (uint32_t j = 0; j < x->n_hashes; j++)
            CHECK(hash_same(&x->hashes[j], &y->hashes[j]));
        if (x->type != BATON_KVEV_STORED)
            continue;
        CHECK(x->has_parent == y->has_parent && (!x->has_parent || hash_same(&x->parent, &y->parent)));
        CHECK(x->n_tokens == y->n_tokens && x->block_size == y->block_size);
        CHECK(x->n_tokens == 0 || memcmp(x->token_ids, y->token_ids, x->n_tokens * 4u) == 0);
        CHECK(x->has_lora == y->has_lora && (!x->has_lora || x->lora_id == y->lora_id));
        CHECK((uint64_t)x->n_hashes * x->block_size == x->n_tokens);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    baton_kvev_limits_t lim;
    baton_kvev_limits_default(&lim);
    lim.max_alloc = 1u << 20;
    lim.max_depth = 8;
    baton_kvev_batch_t b;
    char err[128];
    if (baton_kvev_decode(data, size, &lim, &b, err, sizeof(err)) == 0) {
        for (int enc = 0; enc < 2; enc++) {
            baton_buf_t out = BATON_BUF_INIT;
            CHECK(baton_kvev_encode(&b, (baton_kvev_encoding_t)enc, &out) == 0);
            baton_kvev_batch_t again;
            CHECK(baton_kvev_decode((uint8_t *)out.data, out.len, NULL, &again, err, sizeof(err)) == 0);
            check_same(&b, &again);
            baton_kvev_batch_free(&again);
            baton_buf_free(&out);
        }
        baton_kvev_batch_free(&b);
    } else {
        CHECK(b.events == NULL && b.n_events == 0 && err[0]);
    }
    /* Frames: the input cut in three at two bytes it names. */
    if (size >= 2) {
        size_t c1 = data[0] % size, c2 = c1 + (size - c1 ? data[1] % (size - c1 + 1) : 0);
        baton_kvev_frame_t f[3] = {{data, c1}, {data + c1, c2 - c1}, {data + c2, size - c2}};
        baton_kvev_frame_t payload;
        int64_t seq;
        for (size_t n = 1; n <= 3; n++) {
            baton_kvev_msg_t m = baton_kvev_parse_replay(f + 3 - n, n, &seq, &payload);
            CHECK(m != BATON_KVEV_MSG_BATCH || seq >= 0);
            CHECK(m != BATON_KVEV_MSG_END || seq == -1);
            m = baton_kvev_parse_pub(f + 3 - n, n, &seq, &payload);
            CHECK(m != BATON_KVEV_MSG_BATCH || (n == 3 && seq >= 0));
        }
    }
    return 0;
}
