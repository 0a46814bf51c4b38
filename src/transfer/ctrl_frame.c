/* transfer/ctrl_frame.c — encode and bounds-checked decode of control and lane frames. */
#include "transfer/ctrl_frame.h"

#include <string.h>

#include "baton/error.h"

/* ---- little-endian cursor --------------------------------------------------------------- */

typedef struct {
    const uint8_t *p;
    size_t left;
    int bad; /* a read ran past the end */
} rd_t;

static uint64_t get_le(rd_t *r, int n)
{
    if (r->bad || r->left < (size_t)n) {
        r->bad = 1;
        return 0;
    }
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | r->p[i];
    r->p += n;
    r->left -= (size_t)n;
    return v;
}

static uint8_t get8(rd_t *r)
{
    return (uint8_t)get_le(r, 1);
}
static uint16_t get16(rd_t *r)
{
    return (uint16_t)get_le(r, 2);
}
static uint32_t get32(rd_t *r)
{
    return (uint32_t)get_le(r, 4);
}
static uint64_t get64(rd_t *r)
{
    return get_le(r, 8);
}

static const uint8_t *get_bytes(rd_t *r, size_t n)
{
    if (r->bad || r->left < n) {
        r->bad = 1;
        return NULL;
    }
    const uint8_t *p = r->p;
    r->p += n;
    r->left -= n;
    return p;
}

/* DONE's fixed fields, which GRANT starts with too (the payload is the caller's: its length
 * rule differs). */
static void get_done_head(rd_t *r, baton__done_t *d)
{
    d->room = get64(r);
    d->status = (int32_t)get32(r);
    d->first_token = (int64_t)get64(r);
    d->payload_len = get16(r);
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) {
        p[i] = (uint8_t)(v & 0xff);
        v >>= 8;
    }
}

/* ---- per-type body bounds --------------------------------------------------------------- */

#define HELLO_FIXED (2 + 1 + 1 + 8 + 8 + 8 + 4 + 4 + 1)
#define HELLO_MAX   (HELLO_FIXED + BATON__ID_MAX + BATON__HELLO_MAX_TP * (3 + BATON__BLOB_MAX))
#define OFFER_FIXED 24
#define DONE_FIXED  22
#define MEM_FIXED   24
#define AUTH_FIXED  (1 + 1 + 8 + 8 + BATON__AUTH_NONCE + BATON__AUTH_MAC)

static int body_bounds(int type, uint32_t *min_p, uint32_t *max_p)
{
    uint32_t lo, hi;
    switch (type) {
    case BATON__F_HELLO:
        lo = HELLO_FIXED + 1;
        hi = HELLO_MAX;
        break;
    case BATON__F_OFFER:
        lo = OFFER_FIXED + BATON__OFFER_PAGE_BYTES;
        hi = OFFER_FIXED + BATON__OFFER_MAX_PAGES * BATON__OFFER_PAGE_BYTES + 4;
        break;
    case BATON__F_DONE:
        lo = DONE_FIXED;
        hi = DONE_FIXED + BATON__DONE_MAX;
        break;
    case BATON__F_ABORT:
        lo = hi = 12;
        break;
    case BATON__F_ABORT_ACK:
        lo = hi = 8;
        break;
    case BATON__F_HEARTBEAT:
        lo = hi = 16;
        break;
    case BATON__F_MEM:
        lo = MEM_FIXED;
        hi = MEM_FIXED + BATON__BLOB_MAX;
        break;
    case BATON__F_MEM_DEL:
        lo = hi = 4;
        break;
    case BATON__F_LANE_HELLO:
        lo = hi = 20;
        break;
    case BATON__F_LANE_ACK:
        lo = hi = 8;
        break;
    case BATON__F_WRITE:
        lo = BATON__WRITE_FIXED + 1;
        hi = BATON__WRITE_FIXED + BATON__WRITE_DATA_MAX;
        break;
    case BATON__F_WACK:
        lo = hi = 8;
        break;
    case BATON__F_LAYER_DONE:
        lo = hi = 12;
        break;
    case BATON__F_AUTH:
        lo = AUTH_FIXED + 1;
        hi = AUTH_FIXED + BATON__ID_MAX;
        break;
    case BATON__F_GRANT:
        lo = DONE_FIXED + 4 + BATON__OFFER_PAGE_BYTES;
        hi = DONE_FIXED + BATON__DONE_MAX + 4 + BATON__OFFER_MAX_PAGES * BATON__OFFER_PAGE_BYTES;
        break;
    case BATON__F_READ_DONE:
        lo = hi = 12;
        break;
    default:
        return -1;
    }
    *min_p = lo;
    *max_p = hi;
    return 0;
}

