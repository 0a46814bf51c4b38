/* frame.h — the worker bootstrap channel's binary frames: encoding and bounds-checked decoding. */
#ifndef BATON_WORKER_FRAME_H
#define BATON_WORKER_FRAME_H

#include <stddef.h>
#include <stdint.h>

/*
 * Every frame is an 8-byte header followed by a payload; all integers big-endian.
 *
 *   header:  u8 'B' (0x42) | u8 'T' (0x54) | u8 version (1) | u8 type | u32 payload length
 *
 *   WAIT  (1, decode → prefill, 8 bytes):   u64 room
 *   DONE  (2, prefill → decode, 20 bytes):  u64 room | i32 status (0 = ok) |
 *                                           u32 prompt tokens | i32 first token id (-1: none)
 *   ABORT (3, either way, 12 bytes):        u64 room | i32 reason (a negative Baton code)
 *
 * The payload length must equal the type's size exactly; anything else (bad magic, version,
 * type, length, or a type sent in the wrong direction) is a protocol error that closes the
 * connection it came on and nothing else.
 */

#define WK_FRAME_HEADER  8
#define WK_FRAME_MAX     (WK_FRAME_HEADER + 20)
#define WK_FRAME_VERSION 1

typedef enum {
    WK_FRAME_WAIT = 1,
    WK_FRAME_DONE = 2,
    WK_FRAME_ABORT = 3,
} wk_frame_type_t;

typedef struct wk_frame_s {
    wk_frame_type_t type;
    uint64_t room;
    int32_t status;         /* DONE: 0 ok; ABORT: reason */
    uint32_t prompt_tokens; /* DONE */
    int32_t first_token;    /* DONE */
} wk_frame_t;

/* Writes the frame into out (WK_FRAME_MAX bytes); returns its length. */
size_t wk_frame_encode(const wk_frame_t *f, uint8_t *out);

/*
 * Decodes the first frame in buf[0..len). Returns its total length (> 0) with *f filled, 0 when
 * more bytes are needed, or BATON_EPROTO with a static reason in *why.
 */
int wk_frame_decode(const uint8_t *buf, size_t len, wk_frame_t *f, const char **why);

const char *wk_frame_type_name(int type);

#endif
