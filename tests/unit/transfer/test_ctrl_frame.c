/* test_ctrl_frame.c — round trips, truncation, every field out of range, and a bounded fuzz of
 * the control/lane frame decoder. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "baton/error.h"
#include "common/rand.h"
#include "transfer/ctrl_frame.h"

static uint64_t rng = 0x1234567887654321ull;
static uint64_t rnd(void)
{
    return baton_xorshift64s(&rng);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static int decode(const baton_buf_t *b, baton__frame_t *f, size_t *consumed)
{
    return baton__frame_decode((const uint8_t *)b->data, b->len, f, consumed, NULL);
}

static void make_hello(baton_buf_t *b)
{
    static const uint8_t blob1[] = {1, 2, 3};
    baton__hello_t h;
    memset(&h, 0, sizeof(h));
    h.proto = 1;
    h.role = BATON__ROLE_DECODE;
    strcpy(h.engine_id, "decode-1");
    h.incarnation = 0xAABBCCDDEEFF0011ull;
    h.generation = 7;
    h.heartbeat_ms = 250;
    h.n_tp = 2;
    h.tp[0].id = 3;
    h.tp[0].len = sizeof(blob1);
    h.tp[0].blob = blob1;
    h.tp[1].id = 2;
    h.tp[1].len = 0;
    assert_int_equal(baton__enc_hello(b, &h), 0);
}

static void make_offer(baton_buf_t *b, uint32_t layers, uint32_t ppl)
{
    baton__offer_page_t *pages = calloc((size_t)layers * ppl, sizeof(*pages));
    assert_non_null(pages);
    for (uint32_t i = 0; i < layers * ppl; i++) {
        pages[i].addr = 0x10000 + (uint64_t)i * 4096;
        pages[i].len = 4096;
        pages[i].mem_id = 1 + i % 3;
    }
    assert_int_equal(baton__enc_offer(b, 99, 5, layers, ppl, pages), 0);
    free(pages);
}

/* OFFER with first_page (proto 3): only the pages from first_page on travel, the shape stays
 * whole; first_page 0 encodes the proto-1 frame byte for byte; a first_page at or past the
 * shape, or one that does not match the page count, is refused. */
static void test_offer_first_page(void **state)
{
    (void)state;
    baton__offer_page_t pages[6]; /* 2 layers x (5 - 2) offered pages */
    for (uint32_t i = 0; i < 6; i++) {
        pages[i].addr = 0x20000 + (uint64_t)i * 4096;
        pages[i].len = 4096;
        pages[i].mem_id = 7;
    }
    baton_buf_t b = BATON_BUF_INIT;
    baton__frame_t f;
    size_t c;
    assert_int_equal(baton__enc_offer_from(&b, 42, 5, 2, 5, 2, pages), 0);
    assert_int_equal(b.len, BATON__FRAME_HDR + 24 + 6 * BATON__OFFER_PAGE_BYTES + 4);
    assert_int_equal(decode(&b, &f, &c), 0);
    assert_int_equal(c, b.len);
    assert_int_equal(f.type, BATON__F_OFFER);
    assert_int_equal(f.u.offer.pages_per_layer, 5);
    assert_int_equal(f.u.offer.first_page, 2);
    assert_int_equal(f.u.offer.n_pages, 6);
    baton__offer_page_t pg;
    baton__offer_page(&f.u.offer, 5, &pg);
    assert_int_equal(pg.addr, 0x20000 + 5 * 4096);

    /* the trailer claims another first_page than the page count says: refused */
    uint8_t *body = (uint8_t *)b.data + BATON__FRAME_HDR;
    put32(body + 24 + 6 * BATON__OFFER_PAGE_BYTES, 1);
    assert_int_equal(decode(&b, &f, &c), BATON_EPROTO);
    put32(body + 24 + 6 * BATON__OFFER_PAGE_BYTES, 5); /* the whole layer cached */
    assert_int_equal(decode(&b, &f, &c), BATON_EPROTO);
    put32(body + 24 + 6 * BATON__OFFER_PAGE_BYTES, 0); /* a trailer must not say 0 */
    assert_int_equal(decode(&b, &f, &c), BATON_EPROTO);
    baton_buf_free(&b);

    /* first_page 0 is the old frame exactly */
    baton_buf_t a = BATON_BUF_INIT;
    assert_int_equal(baton__enc_offer_from(&b, 42, 5, 2, 3, 0, pages), 0);
    assert_int_equal(baton__enc_offer(&a, 42, 5, 2, 3, pages), 0);
    assert_int_equal(a.len, b.len);
    assert_memory_equal(a.data, b.data, a.len);
    assert_int_equal(decode(&b, &f, &c), 0);
    assert_int_equal(f.u.offer.first_page, 0);
    baton_buf_free(&a);
    baton_buf_free(&b);
    assert_int_equal(baton__enc_offer_from(&b, 42, 5, 2, 3, 3, pages), BATON_EINVAL);
    baton_buf_free(&b);
}