#define FAIL(code, reason)                                                                         \
    do {                                                                                           \
        if (why)                                                                                   \
            *why = (reason);                                                                       \
        return (code);                                                                             \
    } while (0)

static int id_char_ok(uint8_t c)
{
    return c > 0x20 && c < 0x7f;
}

/* u8 length, then that many printable bytes: into id (BATON__ID_MAX + 1). NULL, or why not. */
static const char *get_engine_id(rd_t *r, char *id_out)
{
    uint8_t id_len = get8(r);
    if (id_len == 0 || id_len > BATON__ID_MAX)
        return "bad engine id length";
    const uint8_t *id = get_bytes(r, id_len);
    if (id == NULL)
        return "truncated engine id";
    for (int i = 0; i < id_len; i++)
        if (!id_char_ok(id[i]))
            return "engine id not printable";
    memcpy(id_out, id, id_len);
    id_out[id_len] = '\0';
    return NULL;
}

static int decode_auth(rd_t *r, baton__auth_t *a, const char **why)
{
    a->step = get8(r);
    if (a->step < BATON__AUTH_CHALLENGE || a->step > BATON__AUTH_PROOF)
        FAIL(BATON_EPROTO, "auth: unknown step");
    const char *id_why = get_engine_id(r, a->engine_id);
    if (id_why != NULL)
        FAIL(BATON_EPROTO, id_why);
    a->incarnation = get64(r);
    a->generation = get64(r);
    const uint8_t *nonce = get_bytes(r, BATON__AUTH_NONCE);
    const uint8_t *mac = get_bytes(r, BATON__AUTH_MAC);
    if (nonce == NULL || mac == NULL)
        FAIL(BATON_EPROTO, "auth: truncated");
    if (a->incarnation == 0 || a->generation == 0)
        FAIL(BATON_EPROTO, "auth: zero incarnation or generation");
    memcpy(a->nonce, nonce, BATON__AUTH_NONCE);
    memcpy(a->mac, mac, BATON__AUTH_MAC);
    return 0;
}

static int decode_hello(rd_t *r, baton__hello_t *h, const char **why)
{
    memset(h, 0, sizeof(*h));
    h->proto = get16(r);
    h->role = get8(r);
    if (h->proto < 1)
        FAIL(BATON_EPROTO, "hello: protocol version 0");
    if (h->role != BATON__ROLE_DECODE && h->role != BATON__ROLE_PREFILL)
        FAIL(BATON_EPROTO, "hello: bad role");
    const char *id_why = get_engine_id(r, h->engine_id);
    if (id_why != NULL)
        FAIL(BATON_EPROTO, id_why);
    h->incarnation = get64(r);
    h->generation = get64(r);
    h->echo_generation = get64(r);
    h->heartbeat_ms = get32(r);
    h->status = (int32_t)get32(r);
    h->n_tp = get8(r);
    if (r->bad)
        FAIL(BATON_EPROTO, "hello: truncated");
    if (h->incarnation == 0 || h->generation == 0)
        FAIL(BATON_EPROTO, "hello: zero incarnation or generation");
    if (h->heartbeat_ms == 0 || h->heartbeat_ms > 3600000)
        FAIL(BATON_EPROTO, "hello: heartbeat interval out of range");
    if (h->status > 0)
        FAIL(BATON_EPROTO, "hello: positive status");
    if (h->n_tp > BATON__HELLO_MAX_TP)
        FAIL(BATON_EPROTO, "hello: too many transports");
    for (int i = 0; i < h->n_tp; i++) {
        h->tp[i].id = get8(r);
        h->tp[i].len = get16(r);
        if (r->bad)
            FAIL(BATON_EPROTO, "hello: truncated transport");
        if (h->tp[i].id < 1 || h->tp[i].id > 3)
            FAIL(BATON_EPROTO, "hello: unknown transport");
        for (int j = 0; j < i; j++)
            if (h->tp[j].id == h->tp[i].id)
                FAIL(BATON_EPROTO, "hello: duplicate transport");
        if (h->tp[i].len > BATON__BLOB_MAX)
            FAIL(BATON_EPROTO, "hello: transport blob too long");
        h->tp[i].blob = get_bytes(r, h->tp[i].len);
        if (h->tp[i].blob == NULL)
            FAIL(BATON_EPROTO, "hello: truncated transport blob");
    }
    if (r->left != 0)
        FAIL(BATON_EPROTO, "hello: trailing bytes");
    return 0;
}

