/* fuzz/fuzz_store_proto.c — libFuzzer harness for baton-store's control-frame decoder: a byte
 * stream is split into frames as a master's connection reads them (header judged first, with the
 * request limit); every frame the decoder accepts is encoded again and must give the same bytes. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "store/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t off = 0;
    while (off < size) {
        size_t flen = 0;
        int rc = baton__sp_frame_check(data + off, size - off, BATON__SP_REQ_MAX, &flen);
        if (rc != 0)
            break; /* need more bytes, or refused from the header */
        CHECK(flen >= BATON__SP_HDR);
        if (flen > size - off)
            break;
        baton__sp_msg_t m;
        if (baton__sp_decode(data + off, flen, BATON__SP_REQ_MAX, &m) == 0) {
            baton_buf_t out = BATON_BUF_INIT;
            CHECK(baton__sp_encode(&out, &m) == 0);
            CHECK(out.len == flen);
            CHECK(memcmp(out.data, data + off, flen) == 0);
            baton__sp_msg_t again;
            CHECK(baton__sp_decode((const uint8_t *)out.data, out.len, BATON__SP_REQ_MAX, &again) ==
                  0);
            CHECK(again.n_items == m.n_items && again.n_slices == m.n_slices);
            baton__sp_msg_free(&again);
            baton_buf_free(&out);
            baton__sp_msg_free(&m);
        }
        off += flen;
    }
    return 0;
}
