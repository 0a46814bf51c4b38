/* fuzz/fuzz_ctrl_frame.c — libFuzzer harness for the KV control-frame decoder: a byte stream is
 * split into frames the way a control connection's read loop does; every frame the decoder
 * accepts is encoded again and must decode to the same frame. */
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "fuzz_check.h"
#include "transfer/ctrl_frame.h"

/* A GRANT's pages are read out one by one (they stay packed in the frame), then encoded. */
static int reencode_grant(const baton__grant_t *g, baton_buf_t *out)
{
    baton__offer_page_t *pages = g->n_pages ? calloc(g->n_pages, sizeof(*pages)) : NULL;
    if (g->n_pages && !pages)
        return 0;
    for (uint32_t i = 0; i < g->n_pages; i++)
        baton__grant_page(g, i, &pages[i]);
    int ok = baton__enc_grant(out, g->done.room, g->done.status, g->done.first_token,
                              g->done.payload, g->done.payload_len, g->n_pages, pages) == 0;
    free(pages);
    return ok;
}

/* Re-encodes a decoded frame (types with a general encoder); 0 when there is none. */
static int reencode(const baton__frame_t *f, baton_buf_t *out)
{
    switch (f->type) {
    case BATON__F_HELLO:
        return baton__enc_hello(out, &f->u.hello) == 0;
    case BATON__F_DONE:
        return baton__enc_done(out, f->u.done.room, f->u.done.status, f->u.done.first_token,
                               f->u.done.payload, f->u.done.payload_len) == 0;
    case BATON__F_ABORT:
        return baton__enc_abort(out, f->u.abort.room, f->u.abort.reason) == 0;
    case BATON__F_HEARTBEAT:
        return baton__enc_heartbeat(out, f->u.heartbeat.seq, f->u.heartbeat.sent_ms) == 0;
    case BATON__F_MEM:
        return baton__enc_mem(out, &f->u.mem) == 0;
    case BATON__F_LANE_HELLO:
        return baton__enc_lane_hello(out, f->u.lane_hello.incarnation, f->u.lane_hello.generation,
                                     f->u.lane_hello.lane) == 0;
    case BATON__F_LAYER_DONE:
        return baton__enc_layer_done(out, f->u.layer_done.room, f->u.layer_done.layer) == 0;
    case BATON__F_AUTH:
        return baton__enc_auth(out, &f->u.auth) == 0;
    case BATON__F_GRANT:
        return reencode_grant(&f->u.grant, out);
    case BATON__F_READ_DONE:
        return baton__enc_read_done(out, f->u.read_done.room, f->u.read_done.status) == 0;
    default:
        return 0;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t off = 0;
    while (off < size) {
        baton__frame_t f;
        size_t consumed = 0;
        const char *why = NULL;
        int rc = baton__frame_decode(data + off, size - off, &f, &consumed, &why);
        if (rc == 1)
            break; /* incomplete: a read loop waits for more */
        if (rc != 0) {
            CHECK(rc == BATON_EPROTO || rc == BATON_ETOOBIG);
            CHECK(why != NULL);
            break; /* the connection is closed */
        }
        CHECK(consumed >= BATON__FRAME_HDR && consumed <= size - off);
        CHECK(f.type >= 1 && f.type <= BATON__F_MAX_TYPE);
        CHECK(strcmp(baton__ftype_name(f.type), "?") != 0);
        if (f.type == BATON__F_OFFER) {
            /* pages below first_page (partial offer, proto 3) are cached on the decode side */
            CHECK(f.u.offer.n_pages ==
                  f.u.offer.n_layers * (f.u.offer.pages_per_layer - f.u.offer.first_page));
            for (uint32_t i = 0; i < f.u.offer.n_pages; i++) {
                baton__offer_page_t pg;
                baton__offer_page(&f.u.offer, i, &pg);
            }
        }
        baton_buf_t b = BATON_BUF_INIT;
        if (reencode(&f, &b)) {
            /* The canonical encoding of what was accepted is accepted and means the same. */
            CHECK(b.len == consumed);
            CHECK(memcmp(b.data, data + off, consumed) == 0);
            baton__frame_t g;
            size_t used = 0;
            CHECK(baton__frame_decode((const uint8_t *)b.data, b.len, &g, &used, NULL) == 0);
            CHECK(used == consumed && g.type == f.type);
        }
        baton_buf_free(&b);
        if (f.type == BATON__F_WRITE) {
            /* The data follows on the stream, read straight into the page. */
            if (f.u.write.data_len > size - off - consumed)
                break;
            consumed += f.u.write.data_len;
        }
        off += consumed;
    }
    return 0;
}
