/* frame.c — bootstrap frame codec (format in frame.h). */
#include "worker/frame.h"

#include "baton/error.h"

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static void put_u64(uint8_t *p, uint64_t v)
{
    put_u32(p, (uint32_t)(v >> 32));
    put_u32(p + 4, (uint32_t)v);
}

static uint32_t get_u32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static uint64_t get_u64(const uint8_t *p)
{
    return ((uint64_t)get_u32(p) << 32) | get_u32(p + 4);
}

static size_t payload_size(int type)
{
    switch (type) {
    case WK_FRAME_WAIT:
        return 8;
    case WK_FRAME_DONE:
        return 20;
    case WK_FRAME_ABORT:
        return 12;
    default:
        return 0;
    }
}

const char *wk_frame_type_name(int type)
{
    switch (type) {
    case WK_FRAME_WAIT:
        return "WAIT";
    case WK_FRAME_DONE:
        return "DONE";
    case WK_FRAME_ABORT:
        return "ABORT";
    default:
        return "?";
    }
}

size_t wk_frame_encode(const wk_frame_t *f, uint8_t *out)
{
    size_t n = payload_size(f->type);
    out[0] = 'B';
    out[1] = 'T';
    out[2] = WK_FRAME_VERSION;
    out[3] = (uint8_t)f->type;
    put_u32(out + 4, (uint32_t)n);
    uint8_t *p = out + WK_FRAME_HEADER;
    put_u64(p, f->room);
    if (f->type == WK_FRAME_DONE) {
        put_u32(p + 8, (uint32_t)f->status);
        put_u32(p + 12, f->prompt_tokens);
        put_u32(p + 16, (uint32_t)f->first_token);
    } else if (f->type == WK_FRAME_ABORT) {
        put_u32(p + 8, (uint32_t)f->status);
    }
    return WK_FRAME_HEADER + n;
}

int wk_frame_decode(const uint8_t *buf, size_t len, wk_frame_t *f, const char **why)
{
    /* Check what is there as early as possible so garbage is refused without waiting. */
    if (len >= 1 && buf[0] != 'B')
        goto bad_magic;
    if (len >= 2 && buf[1] != 'T')
        goto bad_magic;
    if (len >= 3 && buf[2] != WK_FRAME_VERSION) {
        *why = "unsupported version";
        return BATON_EPROTO;
    }
    if (len >= 4 && payload_size(buf[3]) == 0) {
        *why = "unknown frame type";
        return BATON_EPROTO;
    }
    if (len < WK_FRAME_HEADER)
        return 0;
    int type = buf[3];
    uint32_t plen = get_u32(buf + 4);
    if (plen != payload_size(type)) {
        *why = "wrong payload length";
        return BATON_EPROTO;
    }
    if (len < WK_FRAME_HEADER + plen)
        return 0;
    const uint8_t *p = buf + WK_FRAME_HEADER;
    f->type = (wk_frame_type_t)type;
    f->room = get_u64(p);
    f->status = 0;
    f->prompt_tokens = 0;
    f->first_token = -1;
    if (type == WK_FRAME_DONE) {
        f->status = (int32_t)get_u32(p + 8);
        f->prompt_tokens = get_u32(p + 12);
        f->first_token = (int32_t)get_u32(p + 16);
    } else if (type == WK_FRAME_ABORT) {
        f->status = (int32_t)get_u32(p + 8);
    }
    return (int)(WK_FRAME_HEADER + plen);
bad_magic:
    *why = "bad magic";
    return BATON_EPROTO;
}