static void test_round_trips(void **state)
{
    baton__frame_t f;
    size_t c;

    baton_buf_t b = BATON_BUF_INIT;
    make_hello(&b);
    assert_int_equal(decode(&b, &f, &c), 0);
    assert_int_equal(c, b.len);
    assert_int_equal(f.type, BATON__F_HELLO);
    assert_string_equal(f.u.hello.engine_id, "decode-1");
    assert_int_equal(f.u.hello.incarnation, 0xAABBCCDDEEFF0011ull);
    assert_int_equal(f.u.hello.n_tp, 2);
    assert_int_equal(f.u.hello.tp[0].id, 3);
    assert_int_equal(f.u.hello.tp[0].len, 3);
    assert_int_equal(f.u.hello.tp[0].blob[2], 3);
    baton_buf_free(&b);

    make_offer(&b, 4, 3);
    assert_int_equal(decode(&b, &f, &c), 0);
    assert_int_equal(f.u.offer.n_pages, 12);
    baton__offer_page_t pg;
    baton__offer_page(&f.u.offer, 11, &pg);
    assert_int_equal(pg.addr, 0x10000 + 11 * 4096);
    assert_int_equal(pg.len, 4096);
    assert_int_equal(pg.mem_id, 1 + 11 % 3);
    baton_buf_free(&b);

    const uint8_t payload[] = "hello";
    assert_int_equal(baton__enc_done(&b, 5, -3, 42, payload, 5), 0);
    assert_int_equal(baton__enc_abort(&b, 6, BATON_EABORTED), 0);
    assert_int_equal(baton__enc_abort_ack(&b, 7), 0);
    assert_int_equal(baton__enc_heartbeat(&b, 8, 9), 0);
    baton__mem_t m = {.mem_id = 3,
                      .kind = 0,
                      .base = 0x1000,
                      .len = 0x2000,
                      .transport = 3,
                      .blob_len = 5,
                      .blob = payload};
    assert_int_equal(baton__enc_mem(&b, &m), 0);
    assert_int_equal(baton__enc_mem_del(&b, 3), 0);
    assert_int_equal(baton__enc_lane_hello(&b, 1, 2, 3), 0);
    assert_int_equal(baton__enc_lane_ack(&b, 3, 0), 0);
    assert_int_equal(baton__enc_wack(&b, 77, BATON_ERKEY), 0);
    uint8_t wh[BATON__WRITE_HDR];
    baton__enc_write_hdr(wh, 11, 0x5000, 2, 78, 100);
    assert_int_equal(baton_buf_append(&b, wh, sizeof(wh)), 0);

    const uint8_t *p = (const uint8_t *)b.data;
    size_t left = b.len;
    int types[] = {BATON__F_DONE, BATON__F_ABORT,   BATON__F_ABORT_ACK,  BATON__F_HEARTBEAT,
                   BATON__F_MEM,  BATON__F_MEM_DEL, BATON__F_LANE_HELLO, BATON__F_LANE_ACK,
                   BATON__F_WACK, BATON__F_WRITE};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        assert_int_equal(baton__frame_decode(p, left, &f, &c, NULL), 0);
        assert_int_equal(f.type, types[i]);
        p += c;
        left -= c;
        if (f.type == BATON__F_DONE) {
            assert_int_equal(f.u.done.status, -3);
            assert_int_equal(f.u.done.first_token, 42);
            assert_memory_equal(f.u.done.payload, "hello", 5);
        } else if (f.type == BATON__F_ABORT) {
            assert_int_equal(f.u.abort.reason, BATON_EABORTED);
        } else if (f.type == BATON__F_MEM) {
            assert_int_equal(f.u.mem.len, 0x2000);
            assert_int_equal(f.u.mem.blob_len, 5);
        } else if (f.type == BATON__F_WACK) {
            assert_int_equal(f.u.wack.seq, 77);
            assert_int_equal(f.u.wack.status, BATON_ERKEY);
        } else if (f.type == BATON__F_WRITE) {
            assert_int_equal(f.u.write.data_len, 100);
            assert_int_equal(f.u.write.seq, 78);
            assert_int_equal(c, BATON__WRITE_HDR);
        }
    }
    assert_int_equal(left, 0);
    baton_buf_free(&b);
}

