/* store/proto.h — baton-store's control protocol (client/node ↔ master, client ↔ node): one
 * frame layout for every message, its encoder and its bounded decoder. */
#ifndef BATON_STORE_PROTO_H
#define BATON_STORE_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "baton/store.h"
#include "common/buf.h"
#include "store/meta.h"

/*
 * Frame: a 16-byte header, then the body (little-endian throughout).
 *   u32 magic "BSTR" | u8 version (1) | u8 type | u16 zero | u32 request id | u32 body length
 * The body has ONE layout for every type (fields a type does not use are empty or zero), so that
 * one decoder, bounded everywhere, serves every message; a type says which fields mean something:
 *   str8 id | str8 ns | str8 host | u32 flags | u32 replicas | u16 xfer_port | u16 ctrl_port |
 *   u64 seg_bytes | u32 node | u32 seg | u64 export_key | i32 status | u32 prefix |
 *   u8 nonce[32] | u8 mac[32] |
 *   u16 n_items, per item:  str8 key | u64 x | u32 y
 *   u16 n_ritems, per item: i32 status | u64 len | u32 crc | u64 put_id | u32 lease_ms |
 *                           u8 n_replicas | u8 n_slices | u32 first_slice
 *   u32 n_slices, per slice: u32 node | u32 seg | u64 off | u64 len
 *   u16 n_nodes, per node:  u32 node | str8 host | u16 xfer_port | u16 ctrl_port
 *   u32 text length, text (JSON: a STAT reply; a PUT_START's KV blocks, master_kvev.c)
 * str8: u8 length, bytes (no NUL inside). A frame whose header is wrong (magic, version, unknown
 * type, length above the reader's limit) is refused from the header alone, before its body is
 * read; a body that does not parse exactly (a count beyond its limit or the bytes left, a string
 * too long or with a NUL, a reply item's slices outside the slice table, trailing bytes) is
 * refused as a whole. The peer then gets an error reply where one can be sent, and the
 * connection is closed.
 *
 * Authentication (a secret set on the listener): the connecting side's first frame is
 * AUTH_CHALLENGE {id, nonce}; the listener answers AUTH_RESPONSE {id, nonce, mac}, the connector
 * proves with AUTH_PROOF {mac}: libbaton's HMAC-SHA-256 transcript over both nonces and ids
 * (transfer/ctrl_auth.c), with the store's own labels. Nothing but these three frames is read
 * before the proof checks out.
 */

#define BATON__SP_MAGIC      0x52545342u /* "BSTR" */
#define BATON__SP_VERSION    1
#define BATON__SP_HDR        16
#define BATON__SP_ID_MAX     64
#define BATON__SP_HOST_MAX   64
#define BATON__SP_NONCE      32
#define BATON__SP_MAC        32
#define BATON__SP_SLICES_MAX (BATON_STORE_BATCH_MAX * 64)
#define BATON__SP_NODES_MAX  4096
#define BATON__SP_TEXT_MAX   (1u << 20)
#define BATON__SP_REQ_MAX    (1u << 20) /* body bytes a server reads from a request */
#define BATON__SP_REPLY_MAX  (8u << 20) /* body bytes a client reads from a reply */

typedef enum {
    BATON__SP_AUTH_CHALLENGE = 1,
    BATON__SP_AUTH_RESPONSE = 2,
    BATON__SP_AUTH_PROOF = 3,
    BATON__SP_PUT_START = 10,  /* items: key, x = len, y = crc; flags, replicas, ns */
    BATON__SP_PUT_COMMIT = 11, /* items: key, x = put id */
    BATON__SP_PUT_REVOKE = 12, /* items: key, x = put id */
    BATON__SP_GET = 13,        /* items: key */
    BATON__SP_EXISTS = 14,     /* items: key; flags BATON__SP_F_LOCATE */
    BATON__SP_REMOVE = 15,     /* items: key */
    BATON__SP_STAT = 16,
    BATON__SP_NODE_REGISTER = 30,  /* id, host, xfer_port, ctrl_port, seg_bytes */
    BATON__SP_NODE_HEARTBEAT = 31, /* node */
    BATON__SP_NODE_WRITE = 32, /* client → node: host, xfer_port, export_key, slices (off, len) */
    BATON__SP_NODE_READ = 33,  /* client → node: slices (off, len); the REPLY's text: the bytes */
    BATON__SP_REPLY = 64,      /* status; ritems, slices, nodes, prefix, node / seg, text */
} baton__sp_type_t;

/* EXISTS with this flag is answered as GET is (placements, checksum, the lease) for the keys
 * present, so that the get that follows an exists needs no request of its own. */
#define BATON__SP_F_LOCATE (1u << 16)