static int decode_offer(rd_t *r, baton__offer_t *o, const char **why)
{
    o->room = get64(r);
    o->incarnation = get64(r);
    o->n_layers = get32(r);
    o->pages_per_layer = get32(r);
    if (r->bad)
        FAIL(BATON_EPROTO, "offer: truncated");
    if (o->incarnation == 0)
        FAIL(BATON_EPROTO, "offer: zero incarnation");
    if (o->n_layers == 0 || o->pages_per_layer == 0)
        FAIL(BATON_EPROTO, "offer: no pages");
    uint64_t n = (uint64_t)o->n_layers * o->pages_per_layer;
    if (n > BATON__OFFER_MAX_PAGES)
        FAIL(BATON_ETOOBIG, "offer: too many pages");
    o->first_page = 0;
    if (r->left != n * BATON__OFFER_PAGE_BYTES) {
        /* proto 3: a trailing first_page, the pages before it not offered. A page is 16 bytes,
         * so the 4 extra bytes tell the two forms apart. */
        if (r->left % BATON__OFFER_PAGE_BYTES != 4)
            FAIL(BATON_EPROTO, "offer: length does not match the page count");
        rd_t t = {r->p + r->left - 4, 4, 0};
        o->first_page = get32(&t);
        if (o->first_page == 0 || o->first_page >= o->pages_per_layer)
            FAIL(BATON_EPROTO, "offer: first_page out of range");
        n = (uint64_t)o->n_layers * (o->pages_per_layer - o->first_page);
        if (r->left - 4 != n * BATON__OFFER_PAGE_BYTES)
            FAIL(BATON_EPROTO, "offer: length does not match the page count");
    }
    o->n_pages = (uint32_t)n;
    o->pages_raw = r->p;
    for (uint32_t i = 0; i < o->n_pages; i++) {
        uint64_t addr = get64(r);
        uint32_t len = get32(r);
        (void)get32(r); /* mem_id: any value; the receiver checks it against MEM frames */
        if (addr == 0 || len == 0)
            FAIL(BATON_EPROTO, "offer: null page address or empty page");
        if (addr > UINT64_MAX - len)
            FAIL(BATON_EPROTO, "offer: page wraps the address space");
    }
    if (o->first_page != 0)
        (void)get32(r);
    return 0;
}

int baton__frame_head(const uint8_t *buf, size_t len, uint8_t *type_p, uint32_t *length_p,
                      const char **why)
{
    if (why)
        *why = "";
    if (len < BATON__FRAME_HDR) {
        /* Refuse garbage as early as possible: the magic is checkable byte by byte. */
        static const uint8_t magic[4] = {0x42, 0x41, 0x54, 0x4E};
        for (size_t i = 0; i < len && i < 4; i++)
            if (buf[i] != magic[i])
                FAIL(BATON_EPROTO, "bad magic");
        return 1;
    }
    rd_t r = {buf, BATON__FRAME_HDR, 0};
    uint32_t magic = get32(&r);
    uint16_t version = get16(&r);
    uint8_t type = get8(&r);
    uint8_t flags = get8(&r);
    uint32_t length = get32(&r);
    uint32_t reserved = get32(&r);
    if (magic != BATON__WIRE_MAGIC)
        FAIL(BATON_EPROTO, "bad magic");
    if (version != BATON__WIRE_VERSION)
        FAIL(BATON_EPROTO, "unsupported wire version");
    uint32_t lo, hi;
    if (body_bounds(type, &lo, &hi) != 0)
        FAIL(BATON_EPROTO, "unknown frame type");
    if (flags != 0 || reserved != 0)
        FAIL(BATON_EPROTO, "reserved bits set");
    if (length > hi)
        FAIL(BATON_ETOOBIG, "frame longer than its type allows");
    if (length < lo)
        FAIL(BATON_EPROTO, "frame shorter than its type needs");
    *type_p = type;
    *length_p = length;
    return 0;
}