/* Every strict prefix of a valid frame is "incomplete", never an error or a frame. */
static void test_truncated_frames_are_incomplete(void **state)
{
    baton_buf_t b = BATON_BUF_INIT;
    make_hello(&b);
    make_offer(&b, 2, 2);
    assert_int_equal(baton__enc_done(&b, 5, 0, 1, (const uint8_t *)"xy", 2), 0);
    baton__frame_t f;
    size_t c, off = 0;
    while (off < b.len) {
        const uint8_t *p = (const uint8_t *)b.data + off;
        assert_int_equal(baton__frame_decode(p, b.len - off, &f, &c, NULL), 0);
        for (size_t n = 0; n < c; n++)
            assert_int_equal(baton__frame_decode(p, n, &f, &c, NULL), 1);
        assert_int_equal(baton__frame_decode(p, b.len - off, &f, &c, NULL), 0);
        off += c;
    }
    baton_buf_free(&b);
}

/* Patches one header or body field of a fresh frame and expects a refusal. */
typedef void (*make_fn)(baton_buf_t *b);
static void mk_hello(baton_buf_t *b)
{
    make_hello(b);
}
static void mk_offer(baton_buf_t *b)
{
    make_offer(b, 2, 2);
}
static void mk_done(baton_buf_t *b)
{
    assert_int_equal(baton__enc_done(b, 1, 0, 1, (const uint8_t *)"ab", 2), 0);
}
static void mk_mem(baton_buf_t *b)
{
    baton__mem_t m = {.mem_id = 3, .kind = 0, .base = 0x1000, .len = 0x2000, .transport = 2};
    assert_int_equal(baton__enc_mem(b, &m), 0);
}
static void mk_lane_hello(baton_buf_t *b)
{
    assert_int_equal(baton__enc_lane_hello(b, 1, 2, 3), 0);
}
static void mk_write(baton_buf_t *b)
{
    uint8_t wh[BATON__WRITE_HDR];
    baton__enc_write_hdr(wh, 1, 0x1000, 0, 1, 10);
    assert_int_equal(baton_buf_append(b, wh, sizeof(wh)), 0);
}

static void mk_layer_done(baton_buf_t *b)
{
    assert_int_equal(baton__enc_layer_done(b, 0x1122334455667788ull, 63), 0);
}

static const baton__offer_page_t grant_pages[2] = {{0x10000, 4096, 3},
                                                   {0x7f0000001000ull, 65536, 4}};

static void mk_grant(baton_buf_t *b)
{
    assert_int_equal(baton__enc_grant(b, 0x0102030405060708ull, -7, 4242, (const uint8_t *)"kv", 2,
                                      2, grant_pages),
                     0);
}

static void mk_read_done(baton_buf_t *b)
{
    assert_int_equal(baton__enc_read_done(b, 99, BATON_EABORTED), 0);
}

static void expect_refused(make_fn mk, size_t off, int width, uint64_t value)
{
    baton_buf_t b = BATON_BUF_INIT;
    mk(&b);
    uint8_t *p = (uint8_t *)b.data;
    assert_true(off + (size_t)width <= b.len);
    if (width == 1)
        p[off] = (uint8_t)value;
    else if (width == 2) {
        p[off] = (uint8_t)value;
        p[off + 1] = (uint8_t)(value >> 8);
    } else if (width == 4)
        put32(p + off, (uint32_t)value);
    else
        put64(p + off, value);
    baton__frame_t f;
    size_t c;
    const char *why = NULL;
    int rc = baton__frame_decode(p, b.len, &f, &c, &why);
    if (rc >= 0)
        fail_msg("field at %zu (width %d) = %llu accepted (rc %d)", off, width,
                 (unsigned long long)value, rc);
    assert_true(rc == BATON_EPROTO || rc == BATON_ETOOBIG);
    assert_non_null(why);
    assert_true(why[0] != '\0');
    baton_buf_free(&b);
}