typedef struct {
    char key[BATON_STORE_KEY_MAX + 1];
    uint64_t x;
    uint32_t y;
} baton__sp_item_t;

typedef struct {
    int32_t status;
    uint64_t len;
    uint32_t crc;
    uint64_t put_id;
    uint32_t lease_ms;
    uint8_t n_replicas, n_slices;
    uint32_t first_slice; /* index into the message's slices; replica-major */
} baton__sp_ritem_t;

typedef struct {
    uint32_t node;
    char host[BATON__SP_HOST_MAX + 1];
    uint16_t xfer_port, ctrl_port;
} baton__sp_node_t;

/* A decoded (or to-be-encoded) message. Arrays are owned by the message after decoding
 * (baton__sp_msg_free); for encoding the caller points them at its own. */
typedef struct {
    uint8_t type;
    uint32_t req_id;
    char id[BATON__SP_ID_MAX + 1];
    char ns[BATON_STORE_NAMESPACE_MAX + 1];
    char host[BATON__SP_HOST_MAX + 1];
    uint32_t flags, replicas;
    uint16_t xfer_port, ctrl_port;
    uint64_t seg_bytes;
    uint32_t node, seg;
    uint64_t export_key;
    int32_t status;
    uint32_t prefix;
    uint8_t nonce[BATON__SP_NONCE];
    uint8_t mac[BATON__SP_MAC];
    uint32_t n_items;
    baton__sp_item_t *items;
    uint32_t n_ritems;
    baton__sp_ritem_t *ritems;
    uint32_t n_slices;
    baton__slice_t *slices;
    uint32_t n_nodes;
    baton__sp_node_t *nodes;
    uint32_t text_len;
    char *text;
} baton__sp_msg_t;

/* Appends m's frame to out. BATON_XFER_EINVAL for a field beyond its limit, BATON_XFER_ENOMEM. */
int baton__sp_encode(baton_buf_t *out, const baton__sp_msg_t *m);

/* Judges a frame header from the first n bytes of a stream: 1 when fewer than BATON__SP_HDR
 * bytes are there, 0 with *frame_len_p (header + body) when it is acceptable, BATON_XFER_EPROTO
 * (bad magic / version / type) or BATON_XFER_ETOOBIG (body above max_body). */
int baton__sp_frame_check(const uint8_t *p, size_t n, uint32_t max_body, size_t *frame_len_p);

/* Decodes one whole frame (as judged above). 0, or BATON_XFER_EPROTO / BATON_XFER_ENOMEM with
 * nothing to free. */
int baton__sp_decode(const uint8_t *frame, size_t len, uint32_t max_body, baton__sp_msg_t *m);
void baton__sp_msg_free(baton__sp_msg_t *m);

const char *baton__sp_type_name(uint8_t type);

/*
 * The get path needs no control message to the node: the client offers its destination buffer to
 * the node's libbaton engine (baton_xfer_offer, one layer of one page) under a room id that names
 * the segment offset to read — offset / 64 in the upper 44 bits (segments up to 1 PiB), a
 * per-client sequence in the lower 20 (room ids must be unique among the client's open rooms) —
 * and the node writes [offset, offset + page length) of its segment into it, after checking the
 * range. Anyone who passed the engines' authentication may read any range of a segment: the
 * secret is the trust boundary (docs/STORE.md).
 */
#define BATON__SP_ROOM_SEQ_BITS 20

/*
 * Inline reads: a small object can also be read over a node's control port, without libbaton's
 * engines (client_inline.c): NODE_READ names the slices (off, len), and the node answers a REPLY
 * whose text is their bytes, in order, copied from its segment (status 0), or a status alone:
 * BATON_XFER_ETOOBIG when they total more than the node's --inline-max (0 turns inline reads off
 * there), BATON_XFER_ERKEY for a range outside the segment, BATON_XFER_EINVAL for no slice. The
 * node never looks at the bytes; the client checks the object's CRC32C, as for every get.
 */
#define BATON__SP_INLINE_MAX        (1u << 20) /* the most either end allows (the text's bound) */
#define BATON__SP_INLINE_DEFAULT    (64u << 10)
#define BATON__SP_INLINE_SLICES_MAX 64 /* slices in one NODE_READ */
static inline uint64_t baton__sp_room_id(uint64_t off, uint32_t seq)
{
    return (off / 64) << BATON__SP_ROOM_SEQ_BITS | (seq & ((1u << BATON__SP_ROOM_SEQ_BITS) - 1));
}
static inline uint64_t baton__sp_room_off(uint64_t room_id)
{
    return (room_id >> BATON__SP_ROOM_SEQ_BITS) * 64;
}

#endif
