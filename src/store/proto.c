/* store/proto.c — the store's control frames: the encoder and the bounded decoder of the one
 * body layout (proto.h). */
#include <stdlib.h>
#include <string.h>

#include "store/proto.h"

/* ---- writer ---------------------------------------------------------------------------------- */

typedef struct {
    baton_buf_t *b;
    int rc;
} wr_t;

static void w_bytes(wr_t *w, const void *p, size_t n)
{
    if (w->rc == 0 && n)
        w->rc = baton_buf_append(w->b, p, n);
}

static void w_le(wr_t *w, uint64_t v, int bytes)
{
    uint8_t t[8];
    for (int i = 0; i < bytes; i++)
        t[i] = (uint8_t)(v >> (8 * i));
    w_bytes(w, t, (size_t)bytes);
}

static void w_str(wr_t *w, const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n > max || n > 255) {
        w->rc = BATON_XFER_EINVAL;
        return;
    }
    w_le(w, n, 1);
    w_bytes(w, s, n);
}

int baton__sp_encode(baton_buf_t *out, const baton__sp_msg_t *m)
{
    if (m->n_items > BATON_STORE_BATCH_MAX || m->n_ritems > BATON_STORE_BATCH_MAX ||
        m->n_slices > BATON__SP_SLICES_MAX || m->n_nodes > BATON__SP_NODES_MAX ||
        m->text_len > BATON__SP_TEXT_MAX)
        return BATON_XFER_EINVAL;
    size_t start = out->len;
    wr_t w = {out, 0};
    w_le(&w, BATON__SP_MAGIC, 4);
    w_le(&w, BATON__SP_VERSION, 1);
    w_le(&w, m->type, 1);
    w_le(&w, 0, 2);
    w_le(&w, m->req_id, 4);
    w_le(&w, 0, 4); /* body length, patched below */
    w_str(&w, m->id, BATON__SP_ID_MAX);
    w_str(&w, m->ns, BATON_STORE_NAMESPACE_MAX);
    w_str(&w, m->host, BATON__SP_HOST_MAX);
    w_le(&w, m->flags, 4);
    w_le(&w, m->replicas, 4);
    w_le(&w, m->xfer_port, 2);
    w_le(&w, m->ctrl_port, 2);
    w_le(&w, m->seg_bytes, 8);
    w_le(&w, m->node, 4);
    w_le(&w, m->seg, 4);
    w_le(&w, m->export_key, 8);
    w_le(&w, (uint32_t)m->status, 4);
    w_le(&w, m->prefix, 4);
    w_bytes(&w, m->nonce, BATON__SP_NONCE);
    w_bytes(&w, m->mac, BATON__SP_MAC);
    w_le(&w, m->n_items, 2);
    for (uint32_t i = 0; i < m->n_items; i++) {
        w_str(&w, m->items[i].key, BATON_STORE_KEY_MAX);
        w_le(&w, m->items[i].x, 8);
        w_le(&w, m->items[i].y, 4);
    }
    w_le(&w, m->n_ritems, 2);
    for (uint32_t i = 0; i < m->n_ritems; i++) {
        const baton__sp_ritem_t *r = &m->ritems[i];
        w_le(&w, (uint32_t)r->status, 4);
        w_le(&w, r->len, 8);
        w_le(&w, r->crc, 4);
        w_le(&w, r->put_id, 8);
        w_le(&w, r->lease_ms, 4);
        w_le(&w, r->n_replicas, 1);
        w_le(&w, r->n_slices, 1);
        w_le(&w, r->first_slice, 4);
    }
    w_le(&w, m->n_slices, 4);
    for (uint32_t i = 0; i < m->n_slices; i++) {
        w_le(&w, m->slices[i].node, 4);
        w_le(&w, m->slices[i].seg, 4);
        w_le(&w, m->slices[i].off, 8);
        w_le(&w, m->slices[i].len, 8);
    }
    w_le(&w, m->n_nodes, 2);
    for (uint32_t i = 0; i < m->n_nodes; i++) {
        w_le(&w, m->nodes[i].node, 4);
        w_str(&w, m->nodes[i].host, BATON__SP_HOST_MAX);
        w_le(&w, m->nodes[i].xfer_port, 2);
        w_le(&w, m->nodes[i].ctrl_port, 2);
    }
    w_le(&w, m->text_len, 4);
    w_bytes(&w, m->text, m->text_len);
    if (w.rc != 0) {
        out->len = start;
        return w.rc;
    }
    uint32_t body = (uint32_t)(out->len - start - BATON__SP_HDR);
    for (int i = 0; i < 4; i++)
        out->data[start + 12 + i] = (char)(uint8_t)(body >> (8 * i));
    return 0;
}

/* ---- reader ---------------------------------------------------------------------------------- */

typedef struct {
    const uint8_t *p;
    size_t left;
    int bad;
} rd_t;

