/* store/cli.c — the operator's commands of baton-store: put, get, exists, rm, stat, through the
 * public client API (stat through the control channel); exit 0 success, 1 missing key, 2 error. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"
#include "store/elect.h"
#include "store/sconn.h"

int baton__parse_hostport(const char *s, char *host, size_t cap, int *port_p);

typedef struct {
    const char *cmd;
    const char *master;
    const char *secret_file;
    const char *ns;
    const char *host;
    uint32_t replicas, flags, timeout_ms;
    baton_store_block_t block; /* put --block */
    uint32_t block_ids[4096];
    char **args;
    int n_args;
    uint8_t secret[BATON_XFER_SECRET_MAX];
    size_t secret_len;
    /* run state */
    uv_loop_t *loop;
    baton_xfer_engine_t *eng;
    baton_store_client_t *cl;
    baton_xfer_mem_t *mem;
    int done, exit_code;
    uint64_t obj_len;
} cli_t;

static void usage(FILE *f)
{
    fprintf(f, "usage: baton-store COMMAND [options]\n"
               "  master ...                         run a master (baton-store master --help)\n"
               "  node ...                           run a node (baton-store node --help)\n"
               "  put KEY FILE [--replicas N] [--soft-pin] [--block HASH:[PARENT]:ID,ID,...]\n"
               "                                     (--block: the KV block it holds, for the "
               "master's KV events)\n"
               "  get KEY OUTFILE\n"
               "  exists KEY...                      prints 'KEY 1|0' per key, then 'prefix N'\n"
               "  rm KEY\n"
               "  stat                               JSON: capacity, used, objects, nodes, "
               "leader\n"
               "client options: --master H:P or --registry etcd://H:P,.../PFX, "
               "--namespace NS,\n"
               "  --kv-secret-file F, --host H (this client's address for nodes), "
               "--timeout-ms N\n"
               "exit status: 0 success, 1 a missing key, 2 an error\n");
}

/* HASH:[PARENT]:ID,ID,... */
static int parse_block(const char *s, cli_t *c)
{
    char *end;
    baton_store_block_t *b = &c->block;
    b->hash = strtoll(s, &end, 10);
    if (end == s || *end != ':')
        return -1;
    s = end + 1;
    b->has_parent = *s != ':';
    if (b->has_parent) {
        b->parent_hash = strtoll(s, &end, 10);
        if (end == s || *end != ':')
            return -1;
        s = end;
    }
    s++;
    uint32_t n = 0;
    while (*s) {
        unsigned long v = strtoul(s, &end, 10);
        if (end == s || v > UINT32_MAX || n == 4096 || (*end != ',' && *end != '\0'))
            return -1;
        c->block_ids[n++] = (uint32_t)v;
        s = *end ? end + 1 : end;
    }
    if (n == 0)
        return -1;
    b->token_ids = c->block_ids;
    b->n_tokens = n;
    return 0;
}