int baton__frame_decode(const uint8_t *buf, size_t len, baton__frame_t *f, size_t *consumed,
                        const char **why)
{
    uint8_t type;
    uint32_t length;
    int hrc = baton__frame_head(buf, len, &type, &length, why);
    if (hrc != 0)
        return hrc;
    rd_t r;
    size_t body = type == BATON__F_WRITE ? BATON__WRITE_FIXED : length;
    if (len - BATON__FRAME_HDR < body)
        return 1;

    memset(f, 0, sizeof(*f));
    f->type = type;
    f->length = length;
    r.p = buf + BATON__FRAME_HDR;
    r.left = body;
    r.bad = 0;
    int rc = 0;
    switch (type) {
    case BATON__F_HELLO:
        rc = decode_hello(&r, &f->u.hello, why);
        break;
    case BATON__F_OFFER:
        rc = decode_offer(&r, &f->u.offer, why);
        break;
    case BATON__F_DONE: {
        baton__done_t *d = &f->u.done;
        get_done_head(&r, d);
        if (r.bad || d->payload_len > BATON__DONE_MAX || r.left != d->payload_len)
            FAIL(BATON_EPROTO, "done: payload length mismatch");
        d->payload = get_bytes(&r, d->payload_len);
        break;
    }
    case BATON__F_ABORT:
        f->u.abort.room = get64(&r);
        f->u.abort.reason = (int32_t)get32(&r);
        if (f->u.abort.reason > 0)
            FAIL(BATON_EPROTO, "abort: positive reason");
        break;
    case BATON__F_ABORT_ACK:
        f->u.abort_ack.room = get64(&r);
        break;
    case BATON__F_HEARTBEAT:
        f->u.heartbeat.seq = get64(&r);
        f->u.heartbeat.sent_ms = get64(&r);
        break;
    case BATON__F_MEM: {
        baton__mem_t *m = &f->u.mem;
        m->mem_id = get32(&r);
        m->kind = get8(&r);
        m->base = get64(&r);
        m->len = get64(&r);
        m->transport = get8(&r);
        m->blob_len = get16(&r);
        if (r.bad)
            FAIL(BATON_EPROTO, "mem: truncated");
        if (m->mem_id == 0)
            FAIL(BATON_EPROTO, "mem: zero id");
        if (m->kind > 1)
            FAIL(BATON_EPROTO, "mem: unknown kind");
        if (m->base == 0 || m->len == 0 || m->base > UINT64_MAX - m->len)
            FAIL(BATON_EPROTO, "mem: bad range");
        if (m->transport < 1 || m->transport > 3)
            FAIL(BATON_EPROTO, "mem: unknown transport");
        if (m->blob_len > BATON__BLOB_MAX || r.left != m->blob_len)
            FAIL(BATON_EPROTO, "mem: blob length mismatch");
        m->blob = get_bytes(&r, m->blob_len);
        break;
    }
    case BATON__F_MEM_DEL:
        f->u.mem_del.mem_id = get32(&r);
        if (f->u.mem_del.mem_id == 0)
            FAIL(BATON_EPROTO, "mem_del: zero id");
        break;
    case BATON__F_LANE_HELLO:
        f->u.lane_hello.incarnation = get64(&r);
        f->u.lane_hello.generation = get64(&r);
        f->u.lane_hello.lane = get32(&r);
        if (f->u.lane_hello.incarnation == 0 || f->u.lane_hello.generation == 0)
            FAIL(BATON_EPROTO, "lane_hello: zero incarnation or generation");
        if (f->u.lane_hello.lane >= 64)
            FAIL(BATON_EPROTO, "lane_hello: lane index out of range");
        break;
    case BATON__F_LANE_ACK:
        f->u.lane_ack.lane = get32(&r);
        f->u.lane_ack.status = (int32_t)get32(&r);
        if (f->u.lane_ack.lane >= 64 || f->u.lane_ack.status > 0)
            FAIL(BATON_EPROTO, "lane_ack: field out of range");
        break;
    case BATON__F_WRITE: {
        baton__write_t *w = &f->u.write;
        w->room = get64(&r);
        w->addr = get64(&r);
        w->page = get32(&r);
        w->seq = get32(&r);
        w->data_len = length - BATON__WRITE_FIXED;
        if (w->addr == 0 || w->addr > UINT64_MAX - w->data_len)
            FAIL(BATON_EPROTO, "write: bad address");
        break;
    }
    case BATON__F_WACK:
        f->u.wack.seq = get32(&r);
        f->u.wack.status = (int32_t)get32(&r);
        if (f->u.wack.status > 0)
            FAIL(BATON_EPROTO, "wack: positive status");
        break;
    case BATON__F_AUTH:
        rc = decode_auth(&r, &f->u.auth, why);
        break;
    case BATON__F_LAYER_DONE:
        f->u.layer_done.room = get64(&r);
        f->u.layer_done.layer = get32(&r);
        /* n_layers of an OFFER is a u32 too; whether the layer exists is the room's check. */
        break;
    case BATON__F_GRANT: {
        baton__grant_t *g = &f->u.grant;
        get_done_head(&r, &g->done);
        if (r.bad || g->done.payload_len > BATON__DONE_MAX || r.left < g->done.payload_len + 4u)
            FAIL(BATON_EPROTO, "grant: payload length mismatch");
        g->done.payload = get_bytes(&r, g->done.payload_len);
        g->n_pages = get32(&r);
        if (g->n_pages == 0 || g->n_pages > BATON__OFFER_MAX_PAGES ||
            r.left != (size_t)g->n_pages * BATON__OFFER_PAGE_BYTES)
            FAIL(BATON_EPROTO, "grant: page count mismatch");
        g->pages_raw = get_bytes(&r, r.left);
        for (uint32_t i = 0; i < g->n_pages; i++) {
            baton__offer_page_t pg;
            baton__grant_page(g, i, &pg);
            if (pg.addr == 0 || pg.len == 0 || pg.mem_id == 0 || pg.addr > UINT64_MAX - pg.len)
                FAIL(BATON_EPROTO, "grant: bad page");
        }
        break;
    }
    case BATON__F_READ_DONE:
        f->u.read_done.room = get64(&r);
        f->u.read_done.status = (int32_t)get32(&r);
        if (f->u.read_done.status > 0)
            FAIL(BATON_EPROTO, "read_done: positive status");
        break;
    }
    if (rc != 0)
        return rc;
    if (r.bad || r.left != 0)
        FAIL(BATON_EPROTO, "body length mismatch");
    *consumed = BATON__FRAME_HDR + body;
    return 0;
}

