/* test_store_proto.c — baton-store's control frames: every field round-trips, and the decoder
 * refuses truncation at every length, bad headers, oversized bodies, hostile counts, NULs in
 * strings, reply slices outside the table and trailing bytes; NODE_READ and its binary answer.
 * With an argument (a directory) it writes the fuzz harness's seed frames there. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/proto.h"

static baton__sp_item_t items[3];
static baton__sp_ritem_t ritems[2];
static baton__slice_t slices[3];
static baton__sp_node_t nodes[2];

static baton__sp_msg_t sample(uint8_t type)
{
    baton__sp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = type;
    m.req_id = 77;
    strcpy(m.id, "client-1");
    strcpy(m.ns, "modelA");
    strcpy(m.host, "127.0.0.1");
    m.flags = BATON_STORE_PUT_SOFT_PIN;
    m.replicas = 2;
    m.xfer_port = 4000;
    m.ctrl_port = 4001;
    m.seg_bytes = 1ull << 40;
    m.node = 3;
    m.seg = 4;
    m.export_key = 0xfeedfacecafebeefull;
    m.status = BATON_STORE_ENOSPACE;
    m.prefix = 1;
    memset(m.nonce, 0xab, sizeof(m.nonce));
    memset(m.mac, 0xcd, sizeof(m.mac));
    strcpy(items[0].key, "k0");
    items[0].x = 4096;
    items[0].y = 0xE3069283u;
    strcpy(items[1].key, "key-1");
    memset(items[2].key, 'z', BATON_STORE_KEY_MAX);
    items[2].key[BATON_STORE_KEY_MAX] = '\0';
    m.n_items = 3;
    m.items = items;
    ritems[0] = (baton__sp_ritem_t){0, 4096, 7, 9, 10000, 1, 2, 0};
    ritems[1] = (baton__sp_ritem_t){BATON_XFER_ENOTFOUND, 0, 0, 0, 0, 1, 1, 2};
    m.n_ritems = 2;
    m.ritems = ritems;
    slices[0] = (baton__slice_t){1, 2, 0, 2048};
    slices[1] = (baton__slice_t){2, 3, 4096, 2048};
    slices[2] = (baton__slice_t){0, 0, 64, 1};
    m.n_slices = 3;
    m.slices = slices;
    nodes[0] = (baton__sp_node_t){1, "10.0.0.1", 5000, 5001};
    nodes[1] = (baton__sp_node_t){2, "host-b", 6000, 6001};
    m.n_nodes = 2;
    m.nodes = nodes;
    m.text = "{\"ok\":1}";
    m.text_len = 8;
    return m;
}

static void test_roundtrip(void **state)
{
    (void)state;
    baton__sp_msg_t m = sample(BATON__SP_REPLY), d;
    baton_buf_t b = BATON_BUF_INIT;
    assert_int_equal(baton__sp_encode(&b, &m), 0);
    size_t flen;
    assert_int_equal(baton__sp_frame_check((uint8_t *)b.data, b.len, BATON__SP_REPLY_MAX, &flen),
                     0);
    assert_int_equal(flen, b.len);
    assert_int_equal(baton__sp_decode((uint8_t *)b.data, b.len, BATON__SP_REPLY_MAX, &d), 0);
    assert_int_equal(d.type, BATON__SP_REPLY);
    assert_int_equal(d.req_id, 77);
    assert_string_equal(d.id, "client-1");
    assert_string_equal(d.ns, "modelA");
    assert_string_equal(d.host, "127.0.0.1");
    assert_int_equal(d.flags, BATON_STORE_PUT_SOFT_PIN);
    assert_int_equal(d.replicas, 2);
    assert_int_equal(d.xfer_port, 4000);
    assert_int_equal(d.ctrl_port, 4001);
    assert_int_equal(d.seg_bytes, 1ull << 40);
    assert_int_equal(d.node, 3);
    assert_int_equal(d.seg, 4);
    assert_int_equal(d.export_key, 0xfeedfacecafebeefull);
    assert_int_equal(d.status, BATON_STORE_ENOSPACE);
    assert_int_equal(d.prefix, 1);
    assert_memory_equal(d.nonce, m.nonce, BATON__SP_NONCE);
    assert_memory_equal(d.mac, m.mac, BATON__SP_MAC);
    assert_int_equal(d.n_items, 3);
    assert_string_equal(d.items[2].key, items[2].key);
    assert_int_equal(d.items[0].x, 4096);
    assert_int_equal(d.items[0].y, 0xE3069283u);
    assert_int_equal(d.n_ritems, 2);
    assert_memory_equal(&d.ritems[0], &ritems[0], sizeof(ritems[0]));
    assert_int_equal(d.ritems[1].status, BATON_XFER_ENOTFOUND);
    assert_int_equal(d.n_slices, 3);
    assert_memory_equal(d.slices, slices, sizeof(slices));
    assert_int_equal(d.n_nodes, 2);
    assert_string_equal(d.nodes[1].host, "host-b");
    assert_int_equal(d.nodes[1].ctrl_port, 6001);
    assert_string_equal(d.text, "{\"ok\":1}");
    /* Every shorter prefix is refused (needs more, or malformed), never read past. */
    for (size_t n = 0; n < b.len; n++) {
        baton__sp_msg_t x;
        assert_int_not_equal(baton__sp_decode((uint8_t *)b.data, n, BATON__SP_REPLY_MAX, &x), 0);
    }
    baton__sp_msg_free(&d);
    baton_buf_free(&b);
}

