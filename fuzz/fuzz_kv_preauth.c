/* fuzz/fuzz_kv_preauth.c — libFuzzer harness for the KV bootstrap's read path before a peer is
 * through its handshake: the bytes of one accepted connection arrive in reads of fuzzed sizes
 * into a buffer grown and charged the way the listener does it (ctrl_admit.c), and each frame is
 * judged the way the read loop does (baton__conn_next_frame). Whatever is sent, only handshake
 * frames are ever decoded, and the buffer never grows past a handshake frame and one read step. */
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "fuzz_check.h"
#include "transfer/internal.h"

/* The largest frame a pending connection may send (a HELLO with four transport blobs), one
 * read step on top, then baton_buf_reserve's doubling. */
#define HELLO_BODY_MAX  (37 + BATON__ID_MAX + BATON__HELLO_MAX_TP * (3 + BATON__BLOB_MAX))
#define PENDING_CAP_MAX (2 * (BATON__FRAME_HDR + HELLO_BODY_MAX + 4096))

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    baton_xfer_engine_t *eng = calloc(1, sizeof(*eng));
    baton__conn_t *c = calloc(1, sizeof(*c));
    if (eng == NULL || c == NULL) {
        free(eng);
        free(c);
        return 0;
    }
    baton_list_init(&eng->conns);
    eng->cfg.max_pending_conns = 4;
    eng->cfg.max_pending_per_addr = 4;
    eng->cfg.pending_buffer_bytes = 1u << 20;
    /* First byte: with or without a secret, and whether the peer already proved it. */
    eng->secret_len = (data[0] & 1) ? 32 : 0;
    c->eng = eng;
    c->role = BATON__ROLE_PREFILL;
    c->state = (data[0] & 2) ? BATON__CONN_AUTH : BATON__CONN_PENDING;
    c->authed = eng->secret_len > 0 && (data[0] & 4) && c->state == BATON__CONN_PENDING;
    c->rbuf = (baton_buf_t)BATON_BUF_INIT;
    snprintf(c->ip, sizeof(c->ip), "192.0.2.1");
    baton_list_push(&eng->conns, &c->link);
    const char *why = NULL;
    CHECK(baton__admit_accept(c, &why) == 0);

    /* Second byte: the read size (1..256 bytes per read); the rest is the peer's stream. */
    size_t step = (size_t)data[1] + 1;
    size_t pos = 2;
    int open = 1;
    while (open && pos < size) {
        if (baton__admit_reserve(c) != 0)
            break; /* over the budget: the connection is closed */
        size_t room = c->rbuf.cap - c->rbuf.len - 1;
        size_t n = size - pos < step ? size - pos : step;
        if (n > room)
            n = room;
        memcpy(c->rbuf.data + c->rbuf.len, data + pos, n);
        c->rbuf.len += n;
        pos += n;
        size_t off = 0;
        for (;;) {
            baton__frame_t f;
            size_t consumed = 0;
            int rc = baton__conn_next_frame(c, (const uint8_t *)c->rbuf.data + off,
                                            c->rbuf.len - off, &f, &consumed, &why);
            if (rc == 1) {
                /* Waiting for more: only ever for the body of a frame this state takes. */
                uint8_t type;
                uint32_t length;
                if (c->rbuf.len - off >= BATON__FRAME_HDR) {
                    CHECK(baton__frame_head((const uint8_t *)c->rbuf.data + off, c->rbuf.len - off,
                                            &type, &length, &why) == 0);
                    CHECK(type == BATON__F_HELLO || type == BATON__F_AUTH ||
                          type == BATON__F_LANE_HELLO);
                    CHECK(length <= HELLO_BODY_MAX);
                }
                break;
            }
            if (rc != 0) { /* malformed or not taken in this state: closed */
                CHECK(rc == 2 || rc == BATON_EPROTO || rc == BATON_ETOOBIG);
                open = 0;
                break;
            }
            CHECK(f.type == BATON__F_HELLO || f.type == BATON__F_AUTH ||
                  f.type == BATON__F_LANE_HELLO);
            CHECK(c->state != BATON__CONN_AUTH || f.type == BATON__F_AUTH);
            CHECK(consumed >= BATON__FRAME_HDR && consumed <= c->rbuf.len - off);
            off += consumed;
        }
        if (off > 0)
            baton_buf_consume(&c->rbuf, off);
        CHECK(c->rbuf.cap <= PENDING_CAP_MAX);
        CHECK(c->charged == c->rbuf.cap);
        CHECK(atomic_load(&eng->st_pending_bytes) <= eng->cfg.pending_buffer_bytes);
    }
    baton__admit_release(c);
    CHECK(atomic_load(&eng->st_pending_conns) == 0);
    CHECK(atomic_load(&eng->st_pending_bytes) == 0);
    baton_buf_free(&c->rbuf);
    free(c);
    free(eng);
    return 0;
}