static void test_every_field_out_of_range(void **state)
{
    const size_t H = BATON__FRAME_HDR;
    /* Header fields, on several frame types. */
    make_fn all[] = {mk_hello, mk_offer, mk_done, mk_mem, mk_lane_hello, mk_write};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        expect_refused(all[i], 0, 4, 0xDEADBEEF); /* magic */
        expect_refused(all[i], 4, 2, 2);          /* version */
        expect_refused(all[i], 4, 2, 0);          /* version */
        expect_refused(all[i], 6, 1, 0);          /* type */
        expect_refused(all[i], 6, 1, 13);         /* type */
        expect_refused(all[i], 6, 1, 255);        /* type */
        expect_refused(all[i], 7, 1, 1);          /* flags */
        expect_refused(all[i], 8, 4, 0xFFFFFFFF); /* length */
        if (all[i] != mk_write)
            expect_refused(all[i], 8, 4, BATON__FRAME_MAX + 1); /* length */
        expect_refused(all[i], 12, 4, 1);                       /* reserved */
    }
    /* Lengths below a type's minimum (would otherwise wait forever or under-read). */
    expect_refused(mk_done, 8, 4, 0);
    expect_refused(mk_lane_hello, 8, 4, 19);
    expect_refused(mk_lane_hello, 8, 4, 21);
    expect_refused(mk_write, 8, 4, BATON__WRITE_FIXED); /* no data */
    expect_refused(mk_write, 8, 4, BATON__WRITE_FIXED + BATON__WRITE_DATA_MAX + 1);

    /* HELLO body: proto(2) role(1) id_len(1) id(8) inc(8) gen(8) echo(8) hb(4) status(4) n(1)
     * then tp[0] id(1) len(2) blob(3), tp[1] id(1) len(2). */
    size_t o = H;
    expect_refused(mk_hello, o + 0, 2, 0);   /* proto 0 */
    expect_refused(mk_hello, o + 2, 1, 0);   /* role */
    expect_refused(mk_hello, o + 2, 1, 3);   /* role */
    expect_refused(mk_hello, o + 3, 1, 0);   /* id_len 0 */
    expect_refused(mk_hello, o + 3, 1, 65);  /* id_len over max */
    expect_refused(mk_hello, o + 3, 1, 9);   /* id_len != actual: trailing mismatch */
    expect_refused(mk_hello, o + 4, 1, ' '); /* id char */
    expect_refused(mk_hello, o + 4, 1, 0x80);
    o = H + 4 + 8;
    expect_refused(mk_hello, o, 8, 0);            /* incarnation 0 */
    expect_refused(mk_hello, o + 8, 8, 0);        /* generation 0 */
    expect_refused(mk_hello, o + 24, 4, 0);       /* heartbeat 0 */
    expect_refused(mk_hello, o + 24, 4, 3600001); /* heartbeat too long */
    expect_refused(mk_hello, o + 28, 4, 1);       /* positive status */
    expect_refused(mk_hello, o + 32, 1, 5);       /* n_tp over max */
    expect_refused(mk_hello, o + 32, 1, 3);       /* n_tp over actual */
    expect_refused(mk_hello, o + 32, 1, 1);       /* n_tp under actual: trailing bytes */
    expect_refused(mk_hello, o + 33, 1, 0);       /* transport id 0 */
    expect_refused(mk_hello, o + 33, 1, 4);       /* transport id 4 */
    expect_refused(mk_hello, o + 34, 2, 4097);    /* blob too long */
    expect_refused(mk_hello, o + 34, 2, 4);       /* blob len mismatch */
    expect_refused(mk_hello, o + 39, 1, 3);       /* duplicate transport */

    /* OFFER body: room(8) inc(8) layers(4) ppl(4) pages 4 x 16. */
    o = H;
    expect_refused(mk_offer, o + 8, 8, 0);                      /* incarnation 0 */
    expect_refused(mk_offer, o + 16, 4, 0);                     /* layers 0 */
    expect_refused(mk_offer, o + 20, 4, 0);                     /* ppl 0 */
    expect_refused(mk_offer, o + 16, 4, 3);                     /* count mismatch */
    expect_refused(mk_offer, o + 16, 4, 0x10000);               /* too many pages */
    expect_refused(mk_offer, o + 16, 4, 0xFFFFFFFF);            /* product overflow */
    expect_refused(mk_offer, o + 24, 8, 0);                     /* page addr 0 */
    expect_refused(mk_offer, o + 24 + 16 * 3 + 8, 4, 0);        /* page len 0 */
    expect_refused(mk_offer, o + 24 + 16, 8, UINT64_MAX - 100); /* wraps */

    /* DONE body: room(8) status(4) token(8) plen(2) payload(2). */
    expect_refused(mk_done, H + 20, 2, 3);    /* plen mismatch */
    expect_refused(mk_done, H + 20, 2, 1025); /* plen over max */

    /* MEM body: id(4) kind(1) base(8) len(8) tp(1) blob_len(2). */
    expect_refused(mk_mem, H + 0, 4, 0);
    expect_refused(mk_mem, H + 4, 1, 2);
    expect_refused(mk_mem, H + 5, 8, 0);
    expect_refused(mk_mem, H + 13, 8, 0);
    expect_refused(mk_mem, H + 13, 8, UINT64_MAX);
    expect_refused(mk_mem, H + 21, 1, 0);
    expect_refused(mk_mem, H + 21, 1, 9);
    expect_refused(mk_mem, H + 22, 2, 1);

    /* LANE_HELLO: inc(8) gen(8) lane(4). */
    expect_refused(mk_lane_hello, H + 0, 8, 0);
    expect_refused(mk_lane_hello, H + 8, 8, 0);
    expect_refused(mk_lane_hello, H + 16, 4, 64);

    /* WRITE: room(8) addr(8). */
    expect_refused(mk_write, H + 8, 8, 0);
    expect_refused(mk_write, H + 8, 8, UINT64_MAX - 5);

    /* Positive status / reason fields. */
    baton_buf_t b = BATON_BUF_INIT;
    assert_int_equal(baton__enc_wack(&b, 1, 0), 0);
    put32((uint8_t *)b.data + H + 4, 5);
    baton__frame_t f;
    size_t c;
    assert_int_equal(decode(&b, &f, &c), BATON_EPROTO);
    baton_buf_free(&b);
}