/* Page i of a validated page array (OFFER and GRANT lay pages out alike). */
static void read_page(const uint8_t *pages_raw, uint32_t i, baton__offer_page_t *page)
{
    rd_t r = {pages_raw + (size_t)i * BATON__OFFER_PAGE_BYTES, BATON__OFFER_PAGE_BYTES, 0};
    page->addr = get64(&r);
    page->len = get32(&r);
    page->mem_id = get32(&r);
}

void baton__grant_page(const baton__grant_t *g, uint32_t i, baton__offer_page_t *page)
{
    read_page(g->pages_raw, i, page);
}

void baton__offer_page(const baton__offer_t *o, uint32_t i, baton__offer_page_t *page)
{
    read_page(o->pages_raw, i, page);
}

/* ---- encoders --------------------------------------------------------------------------- */

static void put_hdr(uint8_t *p, int type, uint32_t length)
{
    put_le(p, BATON__WIRE_MAGIC, 4);
    put_le(p + 4, BATON__WIRE_VERSION, 2);
    p[6] = (uint8_t)type;
    p[7] = 0;
    put_le(p + 8, length, 4);
    put_le(p + 12, 0, 4);
}

/* Reserves a frame of `body` bytes at the end of out and returns a pointer to its body. */
static uint8_t *frame_begin(baton_buf_t *out, int type, size_t body)
{
    if (baton_buf_reserve(out, BATON__FRAME_HDR + body) != 0)
        return NULL;
    uint8_t *p = (uint8_t *)out->data + out->len;
    put_hdr(p, type, (uint32_t)body);
    out->len += BATON__FRAME_HDR + body;
    out->data[out->len] = '\0';
    return p + BATON__FRAME_HDR;
}

