/* store/client_data.c — the store client's data paths: put (export each slice, the node pulls it
 * into its segment, then commit or revoke) and get (offer the caller's buffer to the node holding
 * each slice, another replica on failure, then the checksum and the lease). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/buf.h"
#include "store/client_int.h"
#include "store/meta.h"

#define COMP "store"

/* ---- put --------------------------------------------------------------------------------------
 */

typedef struct {
    op_t *op;
    uint32_t obj;
    uint64_t key;
    int export_pending, reply_pending;
    int status;
} swrite_t;

typedef struct {
    op_t *op;
    uint32_t *idx; /* the op's object of each item */
    int revoke;
} finish_call_t;

static void on_finish_reply(void *data, int status, baton__sp_msg_t *r)
{
    finish_call_t *fc = data;
    op_t *op = fc->op;
    if (status == 0 && r->status != 0)
        status = r->status;
    /* A commit that did not go through leaves the object uncommitted: the master takes it over
     * after its put timeout. A revoke changes nothing the caller sees. */
    for (uint32_t j = 0; !fc->revoke && fc->idx[j] != UINT32_MAX; j++) {
        int st = status;
        if (st == 0)
            st = j < r->n_ritems ? r->ritems[j].status : BATON_XFER_EPROTO;
        op->o[fc->idx[j]].status = st;
    }
    free(fc->idx);
    free(fc);
    if (--op->pending == 0)
        baton__op_finish(op, 0);
}

/* Commits the objects whose every slice landed, revokes the others that got a put id. */
static void finish_put(op_t *op)
{
    op->pending = 1; /* guard */
    for (int revoke = 0; revoke < 2; revoke++) {
        finish_call_t *fc = calloc(1, sizeof(*fc));
        baton__sp_item_t *items = calloc(op->n, sizeof(*items));
        uint32_t *idx = calloc(op->n + 1, sizeof(*idx));
        if (fc == NULL || items == NULL || idx == NULL) {
            free(fc);
            free(items);
            free(idx);
            continue; /* the put times out on the master and is taken over */
        }
        uint32_t k = 0;
        for (uint32_t i = 0; i < op->n; i++) {
            oobj_t *o = &op->o[i];
            if (o->put_id == 0 || (o->status == 0) == revoke)
                continue;
            memcpy(items[k].key, o->key, sizeof(items[k].key));
            items[k].x = o->put_id;
            idx[k++] = i;
        }
        idx[k] = UINT32_MAX;
        baton__sp_msg_t m;
        memset(&m, 0, sizeof(m));
        m.type = revoke ? BATON__SP_PUT_REVOKE : BATON__SP_PUT_COMMIT;
        snprintf(m.ns, sizeof(m.ns), "%s", op->cl->ns);
        m.n_items = k;
        m.items = items;
        fc->op = op;
        fc->idx = idx;
        fc->revoke = revoke;
        if (k > 0 &&
            baton__srpc_call(op->cl->master, &m, op->cl->timeout_ms, on_finish_reply, fc) == 0) {
            op->pending++;
        } else {
            if (k > 0 && !revoke)
                for (uint32_t j = 0; j < k; j++)
                    op->o[idx[j]].status = BATON_STORE_ENOLEADER;
            free(fc);
            free(idx);
        }
        free(items);
    }
    if (--op->pending == 0)
        baton__op_finish(op, 0);
}

static void slice_write_done(swrite_t *sw)
{
    if (sw->export_pending || sw->reply_pending)
        return;
    op_t *op = sw->op;
    oobj_t *o = &op->o[sw->obj];
    if (sw->status != 0 && o->status == 0)
        o->status = sw->status;
    free(sw);
    if (--op->pending == 0)
        finish_put(op);
}

static void on_exported(baton_xfer_engine_t *eng, uint64_t key, int status, void *data)
{
    swrite_t *sw = data;
    (void)eng;
    (void)key;
    sw->export_pending = 0;
    if (status != 0 && sw->status == 0)
        sw->status = status;
    slice_write_done(sw);
}

