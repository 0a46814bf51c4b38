/* transfer/ctrl_frame.h — the wire format of the control channel and TCP lanes: pure encode and
 * bounds-checked decode, no sockets. */
#ifndef BATON_TRANSFER_CTRL_FRAME_H
#define BATON_TRANSFER_CTRL_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

/*
 * Every frame: a 16-byte header, then `length` bytes of body. All integers little-endian.
 *
 *   0  u32 magic   "BATN" (0x4E544142)
 *   4  u16 version BATON__WIRE_VERSION (a frame of any other version is refused)
 *   6  u8  type    BATON__F_*
 *   7  u8  flags   0 (reserved: a non-zero value is refused)
 *   8  u32 length  body bytes; bounded per type (BATON__FRAME_MAX for the largest)
 *  12  u32 reserved 0
 *
 * Bodies (see ctrl_frame.c for the exact checks):
 *   HELLO      u16 proto, u8 role, u8 id_len, id[id_len], u64 incarnation, u64 generation,
 *              u64 echo_generation, u32 heartbeat_ms, i32 status, u8 n_tp,
 *              n_tp x { u8 transport, u16 blob_len, blob }
 *   OFFER      u64 room, u64 incarnation, u32 n_layers, u32 pages_per_layer,
 *              n x { u64 addr, u32 len, u32 mem_id }        (n = n_layers * pages_per_layer)
 *              [u32 first_page]  (proto >= 3, only when > 0: n = n_layers * (ppl - first_page))
 *   DONE       u64 room, i32 status, i64 first_token, u16 payload_len, payload
 *   ABORT      u64 room, i32 reason
 *   ABORT_ACK  u64 room
 *   HEARTBEAT  u64 seq, u64 sent_ms
 *   MEM        u32 mem_id, u8 kind, u64 base, u64 len, u8 transport, u16 blob_len, blob
 *   MEM_DEL    u32 mem_id
 *   LANE_HELLO u64 incarnation, u64 generation, u32 lane          (lane, decode -> prefill)
 *   LANE_ACK   u32 lane, i32 status                              (lane, prefill -> decode)
 *   WRITE      u64 room, u64 addr, u32 page, u32 seq, then length-24 data bytes (lane)
 *   WACK       u32 seq, i32 status                               (lane, decode -> prefill)
 *   LAYER_DONE u64 room, u32 layer                     (control, prefill -> decode, proto >= 2)
 *   AUTH       u8 step, u8 id_len, id[id_len], u64 incarnation, u64 generation, nonce[32],
 *              mac[32]     (control, both ways, before HELLO when a shared secret is set; see
 *              ctrl_auth.c: CHALLENGE decode -> prefill, RESPONSE back, PROOF decode -> prefill)
 *
 * Versions: BATON__WIRE_VERSION is the frame layout (must match exactly). BATON__PROTO_VERSION,
 * carried in HELLO, says which optional frames an engine understands; each side sends an
 * optional frame only when the peer's HELLO announced a proto that has it:
 *   1  the frames above except LAYER_DONE;
 *   2  + LAYER_DONE: the prefill side sends it once every write of that layer was acknowledged
 *      (tcp WACKs, shm copies, rdma completions), so it reaches the decode side after the
 *      layer's bytes and before the room's DONE. A proto-1 decode engine never gets one (it
 *      would refuse the unknown type and close the connection).
 *   3  + OFFER's trailing first_page: pages below it (in every layer) are cached on the decode
 *      side and not offered. A decode engine sends it only to a prefill of proto >= 3 (an
 *      older one would refuse the length); without it the OFFER is byte for byte proto 1's.
 *   4  + pull mode by RDMA READ (room_pull.c): on an rdma connection, a holder answers a pull
 *      (an OFFER for an exported key) with MEM frames for its source regions (prefill ->
 *      decode: the puller's transport learns their rkeys) and GRANT, instead of writing; the
 *      puller READs the pages and answers READ_DONE. Only to / from peers of proto >= 4.
 *   GRANT      u64 room, i32 status, i64 first_token, u16 payload_len, payload (DONE's fields),
 *              u32 n_pages, n_pages x (u64 addr, u32 len, u32 mem_id)   (prefill -> decode)
 *   READ_DONE  u64 room, i32 status: the puller's READs of the room are over: 0 all in place,
 *              else why it stopped; none of them is in flight anymore     (decode -> prefill)
 *
 * WRITE is the one frame whose body is not buffered: the decoder returns its 24 fixed bytes and
 * the data length, and the receiver reads the data straight into the destination page.
 */