typedef struct {
    uint8_t *p;
} wr_t;

static void w8(wr_t *w, uint64_t v)
{
    put_le(w->p, v, 1);
    w->p += 1;
}
static void w16(wr_t *w, uint64_t v)
{
    put_le(w->p, v, 2);
    w->p += 2;
}
static void w32(wr_t *w, uint64_t v)
{
    put_le(w->p, v, 4);
    w->p += 4;
}
static void w64(wr_t *w, uint64_t v)
{
    put_le(w->p, v, 8);
    w->p += 8;
}
static void wbytes(wr_t *w, const void *b, size_t n)
{
    if (n)
        memcpy(w->p, b, n);
    w->p += n;
}

/* DONE's fields (GRANT's first ones too). */
static void put_done(wr_t *w, uint64_t room, int32_t status, int64_t first_token,
                     const uint8_t *payload, uint16_t payload_len)
{
    w64(w, room);
    w32(w, (uint32_t)status);
    w64(w, (uint64_t)first_token);
    w16(w, payload_len);
    wbytes(w, payload, payload_len);
}

/* An OFFER's or GRANT's page array. */
static void put_pages(wr_t *w, const baton__offer_page_t *pages, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++) {
        w64(w, pages[i].addr);
        w32(w, pages[i].len);
        w32(w, pages[i].mem_id);
    }
}

int baton__enc_hello(baton_buf_t *out, const baton__hello_t *h)
{
    size_t id_len = strlen(h->engine_id);
    if (id_len == 0 || id_len > BATON__ID_MAX || h->n_tp > BATON__HELLO_MAX_TP)
        return BATON_EINVAL;
    size_t body = HELLO_FIXED + id_len;
    for (int i = 0; i < h->n_tp; i++) {
        if (h->tp[i].len > BATON__BLOB_MAX)
            return BATON_EINVAL;
        body += 3 + h->tp[i].len;
    }
    uint8_t *p = frame_begin(out, BATON__F_HELLO, body);
    if (p == NULL)
        return BATON_ENOMEM;
    wr_t w = {p};
    w16(&w, h->proto);
    w8(&w, h->role);
    w8(&w, id_len);
    wbytes(&w, h->engine_id, id_len);
    w64(&w, h->incarnation);
    w64(&w, h->generation);
    w64(&w, h->echo_generation);
    w32(&w, h->heartbeat_ms);
    w32(&w, (uint32_t)h->status);
    w8(&w, h->n_tp);
    for (int i = 0; i < h->n_tp; i++) {
        w8(&w, h->tp[i].id);
        w16(&w, h->tp[i].len);
        wbytes(&w, h->tp[i].blob, h->tp[i].len);
    }
    return 0;
}

int baton__enc_offer(baton_buf_t *out, uint64_t room, uint64_t incarnation, uint32_t n_layers,
                     uint32_t pages_per_layer, const baton__offer_page_t *pages)
{
    return baton__enc_offer_from(out, room, incarnation, n_layers, pages_per_layer, 0, pages);
}