/* Garbage is refused as soon as the magic is wrong, even before a full header. */
static void test_early_garbage(void **state)
{
    baton__frame_t f;
    size_t c;
    const uint8_t junk[] = "GET / HTTP/1.1\r\n";
    assert_int_equal(baton__frame_decode(junk, 1, &f, &c, NULL), BATON_EPROTO);
    const uint8_t good[] = {0x42, 0x41};
    assert_int_equal(baton__frame_decode(good, 2, &f, &c, NULL), 1);
    assert_int_equal(baton__frame_decode(good, 0, &f, &c, NULL), 1);
}

/* The header alone says a frame's type and size: a receiver can refuse a 2 MiB OFFER from its
 * 16 bytes, while the decoder still waits for the body. */
static void test_head_before_body(void **state)
{
    baton_buf_t b = BATON_BUF_INIT;
    assert_int_equal(baton__enc_heartbeat(&b, 1, 2), 0);
    uint8_t hdr[BATON__FRAME_HDR];
    memcpy(hdr, b.data, sizeof(hdr));
    baton_buf_free(&b);
    hdr[6] = BATON__F_OFFER;
    put32(hdr + 8, 2u << 20);
    uint8_t type = 0;
    uint32_t length = 0;
    assert_int_equal(baton__frame_head(hdr, sizeof(hdr), &type, &length, NULL), 0);
    assert_int_equal(type, BATON__F_OFFER);
    assert_int_equal(length, 2u << 20);
    baton__frame_t f;
    size_t c;
    assert_int_equal(baton__frame_decode(hdr, sizeof(hdr), &f, &c, NULL), 1);
    assert_int_equal(baton__frame_head(hdr, 15, &type, &length, NULL), 1);
    put32(hdr + 8, 64u << 20); /* over OFFER's bound: refused from the header */
    assert_int_equal(baton__frame_head(hdr, sizeof(hdr), &type, &length, NULL), BATON_ETOOBIG);
    const uint8_t junk[] = "GET / HTTP/1.1\r\n";
    assert_int_equal(baton__frame_head(junk, 1, &type, &length, NULL), BATON_EPROTO);
}

/* The decoder's contract on any input: 0 with a sane frame, 1 without consuming, or an error.
 * Fixed seed; bounded by count AND time so a loaded machine cannot stall the suite. */
static void check_any(const uint8_t *p, size_t len)
{
    baton__frame_t f;
    size_t c = (size_t)-1;
    const char *why = NULL;
    int rc = baton__frame_decode(p, len, &f, &c, &why);
    if (rc == 0) {
        assert_true(c >= BATON__FRAME_HDR && c <= len);
        assert_true(f.type >= 1 && f.type <= BATON__F_MAX_TYPE);
        if (f.type == BATON__F_OFFER) {
            for (uint32_t i = 0; i < f.u.offer.n_pages; i++) {
                baton__offer_page_t pg;
                baton__offer_page(&f.u.offer, i, &pg);
                assert_true(pg.len > 0 && pg.addr != 0);
            }
        }
        if (f.type == BATON__F_HELLO)
            for (int i = 0; i < f.u.hello.n_tp; i++)
                assert_true(f.u.hello.tp[i].blob + f.u.hello.tp[i].len <= p + len);
    } else if (rc == 1) {
        assert_int_equal(c, (size_t)-1);
    } else {
        assert_true(rc == BATON_EPROTO || rc == BATON_ETOOBIG);
        assert_non_null(why);
    }
}