static int parse_cli(int argc, char **argv, cli_t *c)
{
    static const struct option lo[] = {
        {"master", required_argument, NULL, 'm'},
        {"registry", required_argument, NULL, 'r'},
        {"namespace", required_argument, NULL, 'n'},
        {"kv-secret-file", required_argument, NULL, 'k'},
        {"host", required_argument, NULL, 'H'},
        {"replicas", required_argument, NULL, 'R'},
        {"soft-pin", no_argument, NULL, 'p'},
        {"block", required_argument, NULL, 'b'},
        {"timeout-ms", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int o;
    optind = 1;
    c->replicas = 1;
    c->timeout_ms = 10000;
    while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (o) {
        case 'm':
            c->master = optarg;
            break;
        case 'r':
            c->master = optarg; /* the client looks the leader up there */
            break;
        case 'n':
            c->ns = optarg;
            break;
        case 'k':
            c->secret_file = optarg;
            break;
        case 'H':
            c->host = optarg;
            break;
        case 'R':
            c->replicas = (uint32_t)atoi(optarg);
            if (c->replicas < 1 || c->replicas > BATON_STORE_REPLICAS_MAX) {
                fprintf(stderr, "baton-store: --replicas wants 1..%d\n", BATON_STORE_REPLICAS_MAX);
                return -1;
            }
            break;
        case 'p':
            c->flags |= BATON_STORE_PUT_SOFT_PIN;
            break;
        case 'b':
            if (parse_block(optarg, c) != 0) {
                fprintf(stderr, "baton-store: --block wants HASH:[PARENT]:ID,ID,... (integers, "
                                "at most 4096 ids)\n");
                return -1;
            }
            break;
        case 't':
            c->timeout_ms = (uint32_t)atoi(optarg);
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return -1;
        }
    }
    c->args = argv + optind;
    c->n_args = argc - optind;
    if (c->master == NULL) {
        fprintf(stderr, "baton-store %s: --master H:P or --registry URL is required\n", c->cmd);
        return -1;
    }
    if (c->secret_file &&
        baton__store_read_secret(c->secret_file, c->secret, sizeof(c->secret), &c->secret_len))
        return -1;
    return 0;
}

static int code_of(int status)
{
    return status == 0 ? 0 : status == BATON_XFER_ENOTFOUND ? 1 : 2;
}

static void finish(cli_t *c, int code)
{
    c->exit_code = code;
    c->done = 1;
    uv_stop(c->loop);
}

/* ---- the commands -------------------------------------------------------------------------- */

static void on_put(void *data, int status, const baton_store_result_t *res, size_t n, size_t prefix)
{
    cli_t *c = data;
    (void)n;
    (void)prefix;
    int st = status ? status : res[0].status;
    if (st != 0)
        fprintf(stderr, "baton-store put: %s\n", baton_store_strerror(st));
    else
        printf("stored %s %llu bytes replicas %u\n", c->args[0], (unsigned long long)res[0].len,
               res[0].replicas);
    finish(c, st == 0 ? 0 : 2);
}

static void on_get(void *data, int status, const baton_store_result_t *res, size_t n, size_t prefix)
{
    cli_t *c = data;
    (void)n;
    (void)prefix;
    int st = status ? status : res[0].status;
    if (st != 0) {
        fprintf(stderr, "baton-store get: %s\n", baton_store_strerror(st));
        finish(c, code_of(st));
        return;
    }
    FILE *f = fopen(c->args[1], "wb");
    if (f == NULL || fwrite(baton_xfer_mem_addr(c->mem), 1, res[0].len, f) != res[0].len ||
        fclose(f) != 0) {
        fprintf(stderr, "baton-store get: cannot write %s: %s\n", c->args[1], strerror(errno));
        finish(c, 2);
        return;
    }
    finish(c, 0);
}

static void on_size(void *data, int status, const baton_store_result_t *res, size_t n,
                    size_t prefix)
{
    cli_t *c = data;
    (void)n;
    (void)prefix;
    int st = status ? status : res[0].status;
    if (st != 0) {
        fprintf(stderr, "baton-store get: %s\n", baton_store_strerror(st));
        finish(c, code_of(st));
        return;
    }
    c->obj_len = res[0].len;
    st = baton_xfer_mem_alloc(c->eng, c->obj_len, &c->mem);
    baton_store_obj_t o = {c->args[0], st == 0 ? baton_xfer_mem_addr(c->mem) : NULL, c->obj_len};
    if (st == 0)
        st = baton_store_get(c->cl, &o, 1, on_get, c);
    if (st != 0) {
        fprintf(stderr, "baton-store get: %s\n", baton_store_strerror(st));
        finish(c, 2);
    }
}

static void on_exists(void *data, int status, const baton_store_result_t *res, size_t n,
                      size_t prefix)
{
    cli_t *c = data;
    if (status != 0) {
        fprintf(stderr, "baton-store exists: %s\n", baton_store_strerror(status));
        finish(c, 2);
        return;
    }
    int missing = 0;
    for (size_t i = 0; i < n; i++) {
        printf("%s %d\n", c->args[i], res[i].status == 0);
        missing |= res[i].status != 0;
    }
    printf("prefix %zu\n", prefix);
    finish(c, missing ? 1 : 0);
}

static void on_rm(void *data, int status, const baton_store_result_t *res, size_t n, size_t prefix)
{
    cli_t *c = data;
    (void)n;
    (void)prefix;
    int st = status ? status : res[0].status;
    if (st != 0)
        fprintf(stderr, "baton-store rm: %s\n", baton_store_strerror(st));
    finish(c, code_of(st));
}

static void on_stat(void *data, int status, baton__sp_msg_t *r)
{
    cli_t *c = data;
    if (status == 0 && r->status != 0)
        status = r->status;
    if (status != 0) {
        fprintf(stderr, "baton-store stat: %s\n", baton_store_strerror(status));
        finish(c, 2);
        return;
    }
    printf("%s\n", r->text ? r->text : "{}");
    finish(c, 0);
}

static int start(cli_t *c)
{
    if (strcmp(c->cmd, "put") == 0) {
        if (c->n_args != 2)
            return BATON_XFER_EINVAL;
        FILE *f = fopen(c->args[1], "rb");
        struct stat st;
        if (f == NULL || fstat(fileno(f), &st) != 0 || st.st_size <= 0) {
            fprintf(stderr, "baton-store put: cannot read %s (or it is empty)\n", c->args[1]);
            if (f)
                fclose(f);
            return BATON_XFER_EINVAL;
        }
        int rc = baton_xfer_mem_alloc(c->eng, (size_t)st.st_size, &c->mem);
        size_t got = rc == 0 ? fread(baton_xfer_mem_addr(c->mem), 1, (size_t)st.st_size, f) : 0;
        fclose(f);
        if (rc != 0 || got != (size_t)st.st_size)
            return rc ? rc : BATON_XFER_EINVAL;
        baton_store_put_opts_t po;
        baton_store_put_opts_init(&po);
        po.replicas = c->replicas;
        po.flags = c->flags;
        if (c->block.n_tokens)
            po.blocks = &c->block;
        baton_store_obj_t o = {c->args[0], baton_xfer_mem_addr(c->mem), (uint64_t)got};
        return baton_store_put(c->cl, &o, 1, &po, on_put, c);
    }
    if (strcmp(c->cmd, "get") == 0) {
        if (c->n_args != 2)
            return BATON_XFER_EINVAL;
        const char *k = c->args[0];
        return baton_store_exists(c->cl, &k, 1, on_size, c);
    }
    if (strcmp(c->cmd, "exists") == 0) {
        if (c->n_args < 1)
            return BATON_XFER_EINVAL;
        return baton_store_exists(c->cl, (const char *const *)c->args, (size_t)c->n_args, on_exists,
                                  c);
    }
    if (strcmp(c->cmd, "rm") == 0) {
        if (c->n_args != 1)
            return BATON_XFER_EINVAL;
        const char *k = c->args[0];
        return baton_store_remove(c->cl, &k, 1, on_rm, c);
    }
    return BATON_XFER_EINVAL;
}

static int run_stat(cli_t *c)
{
    char host[BATON__SP_HOST_MAX + 1] = "0.0.0.0";
    int port = 0;
    baton__resolver_t *res = NULL;
    if (strncmp(c->master, "etcd://", 7) == 0) {
        int rc = baton__resolver_create(c->loop, c->master, &res);
        if (rc != 0)
            return rc;
    } else if (baton__parse_hostport(c->master, host, sizeof(host), &port) != 0) {
        return BATON_XFER_EINVAL;
    }
    baton__sconn_opts_t so = {0};
    so.loop = c->loop;
    so.secret = c->secret_len ? c->secret : NULL;
    so.secret_len = c->secret_len;
    so.id = "baton-store-cli";
    baton__srpc_t *r;
    int rc = baton__srpc_create(&so, host, port, BATON_STORE_ENOLEADER, &r);
    if (rc != 0)
        return rc;
    if (res)
        baton__srpc_set_resolver(r, res);
    baton__sp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = BATON__SP_STAT;
    rc = baton__srpc_call(r, &m, c->timeout_ms, on_stat, c);
    if (rc == 0)
        uv_run(c->loop, UV_RUN_DEFAULT);
    baton__srpc_destroy(r);
    if (res)
        baton__resolver_close(res);
    uv_run(c->loop, UV_RUN_DEFAULT);
    return rc;
}

/* The client's engine listens only so that nodes can pull puts (exports, served by libbaton
 * itself): an ordinary offer is refused. */
static void on_room(baton_xfer_engine_t *e, baton_xfer_room_t *room, void *data)
{
    (void)e;
    (void)data;
    baton_xfer_room_abort(room, BATON_XFER_ENOTSUP);
}

static void on_room_closed(baton_xfer_engine_t *e, baton_xfer_room_t *room, int status, void *data)
{
    (void)e;
    (void)room;
    (void)status;
    (void)data;
}

static void on_engine_closed(baton_xfer_engine_t *e, void *data)
{
    (void)e;
    uv_stop(((cli_t *)data)->loop);
}

static void on_client_closed(baton_store_client_t *cl, void *data)
{
    cli_t *c = data;
    (void)cl;
    if (c->mem)
        baton_xfer_mem_deregister(c->eng, c->mem);
    baton_xfer_engine_destroy(c->eng, on_engine_closed, c);
}

int baton__cli_main(const char *cmd, int argc, char **argv);

int baton__cli_main(const char *cmd, int argc, char **argv)
{
    cli_t c;
    memset(&c, 0, sizeof(c));
    c.cmd = cmd;
    if (parse_cli(argc, argv, &c) != 0)
        return 2;
    c.loop = uv_default_loop();
    if (strcmp(cmd, "stat") == 0) {
        int rc = run_stat(&c);
        if (rc != 0) {
            fprintf(stderr, "baton-store stat: %s\n", baton_store_strerror(rc));
            return 2;
        }
        return c.exit_code;
    }
    baton_xfer_config_t xc;
    baton_xfer_config_init(&xc);
    xc.listen_host = c.host ? c.host : "127.0.0.1"; /* nodes pull puts from here */
    xc.listen_port = 0;
    if (c.secret_len) {
        xc.secret = c.secret;
        xc.secret_len = c.secret_len;
    }
    xc.log_level = BATON_XFER_LOG_WARN;
    baton_xfer_callbacks_t cbs = {on_room, on_room_closed, NULL, &c};
    int rc = baton_xfer_engine_create(c.loop, &xc, &cbs, &c.eng);
    if (rc != 0) {
        fprintf(stderr, "baton-store %s: %s\n", cmd, baton_store_strerror(rc));
        return 2;
    }
    baton_store_config_t sc;
    baton_store_config_init(&sc);
    sc.master = c.master;
    sc.engine = c.eng;
    sc.host = c.host;
    sc.ns = c.ns;
    sc.secret = c.secret_len ? c.secret : NULL;
    sc.secret_len = c.secret_len;
    sc.request_timeout_ms = c.timeout_ms;
    rc = baton_store_client_create(c.loop, &sc, &c.cl);
    if (rc == 0)
        rc = start(&c);
    if (rc != 0) {
        fprintf(stderr, "baton-store %s: %s\n", cmd, baton_store_strerror(rc));
        c.exit_code = 2;
    } else {
        uv_run(c.loop, UV_RUN_DEFAULT);
    }
    if (c.cl)
        baton_store_client_destroy(c.cl, on_client_closed, &c);
    else
        baton_xfer_engine_destroy(c.eng, on_engine_closed, &c);
    uv_run(c.loop, UV_RUN_DEFAULT);
    return c.exit_code;
}