int baton__enc_offer_from(baton_buf_t *out, uint64_t room, uint64_t incarnation, uint32_t n_layers,
                          uint32_t pages_per_layer, uint32_t first_page,
                          const baton__offer_page_t *pages)
{
    if ((uint64_t)n_layers * pages_per_layer > BATON__OFFER_MAX_PAGES ||
        first_page >= pages_per_layer)
        return BATON_EINVAL;
    uint64_t n = (uint64_t)n_layers * (pages_per_layer - first_page);
    if (n == 0)
        return BATON_EINVAL;
    uint8_t *p = frame_begin(out, BATON__F_OFFER,
                             OFFER_FIXED + n * BATON__OFFER_PAGE_BYTES + (first_page ? 4 : 0));
    if (p == NULL)
        return BATON_ENOMEM;
    wr_t w = {p};
    w64(&w, room);
    w64(&w, incarnation);
    w32(&w, n_layers);
    w32(&w, pages_per_layer);
    put_pages(&w, pages, n);
    if (first_page != 0)
        w32(&w, first_page);
    return 0;
}

int baton__enc_done(baton_buf_t *out, uint64_t room, int32_t status, int64_t first_token,
                    const uint8_t *payload, uint16_t payload_len)
{
    if (payload_len > BATON__DONE_MAX)
        return BATON_EINVAL;
    uint8_t *p = frame_begin(out, BATON__F_DONE, DONE_FIXED + payload_len);
    if (p == NULL)
        return BATON_ENOMEM;
    wr_t w = {p};
    put_done(&w, room, status, first_token, payload, payload_len);
    return 0;
}

int baton__enc_grant(baton_buf_t *out, uint64_t room, int32_t status, int64_t first_token,
                     const uint8_t *payload, uint16_t payload_len, uint32_t n_pages,
                     const baton__offer_page_t *pages)
{
    if (payload_len > BATON__DONE_MAX || n_pages == 0 || n_pages > BATON__OFFER_MAX_PAGES)
        return BATON_EINVAL;
    uint8_t *p =
        frame_begin(out, BATON__F_GRANT,
                    DONE_FIXED + payload_len + 4 + (uint64_t)n_pages * BATON__OFFER_PAGE_BYTES);
    if (p == NULL)
        return BATON_ENOMEM;
    wr_t w = {p};
    put_done(&w, room, status, first_token, payload, payload_len);
    w32(&w, n_pages);
    put_pages(&w, pages, n_pages);
    return 0;
}

int baton__enc_read_done(baton_buf_t *out, uint64_t room, int32_t status)
{
    uint8_t *p = frame_begin(out, BATON__F_READ_DONE, 12);
    if (p == NULL)
        return BATON_ENOMEM;
    wr_t w = {p};
    w64(&w, room);
    w32(&w, (uint32_t)(status > 0 ? -status : status));
    return 0;
}

int baton__enc_abort(baton_buf_t *out, uint64_t room, int32_t reason)
{
    uint8_t *p = frame_begin(out, BATON__F_ABORT, 12);
    if (p == NULL)
        return BATON_ENOMEM;
    wr_t w = {p};
    w64(&w, room);
    w32(&w, (uint32_t)(reason > 0 ? -reason : reason));
    return 0;
}

int baton__enc_abort_ack(baton_buf_t *out, uint64_t room)
{
    uint8_t *p = frame_begin(out, BATON__F_ABORT_ACK, 8);
    if (p == NULL)
        return BATON_ENOMEM;
    wr_t w = {p};
    w64(&w, room);
    return 0;
}

int baton__enc_heartbeat(baton_buf_t *out, uint64_t seq, uint64_t sent_ms)
{
    uint8_t *p = frame_begin(out, BATON__F_HEARTBEAT, 16);
    if (p == NULL)
        return BATON_ENOMEM;
    wr_t w = {p};
    w64(&w, seq);
    w64(&w, sent_ms);
    return 0;
}

int baton__enc_mem(baton_buf_t *out, const baton__mem_t *m)
{
    if (m->blob_len > BATON__BLOB_MAX)
        return BATON_EINVAL;
    uint8_t *p = frame_begin(out, BATON__F_MEM, MEM_FIXED + m->blob_len);
    if (p == NULL)
        return BATON_ENOMEM;
    wr_t w = {p};
    w32(&w, m->mem_id);
    w8(&w, m->kind);
    w64(&w, m->base);
    w64(&w, m->len);
    w8(&w, m->transport);
    w16(&w, m->blob_len);
    wbytes(&w, m->blob, m->blob_len);
    return 0;
}