static void test_fuzz(void **state)
{
    baton_buf_t seeds[9];
    make_fn mk[] = {mk_hello, mk_offer,      mk_done,  mk_mem,      mk_lane_hello,
                    mk_write, mk_layer_done, mk_grant, mk_read_done};
    for (int i = 0; i < 9; i++) {
        seeds[i] = (baton_buf_t)BATON_BUF_INIT;
        mk[i](&seeds[i]);
    }
    uint8_t *scratch = malloc(1 << 16);
    assert_non_null(scratch);
    double t0 = now_s();
    int iters = 0, accepted = 0;
    for (; iters < 100000 && now_s() - t0 < 20.0; iters++) {
        size_t len;
        int mode = (int)(rnd() % 4);
        if (mode == 0) { /* pure random bytes, sometimes with a valid magic/version prefix */
            len = rnd() % 256;
            for (size_t i = 0; i < len; i++)
                scratch[i] = (uint8_t)rnd();
            if (len >= 8 && (rnd() & 1)) {
                put32(scratch, BATON__WIRE_MAGIC);
                scratch[4] = 1;
                scratch[5] = 0;
                scratch[6] = (uint8_t)(1 + rnd() % BATON__F_MAX_TYPE);
                scratch[7] = 0;
            }
        } else { /* mutate a valid frame: flip bytes, truncate, or extend */
            baton_buf_t *s = &seeds[rnd() % 9];
            len = s->len;
            memcpy(scratch, s->data, len);
            int flips = 1 + (int)(rnd() % 4);
            for (int k = 0; k < flips; k++)
                scratch[rnd() % len] ^= (uint8_t)(1u << (rnd() % 8));
            if (mode == 2)
                len = rnd() % (len + 1);
            else if (mode == 3) {
                size_t extra = rnd() % 64;
                for (size_t i = 0; i < extra; i++)
                    scratch[len + i] = (uint8_t)rnd();
                len += extra;
            }
        }
        check_any(scratch, len);
        baton__frame_t f;
        size_t c;
        accepted += baton__frame_decode(scratch, len, &f, &c, NULL) == 0;
    }
    print_message("fuzz: %d iterations, %d accepted, %.2fs\n", iters, accepted, now_s() - t0);
    assert_true(iters >= 1000);
    free(scratch);
    for (int i = 0; i < 9; i++)
        baton_buf_free(&seeds[i]);
}

/* LAYER_DONE (proto 2): round trip, every prefix incomplete, header and length refusals, and
 * random mutations of it never crash the decoder; an accepted LAYER_DONE has its one size. */
static void test_layer_done(void **state)
{
    baton_buf_t b = BATON_BUF_INIT;
    mk_layer_done(&b);
    assert_int_equal(baton__enc_layer_done(&b, 1, 0), 0);
    assert_int_equal(baton__enc_layer_done(&b, UINT64_MAX, UINT32_MAX), 0);
    assert_int_equal(b.len, 3 * (BATON__FRAME_HDR + 12));
    const uint8_t *p = (const uint8_t *)b.data;
    const uint64_t rooms[] = {0x1122334455667788ull, 1, UINT64_MAX};
    const uint32_t layers[] = {63, 0, UINT32_MAX};
    for (int i = 0; i < 3; i++) {
        baton__frame_t f;
        size_t c;
        const uint8_t *q = p + (size_t)i * (BATON__FRAME_HDR + 12);
        size_t left = b.len - (size_t)i * (BATON__FRAME_HDR + 12);
        assert_int_equal(baton__frame_decode(q, left, &f, &c, NULL), 0);
        assert_int_equal(f.type, BATON__F_LAYER_DONE);
        assert_int_equal(c, BATON__FRAME_HDR + 12);
        assert_true(f.u.layer_done.room == rooms[i]);
        assert_int_equal(f.u.layer_done.layer, layers[i]);
        for (size_t n = 0; n < c; n++)
            assert_int_equal(baton__frame_decode(q, n, &f, &c, NULL), 1);
    }
    assert_string_equal(baton__ftype_name(BATON__F_LAYER_DONE), "LAYER_DONE");
    assert_string_equal(baton__ftype_name(BATON__F_MAX_TYPE + 1), "?");
    baton_buf_free(&b);

    expect_refused(mk_layer_done, 0, 4, 0xDEADBEEF);            /* magic */
    expect_refused(mk_layer_done, 4, 2, 2);                     /* version */
    expect_refused(mk_layer_done, 6, 1, 0);                     /* type */
    expect_refused(mk_layer_done, 6, 1, BATON__F_MAX_TYPE + 1); /* type */
    expect_refused(mk_layer_done, 7, 1, 1);                     /* flags */
    expect_refused(mk_layer_done, 8, 4, 0);                     /* length */
    expect_refused(mk_layer_done, 8, 4, 11);                    /* length under */
    expect_refused(mk_layer_done, 8, 4, 13);                    /* length over */
    expect_refused(mk_layer_done, 8, 4, 0xFFFFFFFF);            /* length */
    expect_refused(mk_layer_done, 12, 4, 1);                    /* reserved */

    /* A LAYER_DONE body under another type's header is refused by that type's bounds. */
    baton_buf_t x = BATON_BUF_INIT;
    mk_layer_done(&x);
    ((uint8_t *)x.data)[6] = BATON__F_WACK; /* 8-byte body */
    baton__frame_t f;
    size_t c;
    assert_true(decode(&x, &f, &c) < 0);
    baton_buf_free(&x);

    /* Bounded fuzz of mutations of a LAYER_DONE. */
    uint8_t scratch[64];
    baton_buf_t seed = BATON_BUF_INIT;
    mk_layer_done(&seed);
    int accepted = 0;
    for (int it = 0; it < 20000; it++) {
        size_t len = seed.len;
        memcpy(scratch, seed.data, len);
        int flips = 1 + (int)(rnd() % 3);
        for (int k = 0; k < flips; k++)
            scratch[rnd() % len] ^= (uint8_t)(1u << (rnd() % 8));
        if (rnd() & 1)
            len = rnd() % (len + 1);
        check_any(scratch, len);
        if (baton__frame_decode(scratch, len, &f, &c, NULL) == 0 && f.type == BATON__F_LAYER_DONE) {
            accepted++;
            assert_int_equal(c, BATON__FRAME_HDR + 12); /* its only valid size */
        }
    }
    print_message("layer_done fuzz: %d accepted of 20000\n", accepted);
    baton_buf_free(&seed);
}

