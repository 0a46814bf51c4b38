/* kvevents/encode.c — the KV-event batch encoder (libmsgpack's packer), in either event encoding,
 * and the ZMQ framing of sequence numbers and of PUB and replay messages. */
#include <string.h>

#include <msgpack.h>

#include "kvevents/wire.h"

static int buf_write(void *data, const char *p, size_t len)
{
    return baton_buf_append(data, p, len) == 0 ? 0 : -1;
}

static int pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    return msgpack_pack_str(pk, n) || msgpack_pack_str_body(pk, s, n);
}

static int pack_hash(msgpack_packer *pk, const baton_kvev_hash_t *h)
{
    if (h->len == 0)
        return msgpack_pack_int64(pk, h->i);
    return msgpack_pack_bin(pk, h->len) || msgpack_pack_bin_body(pk, h->b, h->len);
}

static int pack_hashes(msgpack_packer *pk, const baton_kvev_event_t *e)
{
    if (msgpack_pack_array(pk, e->n_hashes))
        return -1;
    for (uint32_t k = 0; k < e->n_hashes; k++)
        if (pack_hash(pk, &e->hashes[k]))
            return -1;
    return 0;
}

static int pack_medium(msgpack_packer *pk, const baton_kvev_event_t *e)
{
    return e->medium[0] ? pack_str(pk, e->medium) : msgpack_pack_nil(pk);
}

/* One field's value; the order of names is the array encoding's order. */
static int pack_field(msgpack_packer *pk, const baton_kvev_event_t *e, const char *name)
{
    if (strcmp(name, "block_hashes") == 0)
        return pack_hashes(pk, e);
    if (strcmp(name, "parent_block_hash") == 0)
        return e->has_parent ? pack_hash(pk, &e->parent) : msgpack_pack_nil(pk);
    if (strcmp(name, "token_ids") == 0) {
        if (msgpack_pack_array(pk, e->n_tokens))
            return -1;
        for (uint32_t k = 0; k < e->n_tokens; k++)
            if (msgpack_pack_uint32(pk, e->token_ids[k]))
                return -1;
        return 0;
    }
    if (strcmp(name, "block_size") == 0)
        return msgpack_pack_uint32(pk, e->block_size);
    if (strcmp(name, "lora_id") == 0)
        return e->has_lora ? msgpack_pack_int64(pk, e->lora_id) : msgpack_pack_nil(pk);
    return pack_medium(pk, e);
}

static const char *const STORED_F[] = {"block_hashes", "parent_block_hash", "token_ids",
                                       "block_size", "lora_id", "medium"};
static const char *const REMOVED_F[] = {"block_hashes", "medium"};

static int pack_event(msgpack_packer *pk, const baton_kvev_event_t *e, baton_kvev_encoding_t enc)
{
    const char *tag = e->type == BATON_KVEV_STORED    ? "BlockStored"
                      : e->type == BATON_KVEV_REMOVED ? "BlockRemoved"
                                                      : "AllBlocksCleared";
    const char *const *f = e->type == BATON_KVEV_STORED ? STORED_F : REMOVED_F;
    size_t nf = e->type == BATON_KVEV_STORED ? 6 : e->type == BATON_KVEV_REMOVED ? 2 : 0;
    if (enc == BATON_KVEV_ENC_ARRAY ? msgpack_pack_array(pk, 1 + nf) : msgpack_pack_map(pk, 1 + nf))
        return -1;
    if (enc == BATON_KVEV_ENC_MAP && pack_str(pk, "type"))
        return -1;
    if (pack_str(pk, tag))
        return -1;
    for (size_t k = 0; k < nf; k++) {
        if (enc == BATON_KVEV_ENC_MAP && pack_str(pk, f[k]))
            return -1;
        if (pack_field(pk, e, f[k]))
            return -1;
    }
    return 0;
}

int baton_kvev_encode(const baton_kvev_batch_t *b, baton_kvev_encoding_t enc, baton_buf_t *out)
{
    msgpack_packer pk;
    msgpack_packer_init(&pk, out, buf_write);
    if (msgpack_pack_array(&pk, b->dp_rank >= 0 ? 3 : 2) || msgpack_pack_double(&pk, b->ts) ||
        msgpack_pack_array(&pk, b->n_events))
        return -1;
    for (uint32_t k = 0; k < b->n_events; k++)
        if (pack_event(&pk, &b->events[k], enc))
            return -1;
    if (b->dp_rank >= 0 && msgpack_pack_int32(&pk, b->dp_rank))
        return -1;
    return 0;
}

void baton_kvev_seq_put(uint8_t out[8], int64_t seq)
{
    uint64_t u = (uint64_t)seq;
    for (int k = 7; k >= 0; k--, u >>= 8)
        out[k] = (uint8_t)u;
}

int baton_kvev_seq_get(const uint8_t *p, size_t len, int64_t *seq)
{
    if (len != 8)
        return -1;
    uint64_t u = 0;
    for (int k = 0; k < 8; k++)
        u = (u << 8) | p[k];
    *seq = (int64_t)u;
    return 0;
}

baton_kvev_msg_t baton_kvev_parse_pub(const baton_kvev_frame_t *f, size_t n, int64_t *seq,
                                      baton_kvev_frame_t *payload)
{
    if (n != 3 || baton_kvev_seq_get(f[1].p, f[1].len, seq) < 0 || *seq < 0)
        return BATON_KVEV_MSG_BAD;
    *payload = f[2];
    return BATON_KVEV_MSG_BATCH;
}

baton_kvev_msg_t baton_kvev_parse_replay(const baton_kvev_frame_t *f, size_t n, int64_t *seq,
                                         baton_kvev_frame_t *payload)
{
    if (n != 2 && n != 3)
        return BATON_KVEV_MSG_BAD;
    const baton_kvev_frame_t *s = &f[n - 2]; /* the sequence frame in either form */
    if (baton_kvev_seq_get(s->p, s->len, seq) < 0)
        return BATON_KVEV_MSG_BAD;
    if (*seq == -1)
        return f[n - 1].len == 0 ? BATON_KVEV_MSG_END : BATON_KVEV_MSG_BAD;
    if (*seq < 0)
        return BATON_KVEV_MSG_BAD;
    *payload = f[n - 1];
    return BATON_KVEV_MSG_BATCH;
}