static uint64_t r_le(rd_t *r, int bytes)
{
    if (r->bad || r->left < (size_t)bytes) {
        r->bad = 1;
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)r->p[i] << (8 * i);
    r->p += bytes;
    r->left -= (size_t)bytes;
    return v;
}

static void r_bytes(rd_t *r, void *out, size_t n)
{
    if (r->bad || r->left < n) {
        r->bad = 1;
        return;
    }
    memcpy(out, r->p, n);
    r->p += n;
    r->left -= n;
}

/* A str8 into out (room for max + 1): longer than max, or a NUL inside, is malformed. */
static void r_str(rd_t *r, char *out, size_t max)
{
    size_t n = (size_t)r_le(r, 1);
    out[0] = '\0';
    if (r->bad || n > max || r->left < n) {
        r->bad = 1;
        return;
    }
    if (memchr(r->p, '\0', n)) {
        r->bad = 1;
        return;
    }
    memcpy(out, r->p, n);
    out[n] = '\0';
    r->p += n;
    r->left -= n;
}

/* Allocates count elements only when the bytes left could hold them (each at least min_bytes
 * on the wire): a hostile count cannot make the decoder allocate more than the frame's size. */
static void *r_array(rd_t *r, uint32_t count, uint32_t limit, size_t min_bytes, size_t elem)
{
    if (r->bad || count > limit || (size_t)count * min_bytes > r->left) {
        r->bad = 1;
        return NULL;
    }
    if (count == 0)
        return NULL;
    void *a = calloc(count, elem);
    if (a == NULL)
        r->bad = 2;
    return a;
}

static int known_type(uint8_t t)
{
    return (t >= BATON__SP_AUTH_CHALLENGE && t <= BATON__SP_AUTH_PROOF) ||
           (t >= BATON__SP_PUT_START && t <= BATON__SP_STAT) ||
           (t >= BATON__SP_NODE_REGISTER && t <= BATON__SP_NODE_READ) || t == BATON__SP_REPLY;
}

int baton__sp_frame_check(const uint8_t *p, size_t n, uint32_t max_body, size_t *frame_len_p)
{
    if (n < BATON__SP_HDR)
        return 1;
    rd_t r = {p, n, 0};
    uint32_t magic = (uint32_t)r_le(&r, 4);
    uint8_t version = (uint8_t)r_le(&r, 1);
    uint8_t type = (uint8_t)r_le(&r, 1);
    uint16_t zero = (uint16_t)r_le(&r, 2);
    (void)r_le(&r, 4);
    uint32_t body = (uint32_t)r_le(&r, 4);
    if (magic != BATON__SP_MAGIC || version != BATON__SP_VERSION || !known_type(type) || zero)
        return BATON_XFER_EPROTO;
    if (body > max_body)
        return BATON_XFER_ETOOBIG;
    *frame_len_p = BATON__SP_HDR + (size_t)body;
    return 0;
}

void baton__sp_msg_free(baton__sp_msg_t *m)
{
    free(m->items);
    free(m->ritems);
    free(m->slices);
    free(m->nodes);
    free(m->text);
    m->items = NULL;
    m->ritems = NULL;
    m->slices = NULL;
    m->nodes = NULL;
    m->text = NULL;
    m->n_items = m->n_ritems = m->n_slices = m->n_nodes = m->text_len = 0;
}