#define BATON__WIRE_MAGIC       0x4E544142u
#define BATON__WIRE_VERSION     1
#define BATON__PROTO_VERSION    4
#define BATON__PROTO_LAYER_DONE 2 /* first proto with LAYER_DONE */
#define BATON__PROTO_FIRST_PAGE 3 /* first proto with OFFER's first_page */
#define BATON__PROTO_PULL_READ  4 /* first proto with GRANT / READ_DONE (pull by RDMA READ) */
#define BATON__FRAME_HDR        16
#define BATON__FRAME_MAX        (4u << 20) /* largest body of a buffered frame */
#define BATON__WRITE_FIXED      24
#define BATON__WRITE_HDR        (BATON__FRAME_HDR + BATON__WRITE_FIXED)
#define BATON__WRITE_DATA_MAX   (16u << 20)
#define BATON__OFFER_MAX_PAGES  131072u
#define BATON__OFFER_PAGE_BYTES 16
#define BATON__HELLO_MAX_TP     4
#define BATON__ID_MAX           64
#define BATON__DONE_MAX         1024
#define BATON__BLOB_MAX         4096

typedef enum {
    BATON__F_HELLO = 1,
    BATON__F_OFFER = 2,
    BATON__F_DONE = 3,
    BATON__F_ABORT = 4,
    BATON__F_ABORT_ACK = 5,
    BATON__F_HEARTBEAT = 6,
    BATON__F_MEM = 7,
    BATON__F_MEM_DEL = 8,
    BATON__F_LANE_HELLO = 9,
    BATON__F_LANE_ACK = 10,
    BATON__F_WRITE = 11,
    BATON__F_WACK = 12,
    BATON__F_LAYER_DONE = 13,
    BATON__F_AUTH = 14,
    BATON__F_GRANT = 15,
    BATON__F_READ_DONE = 16,
} baton__ftype_t;
#define BATON__F_MAX_TYPE 16

enum { BATON__ROLE_DECODE = 1, BATON__ROLE_PREFILL = 2 };

typedef struct {
    uint8_t id;
    uint16_t len;
    const uint8_t *blob; /* points into the decoded buffer */
} baton__hello_tp_t;

typedef struct {
    uint16_t proto;
    uint8_t role;
    char engine_id[BATON__ID_MAX + 1]; /* NUL-terminated, printable ASCII without spaces */
    uint64_t incarnation;              /* != 0 */
    uint64_t generation;               /* != 0 */
    uint64_t echo_generation;          /* prefill's reply: decode's generation; decode: 0 */
    uint32_t heartbeat_ms;
    int32_t status; /* prefill's reply: 0, or why it refused (no common transport, ...) */
    uint8_t n_tp;
    baton__hello_tp_t tp[BATON__HELLO_MAX_TP];
} baton__hello_t;

#define BATON__AUTH_NONCE 32
#define BATON__AUTH_MAC   32 /* HMAC-SHA-256 */
enum { BATON__AUTH_CHALLENGE = 1, BATON__AUTH_RESPONSE = 2, BATON__AUTH_PROOF = 3 };

typedef struct {
    uint8_t step;                      /* BATON__AUTH_* */
    char engine_id[BATON__ID_MAX + 1]; /* the sender's, NUL-terminated, printable */
    uint64_t incarnation;              /* the sender's, != 0 */
    uint64_t generation;               /* the sender's connection generation, != 0 */
    uint8_t nonce[BATON__AUTH_NONCE];  /* CHALLENGE / RESPONSE: the sender's fresh nonce */
    uint8_t mac[BATON__AUTH_MAC];      /* RESPONSE / PROOF: the sender's proof; else zeros */
} baton__auth_t;

typedef struct {
    uint64_t addr;
    uint32_t len;
    uint32_t mem_id;
} baton__offer_page_t;

typedef struct {
    uint64_t room;
    uint64_t incarnation;
    uint32_t n_layers;
    uint32_t pages_per_layer; /* the full shape, cached pages included */
    uint32_t first_page;      /* pages below it are cached on the decode side, not offered */
    uint32_t n_pages;         /* offered: n_layers * (pages_per_layer - first_page) */
    const uint8_t *pages_raw; /* n_pages x 16 bytes, already validated; read with _offer_page */
} baton__offer_t;

typedef struct {
    uint64_t room;
    int32_t status;
    int64_t first_token;
    uint16_t payload_len;
    const uint8_t *payload;
} baton__done_t;

/* GRANT: the holder's answer to a pull on rdma (DONE's fields, then the source pages). */
typedef struct {
    baton__done_t done;
    uint32_t n_pages;
    const uint8_t *pages_raw; /* n_pages x 16 bytes, read with baton__grant_page */
} baton__grant_t;

typedef struct {
    uint32_t mem_id;
    uint8_t kind;
    uint64_t base;
    uint64_t len;
    uint8_t transport;
    uint16_t blob_len;
    const uint8_t *blob;
} baton__mem_t;

typedef struct {
    uint64_t room;
    uint64_t addr;
    uint32_t page;
    uint32_t seq;
    uint32_t data_len; /* the data follows the frame's fixed part on the stream */
} baton__write_t;