static void on_node_written(void *data, int status, baton__sp_msg_t *r)
{
    swrite_t *sw = data;
    sw->reply_pending = 0;
    if (status == 0)
        status = r->status;
    if (status != 0 && sw->status == 0)
        sw->status = status;
    /* Refused or failed before pulling: nothing reads the sources any more. */
    if (status != 0 && sw->export_pending &&
        baton_xfer_export_release(sw->op->cl->eng, sw->key) == 0)
        sw->export_pending = 0;
    slice_write_done(sw);
}

static int start_slice_write(op_t *op, uint32_t i, uint32_t rep, uint32_t s)
{
    baton_store_client_t *cl = op->cl;
    oobj_t *o = &op->o[i];
    const baton__slice_t *sl = &o->slices[(size_t)rep * o->n_slices + s];
    const baton__sp_node_t *nd = baton__op_node(op, o, sl->node);
    if (nd == NULL)
        return BATON_XFER_EPROTO;
    baton__srpc_t *rpc = baton__client_node_rpc(cl, nd->host, nd->ctrl_port);
    swrite_t *sw = calloc(1, sizeof(*sw));
    if (rpc == NULL || sw == NULL) {
        free(sw);
        return BATON_XFER_ENOMEM;
    }
    sw->op = op;
    sw->obj = i;
    sw->key = ++cl->key_seq;
    baton_xfer_iov_t src = {o->addr + baton__slice_obj_off(o, s), sl->len};
    baton_xfer_export_t ex = {sw->key, 1, 1, &src, cl->timeout_ms, {0, -1, NULL, 0}};
    int rc = baton_xfer_export(cl->eng, &ex, on_exported, sw);
    if (rc != 0) {
        free(sw);
        return rc;
    }
    baton__slice_t one = *sl;
    baton__sp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = BATON__SP_NODE_WRITE;
    snprintf(m.host, sizeof(m.host), "%s", cl->host);
    m.xfer_port = (uint16_t)baton_xfer_engine_listen_port(cl->eng);
    m.export_key = sw->key;
    m.n_slices = 1;
    m.slices = &one;
    rc = baton__srpc_call(rpc, &m, cl->timeout_ms, on_node_written, sw);
    if (rc != 0) {
        baton_xfer_export_release(cl->eng, sw->key);
        free(sw);
        return rc;
    }
    sw->export_pending = sw->reply_pending = 1;
    op->pending++;
    return 0;
}

static int blocks_text(const baton_store_block_t *b, size_t n, char **text_p, uint32_t *len_p);

static void on_put_started(void *data, int status, baton__sp_msg_t *r)
{
    op_t *op = data;
    status = baton__op_reply_status(op, status, r);
    if (status == 0)
        status = baton__op_keep_nodes(op, r);
    if (status != 0) {
        baton__op_finish(op, status);
        return;
    }
    op->pending = 1; /* guard */
    for (uint32_t i = 0; i < op->n; i++) {
        oobj_t *o = &op->o[i];
        const baton__sp_ritem_t *it = &r->ritems[i];
        o->status = it->status;
        if (o->status != 0)
            continue;
        o->put_id = it->put_id;
        o->obj_len = o->len;
        o->status = baton__op_take_placement(op, o, r, it);
        for (uint32_t rep = 0; o->status == 0 && rep < o->n_replicas; rep++)
            for (uint32_t s = 0; o->status == 0 && s < o->n_slices; s++)
                o->status = start_slice_write(op, i, rep, s);
    }
    if (--op->pending == 0)
        finish_put(op);
}