static void patch_le(baton_buf_t *b, size_t at, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        b->data[at + (size_t)i] = (char)(uint8_t)(v >> (8 * i));
}

static void test_refusals(void **state)
{
    (void)state;
    baton__sp_msg_t m = sample(BATON__SP_GET), d;
    baton_buf_t b = BATON_BUF_INIT;
    assert_int_equal(baton__sp_encode(&b, &m), 0);
    size_t flen;
    /* header: magic, version, type, reserved, body over the limit */
    baton_buf_t c = BATON_BUF_INIT;
    baton_buf_append(&c, b.data, b.len);
    c.data[0] ^= 1;
    assert_int_equal(baton__sp_frame_check((uint8_t *)c.data, c.len, BATON__SP_REQ_MAX, &flen),
                     BATON_XFER_EPROTO);
    c.data[0] ^= 1;
    c.data[4] = 2;
    assert_int_equal(baton__sp_frame_check((uint8_t *)c.data, c.len, BATON__SP_REQ_MAX, &flen),
                     BATON_XFER_EPROTO);
    c.data[4] = 1;
    c.data[5] = 99;
    assert_int_equal(baton__sp_frame_check((uint8_t *)c.data, c.len, BATON__SP_REQ_MAX, &flen),
                     BATON_XFER_EPROTO);
    c.data[5] = BATON__SP_GET;
    c.data[6] = 1;
    assert_int_equal(baton__sp_frame_check((uint8_t *)c.data, c.len, BATON__SP_REQ_MAX, &flen),
                     BATON_XFER_EPROTO);
    c.data[6] = 0;
    patch_le(&c, 12, BATON__SP_REQ_MAX + 1, 4);
    assert_int_equal(baton__sp_frame_check((uint8_t *)c.data, c.len, BATON__SP_REQ_MAX, &flen),
                     BATON_XFER_ETOOBIG);
    assert_int_equal(baton__sp_frame_check((uint8_t *)c.data, 15, BATON__SP_REQ_MAX, &flen), 1);
    baton_buf_free(&c);

    /* a trailing byte (body length grown by one) */
    baton_buf_append(&c, b.data, b.len);
    baton_buf_append(&c, "x", 1);
    patch_le(&c, 12, b.len - BATON__SP_HDR + 1, 4);
    assert_int_equal(baton__sp_decode((uint8_t *)c.data, c.len, BATON__SP_REQ_MAX, &d),
                     BATON_XFER_EPROTO);
    baton_buf_free(&c);

    /* a NUL inside the first key: after the header, the id "client-1", ns "modelA" and host
     * "127.0.0.1" (str8), 44 bytes of fixed fields, nonce and mac, the item count, the key. */
    size_t items_at = 16 + 9 + 7 + 10 + 44 + 64;
    baton_buf_append(&c, b.data, b.len);
    assert_int_equal((uint8_t)c.data[items_at], 3);
    assert_int_equal((uint8_t)c.data[items_at + 2], 2); /* "k0" */
    c.data[items_at + 4] = '\0';
    assert_int_equal(baton__sp_decode((uint8_t *)c.data, c.len, BATON__SP_REQ_MAX, &d),
                     BATON_XFER_EPROTO);
    baton_buf_free(&c);

    /* a hostile item count: more than the batch limit, and more than the bytes left */
    baton_buf_append(&c, b.data, b.len);
    patch_le(&c, items_at, BATON_STORE_BATCH_MAX + 1, 2);
    assert_int_equal(baton__sp_decode((uint8_t *)c.data, c.len, BATON__SP_REQ_MAX, &d),
                     BATON_XFER_EPROTO);
    patch_le(&c, items_at, 1000, 2);
    assert_int_equal(baton__sp_decode((uint8_t *)c.data, c.len, BATON__SP_REQ_MAX, &d),
                     BATON_XFER_EPROTO);
    baton_buf_free(&c);
    baton_buf_free(&b);

    /* a reply item whose slices run past the table */
    m = sample(BATON__SP_REPLY);
    ritems[1].first_slice = 3;
    assert_int_equal(baton__sp_encode(&b, &m), 0);
    assert_int_equal(baton__sp_decode((uint8_t *)b.data, b.len, BATON__SP_REPLY_MAX, &d),
                     BATON_XFER_EPROTO);
    baton_buf_free(&b);
    ritems[1].first_slice = 2;

    /* the encoder refuses what the decoder would */
    m = sample(BATON__SP_GET);
    m.n_items = BATON_STORE_BATCH_MAX + 1;
    assert_int_equal(baton__sp_encode(&b, &m), BATON_XFER_EINVAL);
    m = sample(BATON__SP_GET);
    memset(m.host, 'h', sizeof(m.host) - 1);
    m.host[sizeof(m.host) - 1] = '\0';
    assert_int_equal(baton__sp_encode(&b, &m), 0); /* 64 bytes: the limit */
    baton_buf_free(&b);
}

