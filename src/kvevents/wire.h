/* kvevents/wire.h — the KV-event wire format that vLLM and SGLang engines publish (and
 * baton-worker too): event batches, their msgpack encodings, ZMQ multipart framing and the replay
 * socket's reply forms. One codec for both sides (docs/PROTOCOLS.md, "KV events"). */
#ifndef BATON_KVEVENTS_WIRE_H
#define BATON_KVEVENTS_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

/* A block hash as the engine sent it: a 64-bit integer (len 0; unsigned values above INT64_MAX
 * keep their bit pattern) or a digest of 1..32 bytes (vLLM's sha256 is 32). Opaque to Baton: the
 * index keys blocks by its own hash of the token ids; an engine hash only names a block again
 * (its removal, a child's parent). */
#define BATON_KVEV_HASH_MAX 32
typedef struct {
    int64_t i;
    uint8_t len; /* 0: the integer form */
    uint8_t b[BATON_KVEV_HASH_MAX];
} baton_kvev_hash_t;

typedef enum {
    BATON_KVEV_STORED = 1,  /* BlockStored */
    BATON_KVEV_REMOVED = 2, /* BlockRemoved */
    BATON_KVEV_CLEARED = 3, /* AllBlocksCleared */
} baton_kvev_type_t;

#define BATON_KVEV_MEDIUM_MAX 15

typedef struct {
    baton_kvev_type_t type;
    baton_kvev_hash_t *hashes; /* STORED, REMOVED */
    uint32_t n_hashes;
    int has_parent; /* STORED: parent_block_hash is not nil */
    baton_kvev_hash_t parent;
    uint32_t *token_ids; /* STORED: n_hashes * block_size ids, block after block */
    uint32_t n_tokens;
    uint32_t block_size;
    int has_lora;
    int64_t lora_id;
    char medium[BATON_KVEV_MEDIUM_MAX + 1]; /* "" when nil or absent ("GPU" is meant then) */
} baton_kvev_event_t;

typedef struct {
    double ts;
    int32_t dp_rank; /* -1: absent or nil */
    baton_kvev_event_t *events;
    uint32_t n_events;
    uint32_t n_skipped; /* events of a type this decoder does not know, skipped whole */
} baton_kvev_batch_t;

/* What a decoder accepts; anything beyond is refused with an error, never truncated. */
typedef struct {
    size_t max_payload;   /* bytes of one batch */
    uint32_t max_events;  /* per batch */
    uint32_t max_hashes;  /* per event */
    uint32_t max_tokens;  /* per event */
    uint32_t max_depth;   /* nesting of values skipped (unknown fields, extra_keys) */
    uint32_t max_block;   /* block_size */
    size_t max_alloc;     /* bytes the decoded batch may hold (its arrays), all events together */
} baton_kvev_limits_t;

/* 16 MiB, 64 Ki events, 64 Ki hashes and 1 Mi tokens an event, depth 16, blocks of 4,096,
 * 64 MiB decoded. */
void baton_kvev_limits_default(baton_kvev_limits_t *lim);

/* Decodes one payload (a msgpack batch, array [ts, events, dp_rank?] or map {"ts", "events",
 * "data_parallel_rank"}; each event a map with a "type" key or an array with the tag first).
 * 0 on success (free with baton_kvev_batch_free); -1 with a reason in err (no input bytes in it)
 * and *out empty. Never reads past n; allocates at most in proportion to n. */
int baton_kvev_decode(const uint8_t *p, size_t n, const baton_kvev_limits_t *lim,
                      baton_kvev_batch_t *out, char *err, size_t errlen);
void baton_kvev_batch_free(baton_kvev_batch_t *b);

/* Encodings a publisher can send; the decoder reads all of them. */
typedef enum {
    BATON_KVEV_ENC_MAP = 0,   /* current vLLM: events as maps with "type" (batch an array) */
    BATON_KVEV_ENC_ARRAY = 1, /* older vLLM, SGLang: events as arrays, tag first */
} baton_kvev_encoding_t;

/* Appends the msgpack batch [ts, events, dp_rank] to out (dp_rank < 0: omitted). 0, or -1 on
 * allocation failure. */
int baton_kvev_encode(const baton_kvev_batch_t *b, baton_kvev_encoding_t enc, baton_buf_t *out);

/* ---- ZMQ framing (pure functions; the sockets live in pub.c and sub.c) ---- */

/* Sequence numbers travel as 8-byte big-endian signed integers; -1 ends a replay. */
void baton_kvev_seq_put(uint8_t out[8], int64_t seq);
/* 0 and *seq, or -1 when len is not 8. */
int baton_kvev_seq_get(const uint8_t *p, size_t len, int64_t *seq);

/* One frame of a multipart message, as received. */
typedef struct {
    const uint8_t *p;
    size_t len;
} baton_kvev_frame_t;

typedef enum {
    BATON_KVEV_MSG_BATCH = 0, /* a batch: *seq and the payload are set */
    BATON_KVEV_MSG_END = 1,   /* the end of a replay */
    BATON_KVEV_MSG_BAD = -1,
} baton_kvev_msg_t;

/* A PUB message [topic, seq, payload]. */
baton_kvev_msg_t baton_kvev_parse_pub(const baton_kvev_frame_t *f, size_t n, int64_t *seq,
                                      baton_kvev_frame_t *payload);
/* A replay reply as the DEALER side receives it (the ROUTER's identity already stripped, an
 * empty delimiter, if any, dropped by the caller): [topic, seq, payload] ending ["", -1, ""],
 * or [seq, payload] ending [-1, ""]. */
baton_kvev_msg_t baton_kvev_parse_replay(const baton_kvev_frame_t *f, size_t n, int64_t *seq,
                                         baton_kvev_frame_t *payload);

#endif