int baton__sp_decode(const uint8_t *frame, size_t len, uint32_t max_body, baton__sp_msg_t *m)
{
    memset(m, 0, sizeof(*m));
    size_t flen;
    if (baton__sp_frame_check(frame, len, max_body, &flen) != 0 || flen != len)
        return BATON_XFER_EPROTO;
    m->type = frame[5];
    m->req_id = (uint32_t)frame[8] | (uint32_t)frame[9] << 8 | (uint32_t)frame[10] << 16 |
                (uint32_t)frame[11] << 24;
    rd_t r = {frame + BATON__SP_HDR, len - BATON__SP_HDR, 0};
    r_str(&r, m->id, BATON__SP_ID_MAX);
    r_str(&r, m->ns, BATON_STORE_NAMESPACE_MAX);
    r_str(&r, m->host, BATON__SP_HOST_MAX);
    m->flags = (uint32_t)r_le(&r, 4);
    m->replicas = (uint32_t)r_le(&r, 4);
    m->xfer_port = (uint16_t)r_le(&r, 2);
    m->ctrl_port = (uint16_t)r_le(&r, 2);
    m->seg_bytes = r_le(&r, 8);
    m->node = (uint32_t)r_le(&r, 4);
    m->seg = (uint32_t)r_le(&r, 4);
    m->export_key = r_le(&r, 8);
    m->status = (int32_t)(uint32_t)r_le(&r, 4);
    m->prefix = (uint32_t)r_le(&r, 4);
    r_bytes(&r, m->nonce, BATON__SP_NONCE);
    r_bytes(&r, m->mac, BATON__SP_MAC);

    uint32_t n = (uint32_t)r_le(&r, 2);
    m->items = r_array(&r, n, BATON_STORE_BATCH_MAX, 13, sizeof(*m->items));
    if (m->items)
        m->n_items = n;
    for (uint32_t i = 0; i < m->n_items && !r.bad; i++) {
        r_str(&r, m->items[i].key, BATON_STORE_KEY_MAX);
        m->items[i].x = r_le(&r, 8);
        m->items[i].y = (uint32_t)r_le(&r, 4);
    }
    n = (uint32_t)r_le(&r, 2);
    m->ritems = r_array(&r, n, BATON_STORE_BATCH_MAX, 34, sizeof(*m->ritems));
    if (m->ritems)
        m->n_ritems = n;
    for (uint32_t i = 0; i < m->n_ritems && !r.bad; i++) {
        baton__sp_ritem_t *x = &m->ritems[i];
        x->status = (int32_t)(uint32_t)r_le(&r, 4);
        x->len = r_le(&r, 8);
        x->crc = (uint32_t)r_le(&r, 4);
        x->put_id = r_le(&r, 8);
        x->lease_ms = (uint32_t)r_le(&r, 4);
        x->n_replicas = (uint8_t)r_le(&r, 1);
        x->n_slices = (uint8_t)r_le(&r, 1);
        x->first_slice = (uint32_t)r_le(&r, 4);
    }
    n = (uint32_t)r_le(&r, 4);
    m->slices = r_array(&r, n, BATON__SP_SLICES_MAX, 24, sizeof(*m->slices));
    if (m->slices)
        m->n_slices = n;
    for (uint32_t i = 0; i < m->n_slices && !r.bad; i++) {
        m->slices[i].node = (uint32_t)r_le(&r, 4);
        m->slices[i].seg = (uint32_t)r_le(&r, 4);
        m->slices[i].off = r_le(&r, 8);
        m->slices[i].len = r_le(&r, 8);
    }
    n = (uint32_t)r_le(&r, 2);
    m->nodes = r_array(&r, n, BATON__SP_NODES_MAX, 9, sizeof(*m->nodes));
    if (m->nodes)
        m->n_nodes = n;
    for (uint32_t i = 0; i < m->n_nodes && !r.bad; i++) {
        m->nodes[i].node = (uint32_t)r_le(&r, 4);
        r_str(&r, m->nodes[i].host, BATON__SP_HOST_MAX);
        m->nodes[i].xfer_port = (uint16_t)r_le(&r, 2);
        m->nodes[i].ctrl_port = (uint16_t)r_le(&r, 2);
    }
    n = (uint32_t)r_le(&r, 4);
    if (!r.bad && (n > BATON__SP_TEXT_MAX || n > r.left))
        r.bad = 1;
    if (!r.bad) {
        m->text = malloc((size_t)n + 1);
        if (m->text == NULL) {
            r.bad = 2;
        } else {
            r_bytes(&r, m->text, n);
            m->text[n] = '\0';
            m->text_len = n;
        }
    }
    /* A reply item's slices must lie inside the slice table. */
    for (uint32_t i = 0; i < m->n_ritems && !r.bad; i++) {
        const baton__sp_ritem_t *x = &m->ritems[i];
        uint64_t need = (uint64_t)x->n_replicas * x->n_slices;
        if (x->n_replicas > BATON_STORE_REPLICAS_MAX || x->first_slice > m->n_slices ||
            need > m->n_slices - x->first_slice)
            r.bad = 1;
    }
    if (!r.bad && r.left != 0)
        r.bad = 1; /* trailing bytes */
    if (r.bad) {
        int rc = r.bad == 2 ? BATON_XFER_ENOMEM : BATON_XFER_EPROTO;
        baton__sp_msg_free(m);
        return rc;
    }
    return 0;
}

const char *baton__sp_type_name(uint8_t type)
{
    switch (type) {
    case BATON__SP_AUTH_CHALLENGE:
        return "auth_challenge";
    case BATON__SP_AUTH_RESPONSE:
        return "auth_response";
    case BATON__SP_AUTH_PROOF:
        return "auth_proof";
    case BATON__SP_PUT_START:
        return "put_start";
    case BATON__SP_PUT_COMMIT:
        return "put_commit";
    case BATON__SP_PUT_REVOKE:
        return "put_revoke";
    case BATON__SP_GET:
        return "get";
    case BATON__SP_EXISTS:
        return "exists";
    case BATON__SP_REMOVE:
        return "remove";
    case BATON__SP_STAT:
        return "stat";
    case BATON__SP_NODE_REGISTER:
        return "node_register";
    case BATON__SP_NODE_HEARTBEAT:
        return "node_heartbeat";
    case BATON__SP_NODE_WRITE:
        return "node_write";
    case BATON__SP_NODE_READ:
        return "node_read";
    case BATON__SP_REPLY:
        return "reply";
    default:
        return "unknown";
    }
}