/* NODE_READ and its answer: slices out, the bytes back as the reply's text — binary, NULs
 * included, up to the text's bound —, and the hostile shapes of both refused. */
static void test_node_read(void **state)
{
    (void)state;
    baton__sp_msg_t m, d;
    memset(&m, 0, sizeof(m));
    m.type = BATON__SP_NODE_READ;
    m.req_id = 9;
    baton__slice_t sl[2] = {{0, 0, 4096, 4096}, {0, 0, 1ull << 40, 1}};
    m.n_slices = 2;
    m.slices = sl;
    baton_buf_t b = BATON_BUF_INIT;
    assert_int_equal(baton__sp_encode(&b, &m), 0);
    assert_int_equal(baton__sp_decode((uint8_t *)b.data, b.len, BATON__SP_REQ_MAX, &d), 0);
    assert_int_equal(d.type, BATON__SP_NODE_READ);
    assert_string_equal(baton__sp_type_name(d.type), "node_read");
    assert_int_equal(d.n_slices, 2);
    assert_memory_equal(d.slices, sl, sizeof(sl));
    baton__sp_msg_free(&d);
    /* a slice count beyond the bytes left, and beyond the table's limit */
    size_t slices_at = b.len - 2 * 24 - 4 - 6;
    assert_int_equal((uint8_t)b.data[slices_at], 2);
    patch_le(&b, slices_at, 3, 4);
    assert_int_equal(baton__sp_decode((uint8_t *)b.data, b.len, BATON__SP_REQ_MAX, &d),
                     BATON_XFER_EPROTO);
    patch_le(&b, slices_at, 0xffffffffu, 4);
    assert_int_equal(baton__sp_decode((uint8_t *)b.data, b.len, BATON__SP_REQ_MAX, &d),
                     BATON_XFER_EPROTO);
    baton_buf_free(&b);

    /* the answer: 64 KiB of every byte value, NULs included, exactly back */
    size_t n = BATON__SP_INLINE_DEFAULT;
    char *bytes = malloc(n);
    assert_non_null(bytes);
    for (size_t i = 0; i < n; i++)
        bytes[i] = (char)(i * 7);
    memset(&m, 0, sizeof(m));
    m.type = BATON__SP_REPLY;
    m.req_id = 9;
    m.text = bytes;
    m.text_len = (uint32_t)n;
    assert_int_equal(baton__sp_encode(&b, &m), 0);
    assert_int_equal(baton__sp_decode((uint8_t *)b.data, b.len, BATON__SP_REPLY_MAX, &d), 0);
    assert_int_equal(d.text_len, n);
    assert_memory_equal(d.text, bytes, n);
    baton__sp_msg_free(&d);
    /* a reader bounded below the frame refuses it from the header (the client's inline bound) */
    size_t flen;
    assert_int_equal(baton__sp_frame_check((uint8_t *)b.data, b.len, (uint32_t)n, &flen),
                     BATON_XFER_ETOOBIG);
    /* a text length past the frame's end, and above the text's bound */
    size_t text_at = b.len - n - 4;
    patch_le(&b, text_at, n + 1, 4);
    assert_int_equal(baton__sp_decode((uint8_t *)b.data, b.len, BATON__SP_REPLY_MAX, &d),
                     BATON_XFER_EPROTO);
    patch_le(&b, text_at, BATON__SP_TEXT_MAX + 1, 4);
    assert_int_equal(baton__sp_decode((uint8_t *)b.data, b.len, BATON__SP_REPLY_MAX, &d),
                     BATON_XFER_EPROTO);
    /* a text shorter than the bytes left: trailing bytes */
    patch_le(&b, text_at, n - 1, 4);
    assert_int_equal(baton__sp_decode((uint8_t *)b.data, b.len, BATON__SP_REPLY_MAX, &d),
                     BATON_XFER_EPROTO);
    baton_buf_free(&b);
    /* the encoder refuses a text above its bound */
    m.text_len = BATON__SP_TEXT_MAX + 1;
    assert_int_equal(baton__sp_encode(&b, &m), BATON_XFER_EINVAL);
    baton_buf_free(&b);
    free(bytes);
}

static void write_seeds(const char *dir)
{
    uint8_t types[] = {BATON__SP_AUTH_CHALLENGE, BATON__SP_PUT_START, BATON__SP_GET,
                       BATON__SP_NODE_WRITE,     BATON__SP_NODE_READ, BATON__SP_REPLY};
    for (size_t i = 0; i < sizeof(types); i++) {
        baton__sp_msg_t m = sample(types[i]);
        baton_buf_t b = BATON_BUF_INIT;
        if (baton__sp_encode(&b, &m) != 0)
            exit(2);
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", dir, baton__sp_type_name(types[i]));
        FILE *f = fopen(path, "wb");
        if (f == NULL || fwrite(b.data, 1, b.len, f) != b.len || fclose(f) != 0)
            exit(2);
        baton_buf_free(&b);
    }
}

int main(int argc, char **argv)
{
    if (argc == 2) {
        write_seeds(argv[1]);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_node_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