int baton__enc_mem_del(baton_buf_t *out, uint32_t mem_id)
{
    uint8_t *p = frame_begin(out, BATON__F_MEM_DEL, 4);
    if (p == NULL)
        return BATON_ENOMEM;
    wr_t w = {p};
    w32(&w, mem_id);
    return 0;
}

int baton__enc_auth(baton_buf_t *out, const baton__auth_t *a)
{
    size_t id_len = strlen(a->engine_id);
    if (id_len == 0 || id_len > BATON__ID_MAX || a->step < BATON__AUTH_CHALLENGE ||
        a->step > BATON__AUTH_PROOF)
        return BATON_EINVAL;
    uint8_t *p = frame_begin(out, BATON__F_AUTH, AUTH_FIXED + id_len);
    if (p == NULL)
        return BATON_ENOMEM;
    wr_t w = {p};
    w8(&w, a->step);
    w8(&w, id_len);
    wbytes(&w, a->engine_id, id_len);
    w64(&w, a->incarnation);
    w64(&w, a->generation);
    wbytes(&w, a->nonce, BATON__AUTH_NONCE);
    wbytes(&w, a->mac, BATON__AUTH_MAC);
    return 0;
}

int baton__enc_lane_hello(baton_buf_t *out, uint64_t incarnation, uint64_t generation,
                          uint32_t lane)
{
    uint8_t *p = frame_begin(out, BATON__F_LANE_HELLO, 20);
    if (p == NULL)
        return BATON_ENOMEM;
    wr_t w = {p};
    w64(&w, incarnation);
    w64(&w, generation);
    w32(&w, lane);
    return 0;
}

int baton__enc_lane_ack(baton_buf_t *out, uint32_t lane, int32_t status)
{
    uint8_t *p = frame_begin(out, BATON__F_LANE_ACK, 8);
    if (p == NULL)
        return BATON_ENOMEM;
    wr_t w = {p};
    w32(&w, lane);
    w32(&w, (uint32_t)status);
    return 0;
}

int baton__enc_wack(baton_buf_t *out, uint32_t seq, int32_t status)
{
    uint8_t *p = frame_begin(out, BATON__F_WACK, 8);
    if (p == NULL)
        return BATON_ENOMEM;
    wr_t w = {p};
    w32(&w, seq);
    w32(&w, (uint32_t)status);
    return 0;
}

int baton__enc_layer_done(baton_buf_t *out, uint64_t room, uint32_t layer)
{
    uint8_t *p = frame_begin(out, BATON__F_LAYER_DONE, 12);
    if (p == NULL)
        return BATON_ENOMEM;
    wr_t w = {p};
    w64(&w, room);
    w32(&w, layer);
    return 0;
}

void baton__enc_write_hdr(uint8_t out[BATON__WRITE_HDR], uint64_t room, uint64_t addr,
                          uint32_t page, uint32_t seq, uint32_t data_len)
{
    put_hdr(out, BATON__F_WRITE, BATON__WRITE_FIXED + data_len);
    wr_t w = {out + BATON__FRAME_HDR};
    w64(&w, room);
    w64(&w, addr);
    w32(&w, page);
    w32(&w, seq);
}

void baton__enc_wack_fixed(uint8_t out[BATON__WACK_SIZE], uint32_t seq, int32_t status)
{
    put_hdr(out, BATON__F_WACK, 8);
    wr_t w = {out + BATON__FRAME_HDR};
    w32(&w, seq);
    w32(&w, (uint32_t)status);
}

const char *baton__ftype_name(int type)
{
    static const char *const names[] = {
        "?",         "HELLO",      "OFFER",   "DONE",       "ABORT",    "ABORT_ACK",
        "HEARTBEAT", "MEM",        "MEM_DEL", "LANE_HELLO", "LANE_ACK", "WRITE",
        "WACK",      "LAYER_DONE", "AUTH",    "GRANT",      "READ_DONE"};
    if (type < 1 || type > BATON__F_MAX_TYPE)
        return "?";
    return names[type];
}
