/* store_hold_client.c — a store client that never answers a node's pull: it asks a node to write
 * one slice (NODE_WRITE) naming an export it never made, and holds the pull that arrives (its
 * room callback keeps the room). What a client with its export gone and a silent room callback
 * does. Prints the node's answer as one line: `reply status=NAME` (the node ended the write) or
 * `no_reply status=NAME` (this program's own deadline passed first); exits 0 either way, 2 on a
 * usage or start error. The test (tests/integration/test_store.py) reads the line.
 *
 * usage: store_hold_client NODE_HOST:NODE_CTRL_PORT SECRET_FILE DEADLINE_MS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/sconn.h"

int baton__parse_hostport(const char *s, char *host, size_t cap, int *port_p);

typedef struct {
    uv_loop_t *loop;
    baton_xfer_engine_t *eng;
    baton__srpc_t *node;
    unsigned held;
} hold_t;

/* Every room is kept: no write, no abort; only the node's own abort (or its death) ends it. */
static void on_room(baton_xfer_engine_t *e, baton_xfer_room_t *room, void *data)
{
    hold_t *h = data;
    (void)e;
    (void)room;
    h->held++;
    fprintf(stderr, "store_hold_client held_room n=%u\n", h->held);
}

static void on_room_closed(baton_xfer_engine_t *e, baton_xfer_room_t *room, int status, void *data)
{
    (void)e;
    (void)room;
    (void)data;
    fprintf(stderr, "store_hold_client room_closed status=%s\n", baton_xfer_err_name(status));
}

static void on_engine_closed(baton_xfer_engine_t *e, void *data)
{
    (void)e;
    (void)data;
}

static void on_reply(void *data, int status, baton__sp_msg_t *r)
{
    hold_t *h = data;
    if (status == 0)
        printf("reply status=%s\n", r->status ? baton_xfer_err_name(r->status) : "ok");
    else
        printf("no_reply status=%s\n", baton_xfer_err_name(status));
    fflush(stdout);
    baton__srpc_destroy(h->node);
    baton_xfer_engine_destroy(h->eng, on_engine_closed, h);
}

int main(int argc, char **argv)
{
    char host[BATON__SP_HOST_MAX + 1];
    int port;
    uint8_t secret[BATON_XFER_SECRET_MAX];
    size_t secret_len = 0;
    if (argc != 4 || baton__parse_hostport(argv[1], host, sizeof(host), &port) != 0 ||
        baton__store_read_secret(argv[2], secret, sizeof(secret), &secret_len) != 0 ||
        atoi(argv[3]) <= 0) {
        fprintf(stderr, "usage: store_hold_client NODE_HOST:CTRL_PORT SECRET_FILE DEADLINE_MS\n");
        return 2;
    }
    hold_t h = {.loop = uv_default_loop()};
    baton_xfer_config_t xc;
    baton_xfer_config_init(&xc);
    xc.listen_host = "127.0.0.1";
    xc.listen_port = 0;
    xc.secret = secret;
    xc.secret_len = secret_len;
    baton_xfer_callbacks_t cbs = {on_room, on_room_closed, NULL, &h};
    int rc = baton_xfer_engine_create(h.loop, &xc, &cbs, &h.eng);
    baton__sconn_opts_t so = {0};
    so.loop = h.loop;
    so.secret = secret;
    so.secret_len = secret_len;
    so.id = "store-hold-client";
    so.max_body = BATON__SP_REPLY_MAX;
    if (rc == 0)
        rc = baton__srpc_create(&so, host, port, BATON_XFER_EPEERDOWN, &h.node);
    baton__slice_t slice = {0};
    slice.off = 0;
    slice.len = 4096;
    baton__sp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = BATON__SP_NODE_WRITE;
    snprintf(m.host, sizeof(m.host), "127.0.0.1");
    m.xfer_port = rc == 0 ? (uint16_t)baton_xfer_engine_listen_port(h.eng) : 0;
    m.export_key = 0x5eed; /* never exported here: the pull reaches on_room */
    m.n_slices = 1;
    m.slices = &slice;
    if (rc == 0)
        rc = baton__srpc_call(h.node, &m, (uint32_t)atoi(argv[3]), on_reply, &h);
    if (rc != 0) {
        fprintf(stderr, "store_hold_client: %s\n", baton_xfer_err_name(rc));
        return 2;
    }
    uv_run(h.loop, UV_RUN_DEFAULT);
    return 0;
}