typedef struct {
    uint8_t type;
    uint32_t length;
    union {
        baton__hello_t hello;
        baton__offer_t offer;
        baton__done_t done;
        struct {
            uint64_t room;
            int32_t reason;
        } abort;
        struct {
            uint64_t room;
        } abort_ack;
        struct {
            uint64_t seq;
            uint64_t sent_ms;
        } heartbeat;
        baton__mem_t mem;
        struct {
            uint32_t mem_id;
        } mem_del;
        struct {
            uint64_t incarnation;
            uint64_t generation;
            uint32_t lane;
        } lane_hello;
        struct {
            uint32_t lane;
            int32_t status;
        } lane_ack;
        baton__write_t write;
        struct {
            uint32_t seq;
            int32_t status;
        } wack;
        struct {
            uint64_t room;
            uint32_t layer;
        } layer_done;
        baton__auth_t auth;
        baton__grant_t grant;
        struct {
            uint64_t room;
            int32_t status;
        } read_done;
    } u;
} baton__frame_t;

/*
 * Checks the 16-byte header at buf[0..len) alone: 1 while fewer than 16 bytes are there (garbage
 * refused byte by byte), 0 with the frame's type and body length once the header is valid, or
 * baton__frame_decode's errors. A receiver decides from it whether it will take a frame of that
 * type and size at all before it buffers a byte of the body.
 */
int baton__frame_head(const uint8_t *buf, size_t len, uint8_t *type_p, uint32_t *length_p,
                      const char **why);

/*
 * Decodes one frame from buf[0..len). Returns:
 *   0: *f is filled and *consumed is the frame's size (for WRITE: header + 24, without data);
 *      pointers in *f point into buf;
 *   1: incomplete, read more (nothing consumed) — never returned once the header is invalid;
 *   BATON_EPROTO: malformed (bad magic/version/type/flags/field), BATON_ETOOBIG: length over
 *      the type's bound. `why` (may be NULL) gets a static reason for the log.
 * Pure and total: any byte string is either decoded, incomplete, or refused.
 */
int baton__frame_decode(const uint8_t *buf, size_t len, baton__frame_t *f, size_t *consumed,
                        const char **why);

/* Page i (< n_pages) of a decoded OFFER. */
void baton__offer_page(const baton__offer_t *o, uint32_t i, baton__offer_page_t *page);
/* Page i (< n_pages) of a decoded GRANT (the holder's source page). */
void baton__grant_page(const baton__grant_t *g, uint32_t i, baton__offer_page_t *page);

/* Encoders append one frame to out. 0 or BATON_ENOMEM / BATON_EINVAL (a field out of range). */
int baton__enc_hello(baton_buf_t *out, const baton__hello_t *h);
/* pages: n_layers * pages_per_layer entries. */
int baton__enc_offer(baton_buf_t *out, uint64_t room, uint64_t incarnation, uint32_t n_layers,
                     uint32_t pages_per_layer, const baton__offer_page_t *pages);
/* An OFFER whose pages [0, first_page) of each layer are not offered (pages holds n_layers *
 * (pages_per_layer - first_page)); first_page 0 encodes exactly baton__enc_offer's frame. */
int baton__enc_offer_from(baton_buf_t *out, uint64_t room, uint64_t incarnation, uint32_t n_layers,
                          uint32_t pages_per_layer, uint32_t first_page,
                          const baton__offer_page_t *pages);
int baton__enc_done(baton_buf_t *out, uint64_t room, int32_t status, int64_t first_token,
                    const uint8_t *payload, uint16_t payload_len);
int baton__enc_abort(baton_buf_t *out, uint64_t room, int32_t reason);
int baton__enc_abort_ack(baton_buf_t *out, uint64_t room);
int baton__enc_heartbeat(baton_buf_t *out, uint64_t seq, uint64_t sent_ms);
int baton__enc_mem(baton_buf_t *out, const baton__mem_t *m);
int baton__enc_mem_del(baton_buf_t *out, uint32_t mem_id);
int baton__enc_lane_hello(baton_buf_t *out, uint64_t incarnation, uint64_t generation,
                          uint32_t lane);
int baton__enc_lane_ack(baton_buf_t *out, uint32_t lane, int32_t status);
int baton__enc_wack(baton_buf_t *out, uint32_t seq, int32_t status);
int baton__enc_layer_done(baton_buf_t *out, uint64_t room, uint32_t layer);
int baton__enc_auth(baton_buf_t *out, const baton__auth_t *a);
int baton__enc_grant(baton_buf_t *out, uint64_t room, int32_t status, int64_t first_token,
                     const uint8_t *payload, uint16_t payload_len, uint32_t n_pages,
                     const baton__offer_page_t *pages);
int baton__enc_read_done(baton_buf_t *out, uint64_t room, int32_t status);

/* Fixed-size encoders for the lane hot path (no allocation). */
void baton__enc_write_hdr(uint8_t out[BATON__WRITE_HDR], uint64_t room, uint64_t addr,
                          uint32_t page, uint32_t seq, uint32_t data_len);
#define BATON__WACK_SIZE (BATON__FRAME_HDR + 8)
void baton__enc_wack_fixed(uint8_t out[BATON__WACK_SIZE], uint32_t seq, int32_t status);

const char *baton__ftype_name(int type);

#endif