static void mk_auth(baton_buf_t *b)
{
    baton__auth_t a;
    memset(&a, 0, sizeof(a));
    a.step = BATON__AUTH_RESPONSE;
    strcpy(a.engine_id, "prefill-7");
    a.incarnation = 0x0102030405060708ull;
    a.generation = 0x1112131415161718ull;
    for (int i = 0; i < BATON__AUTH_NONCE; i++)
        a.nonce[i] = (uint8_t)(i + 1);
    for (int i = 0; i < BATON__AUTH_MAC; i++)
        a.mac[i] = (uint8_t)(0xF0 ^ i);
    assert_int_equal(baton__enc_auth(b, &a), 0);
}

/* AUTH (the KV bootstrap's challenge-response): exact round trip, every byte needed, every field
 * checked. Body: step, id_len, id, inc, gen, nonce[32], mac[32]. */
static void test_auth(void **state)
{
    baton_buf_t b = BATON_BUF_INIT;
    mk_auth(&b);
    size_t body = 1 + 1 + 9 + 8 + 8 + BATON__AUTH_NONCE + BATON__AUTH_MAC;
    assert_int_equal(b.len, BATON__FRAME_HDR + body);
    baton__frame_t f;
    size_t c;
    assert_int_equal(decode(&b, &f, &c), 0);
    assert_int_equal(c, b.len);
    assert_int_equal(f.type, BATON__F_AUTH);
    assert_int_equal(f.u.auth.step, BATON__AUTH_RESPONSE);
    assert_string_equal(f.u.auth.engine_id, "prefill-7");
    assert_true(f.u.auth.incarnation == 0x0102030405060708ull);
    assert_true(f.u.auth.generation == 0x1112131415161718ull);
    assert_int_equal(f.u.auth.nonce[31], 32);
    assert_int_equal(f.u.auth.mac[31], 0xF0 ^ 31);
    for (size_t n = 0; n < c; n++)
        assert_int_equal(baton__frame_decode((const uint8_t *)b.data, n, &f, &c, NULL), 1);
    assert_string_equal(baton__ftype_name(BATON__F_AUTH), "AUTH");
    baton_buf_free(&b);

    const size_t h = BATON__FRAME_HDR;
    expect_refused(mk_auth, h, 1, 0);                      /* step */
    expect_refused(mk_auth, h, 1, 4);                      /* step */
    expect_refused(mk_auth, h + 1, 1, 0);                  /* id length */
    expect_refused(mk_auth, h + 1, 1, 10);                 /* id length past its bytes */
    expect_refused(mk_auth, h + 2, 1, ' ');                /* id not printable */
    expect_refused(mk_auth, h + 11, 8, 0);                 /* incarnation */
    expect_refused(mk_auth, h + 19, 8, 0);                 /* generation */
    expect_refused(mk_auth, 8, 4, (uint32_t)body - 1);     /* length under */
    expect_refused(mk_auth, 8, 4, 82 + BATON__ID_MAX + 1); /* longer than any AUTH */
    expect_refused(mk_auth, 8, 4, 82);                     /* shorter than any AUTH */

    /* The encoder refuses what the decoder would. */
    baton__auth_t a;
    memset(&a, 0, sizeof(a));
    a.step = 0;
    strcpy(a.engine_id, "x");
    assert_int_equal(baton__enc_auth(&b, &a), BATON_EINVAL);
    a.step = BATON__AUTH_CHALLENGE;
    a.engine_id[0] = '\0';
    assert_int_equal(baton__enc_auth(&b, &a), BATON_EINVAL);
    assert_int_equal(b.len, 0);
    baton_buf_free(&b);
}

