/* head.c — an HTTP message head: arena, offset table, limits, finalize and the trailer guard. */
#include "http/head.h"

#define NO_VALUE UINT32_MAX

typedef struct hdr_off_s {
    uint32_t name;
    uint32_t value;
} hdr_off_t;

void baton__http_head_begin(baton__http_head_t *h, size_t max_bytes, size_t max_headers)
{
    baton_buf_reset(&h->arena);
    baton_buf_reset(&h->hdrs);
    h->n_hdrs = 0;
    h->bytes = 0;
    h->max_bytes = max_bytes;
    h->max_headers = max_headers;
    h->in_field = 0;
    h->done = 0;
}

static int count(baton__http_head_t *h, size_t len)
{
    h->bytes += len;
    return h->bytes > h->max_bytes ? BATON__HEAD_TOO_LARGE : 0;
}

int baton__http_head_append(baton__http_head_t *h, const char *at, size_t len)
{
    if (count(h, len) != 0)
        return BATON__HEAD_TOO_LARGE;
    return baton_buf_append(&h->arena, at, len) == 0 ? 0 : BATON__HEAD_NOMEM;
}

int baton__http_head_field(baton__http_head_t *h, const char *at, size_t len)
{
    if (h->done) /* a trailer: counted, dropped */
        return count(h, len);
    if (!h->in_field) {
        if (h->n_hdrs >= h->max_headers)
            return BATON__HEAD_TOO_MANY;
        hdr_off_t o = {(uint32_t)h->arena.len, NO_VALUE};
        if (baton_buf_append(&h->hdrs, &o, sizeof(o)) != 0)
            return BATON__HEAD_NOMEM;
        h->n_hdrs++;
        h->in_field = 1;
        if (count(h, 4) != 0) /* ": " and CRLF */
            return BATON__HEAD_TOO_LARGE;
    }
    return baton__http_head_append(h, at, len);
}

int baton__http_head_field_done(baton__http_head_t *h)
{
    if (h->done)
        return 0;
    h->in_field = 0;
    return baton__http_head_append(h, "", 1);
}

/* The value of the last header starts here when it has not started yet. */
static void value_start(baton__http_head_t *h)
{
    hdr_off_t *o = (hdr_off_t *)h->hdrs.data + (h->n_hdrs - 1);
    if (o->value == NO_VALUE)
        o->value = (uint32_t)h->arena.len;
}

int baton__http_head_value(baton__http_head_t *h, const char *at, size_t len)
{
    if (h->done)
        return count(h, len);
    if (h->n_hdrs == 0) /* llhttp reports no value before a name; kept safe all the same */
        return count(h, len);
    value_start(h);
    return baton__http_head_append(h, at, len);
}

int baton__http_head_value_done(baton__http_head_t *h)
{
    if (h->done || h->n_hdrs == 0)
        return 0;
    value_start(h);
    return baton__http_head_append(h, "", 1);
}

int baton__http_head_finish(baton__http_head_t *h, const baton_http_header_t **headers_p,
                            size_t *n_p)
{
    /* The pointers go after the offsets, aligned, in the same buffer. */
    size_t n = h->n_hdrs;
    size_t off_bytes = n * sizeof(hdr_off_t);
    size_t align = (off_bytes + 15) & ~(size_t)15;
    if (baton_buf_reserve(&h->hdrs, align - off_bytes + n * sizeof(baton_http_header_t) + 16) != 0)
        return BATON__HEAD_NOMEM;
    const char *base = h->arena.data ? h->arena.data : "";
    const hdr_off_t *offs = (const hdr_off_t *)h->hdrs.data;
    baton_http_header_t *hs = (baton_http_header_t *)(h->hdrs.data + align);
    for (size_t i = 0; i < n; i++) {
        hs[i].name = base + offs[i].name;
        hs[i].value = offs[i].value == NO_VALUE ? "" : base + offs[i].value;
    }
    h->done = 1;
    *headers_p = n ? hs : NULL;
    *n_p = n;
    return 0;
}