int baton_store_put(baton_store_client_t *cl, const baton_store_obj_t *objs, size_t n,
                    const baton_store_put_opts_t *opts_in, baton_store_batch_cb cb, void *data)
{
    baton_store_put_opts_t opts;
    baton_store_put_opts_init(&opts);
    if (opts_in) {
        if (opts_in->size < offsetof(baton_store_put_opts_t, flags) + sizeof(uint32_t))
            return BATON_XFER_EINVAL;
        memcpy(&opts, opts_in, opts_in->size < sizeof(opts) ? opts_in->size : sizeof(opts));
    }
    if (objs == NULL || n == 0 || n > BATON_STORE_BATCH_MAX || cb == NULL || opts.replicas == 0 ||
        opts.replicas > BATON_STORE_REPLICAS_MAX || baton_xfer_engine_listen_port(cl->eng) <= 0)
        return BATON_XFER_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (objs[i].addr == NULL || objs[i].len == 0)
            return BATON_XFER_EINVAL;
    if (cl->own && !baton__own_here(cl))
        return baton__own_post(cl, BATON__SP_PUT_START, objs, NULL, n, &opts, cb, data);
    if (cl->closing)
        return BATON_XFER_ESHUTDOWN;
    char *text = NULL;
    uint32_t text_len = 0;
    if (opts_in && opts_in->size >= offsetof(baton_store_put_opts_t, blocks) + sizeof(void *) &&
        opts.blocks) {
        int rc = blocks_text(opts.blocks, n, &text, &text_len);
        if (rc != 0)
            return rc;
    }
    op_t *op = baton__op_new(cl, BATON__SP_PUT_START, n, cb, data);
    if (op == NULL) {
        free(text);
        return BATON_XFER_ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        op->o[i].crc = baton_store_crc32c(0, objs[i].addr, objs[i].len);
    op->replicas = opts.replicas;
    op->flags = opts.flags;
    op->text = text;
    op->text_len = text_len;
    return baton__op_send(op, NULL, objs, on_put_started);
}

/* The blocks of a put as the PUT_START request's text: a JSON array of
 * [object index, hash, parent hash or null, [token ids], lora id or null]. */
static int blocks_text(const baton_store_block_t *b, size_t n, char **text_p, uint32_t *len_p)
{
    baton_buf_t t = BATON_BUF_INIT;
    baton_buf_append_str(&t, "[");
    int first = 1;
    for (size_t i = 0; i < n; i++) {
        if (b[i].n_tokens == 0)
            continue;
        if (b[i].token_ids == NULL || b[i].n_tokens > 4096) {
            baton_buf_free(&t);
            return BATON_XFER_EINVAL;
        }
        baton_buf_printf(&t, "%s[%zu,%lld,", first ? "" : ",", i, (long long)b[i].hash);
        if (b[i].has_parent)
            baton_buf_printf(&t, "%lld,[", (long long)b[i].parent_hash);
        else
            baton_buf_append_str(&t, "null,[");
        for (uint32_t k = 0; k < b[i].n_tokens; k++)
            baton_buf_printf(&t, k ? ",%u" : "%u", b[i].token_ids[k]);
        if (b[i].has_lora)
            baton_buf_printf(&t, "],%lld]", (long long)b[i].lora_id);
        else
            baton_buf_append_str(&t, "],null]");
        first = 0;
    }
    baton_buf_append_str(&t, "]");
    if (t.data == NULL || t.len > BATON__SP_TEXT_MAX) {
        baton_buf_free(&t);
        return t.data ? BATON_XFER_ETOOBIG : BATON_XFER_ENOMEM;
    }
    *text_p = t.data; /* the buffer is handed over */
    *len_p = (uint32_t)t.len;
    return 0;
}

/* ---- get --------------------------------------------------------------------------------------
 */

typedef struct {
    op_t *op;
    uint32_t obj, slice;
} sread_t;

static void get_obj_done(op_t *op, oobj_t *o)
{
    if (o->status == 0 && !o->verified && baton_store_crc32c(0, o->addr, o->obj_len) != o->crc)
        o->status = BATON_STORE_ECHECKSUM;
    if (o->status == 0 && !baton__store_lease_ok(o->lease_start_ms, o->lease_ms, baton_now_ms()))
        o->status = BATON_STORE_ELEASE;
    if (o->status == BATON_STORE_ECHECKSUM)
        log_warn(COMP, "store_checksum_mismatch key_len=%zu", strlen(o->key));
    if (o->status == 0 && !op->cached)
        baton__loc_put(op->cl, op, o);
    else if (o->status != 0)
        baton__loc_drop(op->cl, o->key);
}

static void get_done(op_t *op);

static void on_slice_read(void *data, uint64_t room_id, int status, const baton_xfer_done_t *done);

static int read_slice(sread_t *rd)
{
    op_t *op = rd->op;
    baton_store_client_t *cl = op->cl;
    oobj_t *o = &op->o[rd->obj];
    const baton__slice_t *sl =
        &o->slices[(size_t)o->slice_try[rd->slice] * o->n_slices + rd->slice];
    const baton__sp_node_t *nd = baton__op_node(op, o, sl->node);
    if (nd == NULL)
        return BATON_XFER_EPROTO;
    baton_xfer_iov_t page = {o->addr + baton__slice_obj_off(o, rd->slice), sl->len};
    baton_xfer_offer_t offer = {baton__sp_room_id(sl->off, ++cl->room_seq), 1, 1, &page, NULL};
    return baton_xfer_offer(cl->eng, nd->host, nd->xfer_port, &offer, on_slice_read, rd);
}

/* Reads the slice from the next replica; 0 when one was started. */
static int retry_slice(sread_t *rd)
{
    oobj_t *o = &rd->op->o[rd->obj];
    while (o->slice_try[rd->slice] + 1 < o->n_replicas) {
        o->slice_try[rd->slice]++;
        if (read_slice(rd) == 0)
            return 0;
    }
    return -1;
}

static void on_slice_read(void *data, uint64_t room_id, int status, const baton_xfer_done_t *done)
{
    sread_t *rd = data;
    op_t *op = rd->op;
    oobj_t *o = &op->o[rd->obj];
    (void)room_id;
    if (status == 0 && done && done->status != 0)
        status = BATON_XFER_EPROTO;
    if (status != 0 && retry_slice(rd) == 0)
        return;
    if (status != 0 && o->status == 0)
        o->status = status;
    free(rd);
    if (--o->pending == 0)
        get_obj_done(op, o);
    if (--op->pending == 0)
        get_done(op);
}

/* Starts the reads of every slice of object i (its placement known); the objects of a small get
 * (op->small: a batch that totals at most inline_max bytes, so the thread blocks for little) are
 * read inline first (client_inline.c), and through the engines only when that fails. */
static void read_obj(op_t *op, uint32_t i)
{
    oobj_t *o = &op->o[i];
    o->verified = o->status == 0 && baton__inline_read(op->cl, op, o) == 0;
    if (o->verified) {
        get_obj_done(op, o);
        return;
    }
    o->pending = 1; /* guard */
    for (uint32_t s = 0; o->status == 0 && s < o->n_slices; s++) {
        sread_t *rd = calloc(1, sizeof(*rd));
        if (rd == NULL) {
            o->status = BATON_XFER_ENOMEM;
            break;
        }
        *rd = (sread_t){op, i, s};
        if (read_slice(rd) != 0 && retry_slice(rd) != 0) {
            free(rd);
            o->status = BATON_STORE_ENOREPLICA;
            break;
        }
        o->pending++;
        op->pending++;
    }
    if (--o->pending == 0)
        get_obj_done(op, o);
}

static void on_get_reply(void *data, int status, baton__sp_msg_t *r)
{
    op_t *op = data;
    status = baton__op_reply_status(op, status, r);
    if (status == 0)
        status = baton__op_keep_nodes(op, r);
    if (status != 0) {
        baton__op_finish(op, status);
        return;
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < op->n; i++)
        total += r->ritems[i].status == 0 ? r->ritems[i].len : 0;
    op->small = total <= op->cl->inline_max;
    op->pending = 1; /* guard */
    for (uint32_t i = 0; i < op->n; i++) {
        oobj_t *o = &op->o[i];
        const baton__sp_ritem_t *it = &r->ritems[i];
        o->status = it->status;
        o->obj_len = it->len;
        o->crc = it->crc;
        o->lease_ms = it->lease_ms;
        o->lease_start_ms = op->start_ms;
        if (o->status != 0)
            continue;
        if (it->len > o->len) {
            o->status = BATON_STORE_ETOOSMALL;
            continue;
        }
        o->status = baton__op_take_placement(op, o, r, it);
        if (o->status == 0)
            read_obj(op, i);
    }
    if (--op->pending == 0)
        get_done(op);
}

/* Asks the master where the op's objects are (and for their leases), then reads them. */
static int get_from_master(op_t *op)
{
    baton__sp_msg_t m;
    baton__sp_item_t *items = NULL;
    int rc = baton__op_request(op, &m, &items);
    if (rc == 0) {
        op->start_ms = baton_now_ms(); /* a get's lease is measured from before the request */
        rc = baton__srpc_call(op->cl->master, &m, op->cl->timeout_ms, on_get_reply, op);
    }
    free(items);
    return rc;
}

/* The end of a get. One started from the location cache whose objects did not all arrive is
 * asked again through the master (their entries are gone by now): a moved, lost or stale
 * location costs a round trip, never a failure the master could have avoided. */
static void get_done(op_t *op)
{
    int again = 0;
    for (size_t i = 0; op->cached && i < op->n; i++)
        again |= op->o[i].status != 0;
    if (!again) {
        baton__op_finish(op, 0);
        return;
    }
    op->cached = 0;
    for (size_t i = 0; i < op->n; i++) {
        baton__obj_reset(&op->o[i]);
        op->o[i].status = 0;
        op->o[i].pending = 0;
    }
    int rc = get_from_master(op);
    if (rc != 0)
        baton__op_finish(op, rc);
}

/* Every object of the batch located within its lease: reads start at once. 0 when they did
 * (the op is under way), -1 when some object was not cached (nothing started: ask the master). */
static int get_cached(op_t *op)
{
    uint64_t now = baton_now_ms();
    for (size_t i = 0; i < op->n; i++)
        if (baton__loc_take(op->cl, &op->o[i], now) != 0) {
            for (size_t j = 0; j < i; j++)
                baton__obj_reset(&op->o[j]);
            return -1;
        }
    op->cached = 1;
    uint64_t total = 0;
    for (size_t i = 0; i < op->n; i++)
        total += op->o[i].obj_len;
    op->small = total <= op->cl->inline_max;
    op->pending = 1; /* guard */
    for (uint32_t i = 0; i < op->n; i++)
        read_obj(op, i);
    if (--op->pending > 0)
        return 0;
    /* Never the callback inside the caller's call: reads that all failed at once go to the
     * master (a later callback), a batch read inline waits for the loop's next iteration. */
    int all = 1;
    for (size_t i = 0; i < op->n; i++)
        all &= op->o[i].status == 0;
    if (!all || baton__op_finish_later(op) != 0)
        get_done(op);
    return 0;
}

int baton_store_get(baton_store_client_t *cl, const baton_store_obj_t *objs, size_t n,
                    baton_store_batch_cb cb, void *data)
{
    if (objs == NULL || n == 0 || n > BATON_STORE_BATCH_MAX || cb == NULL)
        return BATON_XFER_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (objs[i].addr == NULL || objs[i].len == 0)
            return BATON_XFER_EINVAL;
    /* Own-progress mode: a small get the location cache places is read here, on the calling
     * thread (no hand-off to the client's thread and back); any other goes there. */
    if (cl->own && !baton__own_here(cl) && baton__inline_get_here(cl, objs, n, cb, data) == 0)
        return 0;
    if (cl->own && !baton__own_here(cl))
        return baton__own_post(cl, BATON__SP_GET, objs, NULL, n, NULL, cb, data);
    if (cl->closing)
        return BATON_XFER_ESHUTDOWN;
    op_t *op = baton__op_new(cl, BATON__SP_GET, n, cb, data);
    if (op == NULL)
        return BATON_XFER_ENOMEM;
    if (cl->n_locs && baton__op_copy_keys(op, NULL, objs) == 0 && get_cached(op) == 0)
        return 0;
    return baton__op_send(op, NULL, objs, on_get_reply);
}