/* A byte stream split at random points decodes into the same frames. */
static void test_stream_reassembly(void **state)
{
    baton_buf_t stream = BATON_BUF_INIT;
    for (int i = 0; i < 50; i++) {
        assert_int_equal(baton__enc_heartbeat(&stream, (uint64_t)i, 0), 0);
        if (i % 7 == 0)
            make_offer(&stream, 3, 5);
        if (i % 5 == 0)
            make_hello(&stream);
    }
    baton_buf_t acc = BATON_BUF_INIT;
    size_t pos = 0;
    int frames = 0, heartbeats = 0;
    while (pos < stream.len) {
        size_t n = 1 + rnd() % 97;
        if (n > stream.len - pos)
            n = stream.len - pos;
        assert_int_equal(baton_buf_append(&acc, stream.data + pos, n), 0);
        pos += n;
        for (;;) {
            baton__frame_t f;
            size_t c;
            int rc = baton__frame_decode((const uint8_t *)acc.data, acc.len, &f, &c, NULL);
            assert_true(rc >= 0);
            if (rc == 1)
                break;
            if (f.type == BATON__F_HEARTBEAT)
                assert_int_equal(f.u.heartbeat.seq, heartbeats++);
            frames++;
            baton_buf_consume(&acc, c);
        }
    }
    assert_int_equal(heartbeats, 50);
    assert_int_equal(frames, 50 + 8 + 10);
    assert_int_equal(acc.len, 0);
    baton_buf_free(&acc);
    baton_buf_free(&stream);
}

/* GRANT and READ_DONE (proto 4, pull by RDMA READ): round trips, every prefix incomplete, and
 * the fields a broken peer could send refused (no page, a count that does not match the body, a
 * page without address / length / region, a payload past the body, a positive status). */
static void test_grant_read_done(void **state)
{
    (void)state;
    baton_buf_t b = BATON_BUF_INIT;
    mk_grant(&b);
    mk_read_done(&b);
    baton__frame_t f;
    size_t c;
    const uint8_t *p = (const uint8_t *)b.data;
    assert_int_equal(baton__frame_decode(p, b.len, &f, &c, NULL), 0);
    assert_int_equal(f.type, BATON__F_GRANT);
    assert_true(f.u.grant.done.room == 0x0102030405060708ull);
    assert_int_equal(f.u.grant.done.status, -7);
    assert_int_equal(f.u.grant.done.first_token, 4242);
    assert_int_equal(f.u.grant.done.payload_len, 2);
    assert_memory_equal(f.u.grant.done.payload, "kv", 2);
    assert_int_equal(f.u.grant.n_pages, 2);
    for (uint32_t i = 0; i < 2; i++) {
        baton__offer_page_t pg;
        baton__grant_page(&f.u.grant, i, &pg);
        assert_true(pg.addr == grant_pages[i].addr);
        assert_int_equal(pg.len, grant_pages[i].len);
        assert_int_equal(pg.mem_id, grant_pages[i].mem_id);
    }
    for (size_t n = 0; n < c; n++)
        assert_int_equal(baton__frame_decode(p, n, &f, &c, NULL), 1);
    size_t first = BATON__FRAME_HDR + 22 + 2 + 4 + 2 * 16;
    assert_int_equal(baton__frame_decode(p, first, &f, &c, NULL), 0);
    assert_int_equal(c, first);
    assert_int_equal(baton__frame_decode(p + first, b.len - first, &f, &c, NULL), 0);
    assert_int_equal(f.type, BATON__F_READ_DONE);
    assert_true(f.u.read_done.room == 99);
    assert_int_equal(f.u.read_done.status, BATON_EABORTED);
    assert_string_equal(baton__ftype_name(BATON__F_GRANT), "GRANT");
    assert_string_equal(baton__ftype_name(BATON__F_READ_DONE), "READ_DONE");
    baton_buf_free(&b);

    const size_t body = BATON__FRAME_HDR;
    expect_refused(mk_grant, body + 20, 2, 3);          /* payload length past the pages */
    expect_refused(mk_grant, body + 24, 4, 0);          /* no page */
    expect_refused(mk_grant, body + 24, 4, 3);          /* more pages than the body holds */
    expect_refused(mk_grant, body + 24, 4, 200000);     /* over the page limit */
    expect_refused(mk_grant, body + 28, 8, 0);          /* page address 0 */
    expect_refused(mk_grant, body + 36, 4, 0);          /* page length 0 */
    expect_refused(mk_grant, body + 40, 4, 0);          /* page region 0 */
    expect_refused(mk_grant, body + 44, 8, UINT64_MAX); /* page past the address space */
    expect_refused(mk_read_done, body + 8, 4, 5);       /* positive status */
    expect_refused(mk_read_done, 8, 4, 13);             /* length */
    assert_int_equal(baton__enc_grant(&b, 1, 0, 0, NULL, 0, 0, grant_pages), BATON_EINVAL);
    baton_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_offer_first_page),
        cmocka_unit_test(test_truncated_frames_are_incomplete),
        cmocka_unit_test(test_every_field_out_of_range),
        cmocka_unit_test(test_early_garbage),
        cmocka_unit_test(test_head_before_body),
        cmocka_unit_test(test_fuzz),
        cmocka_unit_test(test_stream_reassembly),
        cmocka_unit_test(test_layer_done),
        cmocka_unit_test(test_auth),
        cmocka_unit_test(test_grant_read_done),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
