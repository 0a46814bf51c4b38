/* auth.c — route authorisation: API key and token checks in constant time, key files re-read on
 * SIGHUP, loopback-only admin without a token, and the per-key token-bucket table. */
#include "router/auth.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

#include "baton/error.h"
#include "common/hash.h"
#include "common/token_bucket.h"
#include "router/control/registry.h"
#include "router/dataplane/priority.h"

/* Rate-limit buckets: a fixed table, so a flood of identities costs no memory. A new identity
 * takes a free slot or the idlest of RATE_PROBE slots (an idle bucket is a full one, the same
 * as a new bucket, so evicting it changes nothing). */
#define RATE_SLOTS 4096
#define RATE_PROBE 8
#define KEY_MAX    4096 /* one key or token, bytes */

typedef struct keyset_s {
    char **v;
    signed char *cls; /* per key: its priority class (priority.h), BATON_PRIO_NONE when unset */
    size_t n;
} keyset_t;

typedef struct rate_slot_s {
    uint64_t id; /* 0 = free */
    baton_token_bucket_t tb;
} rate_slot_t;

struct baton_auth_s {
    keyset_t flag_keys;     /* --api-key: fixed */
    char *key_file;         /* --api-key-file or NULL */
    char *admin_token_file; /* --admin-token-file or NULL */
    char *admin_token_flag; /* --admin-token or NULL */
    char *metrics_token;    /* NULL = /metrics open */
    pthread_rwlock_t lock;  /* guards file_keys and admin_token */
    keyset_t file_keys;     /* from key_file */
    char *admin_token;      /* effective: the file's, else the flag's; NULL = none */
    double rate, burst;     /* rate 0 = no limit */
    pthread_mutex_t rate_lock;
    uint64_t salt; /* per process: identities an attacker picks cannot be aimed at one slot */
    rate_slot_t *slots;
};

int baton_auth_ct_equal(const void *a, size_t alen, const void *b, size_t blen)
{
    /* Runs over b (the secret) whatever a is: no early exit on the first difference. */
    const volatile unsigned char *pa = a, *pb = b;
    unsigned char diff = alen != blen;
    for (size_t i = 0; i < blen; i++)
        diff |= (unsigned char)(pb[i] ^ (alen ? pa[i % alen] : 0));
    return diff == 0;
}

int baton_auth_peer_is_loopback(const char *peer)
{
    if (peer == NULL)
        return 0;
    if (strncmp(peer, "127.", 4) == 0)
        return 1;
    if (strncmp(peer, "[::1]:", 6) == 0)
        return 1;
    if (strncasecmp(peer, "[::ffff:127.", 12) == 0)
        return 1;
    return 0;
}

const char *baton_auth_bearer(const baton_http_req_t *req)
{
    const baton_http_header_t *h = baton_http_req_header(req, "Authorization");
    if (h == NULL || strncasecmp(h->value, "Bearer ", 7) != 0)
        return NULL;
    const char *t = h->value + 7;
    while (*t == ' ')
        t++;
    return *t ? t : NULL;
}

static void keyset_free(keyset_t *ks)
{
    for (size_t i = 0; i < ks->n; i++) {
        /* Secrets do not linger in freed memory. */
        memset(ks->v[i], 0, strlen(ks->v[i]));
        free(ks->v[i]);
    }
    free(ks->v);
    free(ks->cls);
    ks->v = NULL;
    ks->cls = NULL;
    ks->n = 0;
}

/*
 * One key entry: the key, then optional attributes separated by blanks. The one attribute is
 * `priority=CLASS` (the key's default priority class; `system` also lets the key claim it).
 * 0, BATON_EINVAL (what is wrong in err, without the key) or BATON_ENOMEM.
 */
static int keyset_add(keyset_t *ks, const char *s, size_t len, int attrs, char *err, size_t errlen)
{
    size_t klen = attrs ? 0 : len;
    while (klen < len && !isspace((unsigned char)s[klen]))
        klen++;
    int cls = BATON_PRIO_NONE;
    for (size_t i = klen; i < len;) {
        while (i < len && isspace((unsigned char)s[i]))
            i++;
        size_t j = i;
        while (j < len && !isspace((unsigned char)s[j]))
            j++;
        if (j == i)
            break;
        baton_prio_t p;
        if (j - i > 9 && strncmp(s + i, "priority=", 9) == 0 &&
            baton_prio_parse(s + i + 9, j - i - 9, &p) == 0) {
            cls = (int)p;
        } else {
            snprintf(err, errlen,
                     "a key's attribute is not priority=bulk|default|interactive|system");
            return BATON_EINVAL;
        }
        i = j;
    }
    char **v = realloc(ks->v, (ks->n + 1) * sizeof(*v));
    if (v == NULL)
        return BATON_ENOMEM;
    ks->v = v;
    signed char *c = realloc(ks->cls, ks->n + 1);
    if (c == NULL)
        return BATON_ENOMEM;
    ks->cls = c;
    if ((ks->v[ks->n] = strndup(s, klen)) == NULL)
        return BATON_ENOMEM;
    ks->cls[ks->n] = (signed char)cls;
    ks->n++;
    return 0;
}

/* One secret per line; blank lines and lines starting with '#' are skipped, surrounding
 * whitespace (and a CR) is not part of a key. With attrs, a line is a key and its attributes
 * (keyset_add). */
static int read_lines(const char *path, keyset_t *out, int attrs, char *err, size_t errlen)
{
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
        return BATON_EINVAL;
    }
    char line[KEY_MAX + 2];
    int rc = 0;
    while (rc == 0 && fgets(line, sizeof(line), f) != NULL) {
        size_t len = strlen(line);
        if (len == sizeof(line) - 1 && line[len - 1] != '\n') {
            snprintf(err, errlen, "%s: a line is longer than %d bytes", path, KEY_MAX);
            rc = BATON_EINVAL;
            break;
        }
        char *s = line;
        while (isspace((unsigned char)*s))
            s++;
        len = strlen(s);
        while (len > 0 && isspace((unsigned char)s[len - 1]))
            len--;
        if (len == 0 || s[0] == '#')
            continue;
        char why[120] = "out of memory";
        if ((rc = keyset_add(out, s, len, attrs, why, sizeof(why))) != 0)
            snprintf(err, errlen, "%s: %s", path, why);
    }
    memset(line, 0, sizeof(line));
    fclose(f);
    if (rc != 0)
        keyset_free(out);
    return rc;
}

/* Reads both files into new sets, then swaps them in. */
static int load_files(baton_auth_t *a, char *err, size_t errlen)
{
    keyset_t keys = {0}, admin = {0};
    int rc = 0;
    if (a->key_file && (rc = read_lines(a->key_file, &keys, 1, err, errlen)) != 0)
        return rc;
    if (a->key_file && keys.n == 0 && a->flag_keys.n == 0) {
        /* An empty file would silently open every route: refuse it. */
        snprintf(err, errlen, "%s: no key in the file", a->key_file);
        return BATON_EINVAL;
    }
    if (a->admin_token_file) {
        if ((rc = read_lines(a->admin_token_file, &admin, 0, err, errlen)) != 0) {
            keyset_free(&keys);
            return rc;
        }
        if (admin.n != 1) {
            snprintf(err, errlen, "%s: expected exactly one token, found %zu", a->admin_token_file,
                     admin.n);
            keyset_free(&keys);
            keyset_free(&admin);
            return BATON_EINVAL;
        }
    }
    pthread_rwlock_wrlock(&a->lock);
    keyset_t old = a->file_keys;
    a->file_keys = keys;
    char *old_admin = NULL;
    if (admin.n == 1) {
        old_admin = a->admin_token;
        a->admin_token = admin.v[0];
        free(admin.v);
        free(admin.cls);
    }
    pthread_rwlock_unlock(&a->lock);
    keyset_free(&old);
    if (old_admin) {
        memset(old_admin, 0, strlen(old_admin));
        free(old_admin);
    }
    return 0;
}

static char *dup_or_null(const char *s, int *oom)
{
    char *d = s ? strdup(s) : NULL;
    if (s && !d)
        *oom = 1;
    return d;
}

int baton_auth_create(baton_auth_t **auth_p, const baton_config_t *cfg, char *err, size_t errlen)
{
    baton_auth_t *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return BATON_ENOMEM;
    pthread_rwlock_init(&a->lock, NULL);
    pthread_mutex_init(&a->rate_lock, NULL);
    int oom = 0;
    for (size_t i = 0; i < cfg->api_keys.n && !oom; i++) {
        char why[120] = "out of memory";
        int rc = keyset_add(&a->flag_keys, cfg->api_keys.v[i], strlen(cfg->api_keys.v[i]), 1, why,
                            sizeof(why));
        if (rc == BATON_EINVAL) {
            snprintf(err, errlen, "--api-key: %s", why);
            baton_auth_free(a);
            return rc;
        }
        oom = rc != 0;
    }
    a->key_file = dup_or_null(cfg->api_key_file, &oom);
    a->admin_token_file = dup_or_null(cfg->admin_token_file, &oom);
    a->admin_token_flag = dup_or_null(cfg->admin_token, &oom);
    a->metrics_token = dup_or_null(cfg->metrics_token, &oom);
    if (!oom && a->admin_token_flag && !a->admin_token_file)
        a->admin_token = dup_or_null(a->admin_token_flag, &oom);
    if (cfg->worker_api_key && !baton_worker_api_key_ok(cfg->worker_api_key)) {
        snprintf(err, errlen,
                 "--worker-api-key must be visible ASCII (no spaces or control "
                 "characters)");
        baton_auth_free(a);
        return BATON_EINVAL;
    }
    if (cfg->rate_limit && !oom) {
        if (baton_token_bucket_parse(cfg->rate_limit, &a->rate, &a->burst) != 0) {
            snprintf(err, errlen, "--rate-limit: bad value '%s'", cfg->rate_limit);
            baton_auth_free(a);
            return BATON_EINVAL;
        }
        a->slots = calloc(RATE_SLOTS, sizeof(*a->slots));
        oom = a->slots == NULL;
    }
    if (oom) {
        snprintf(err, errlen, "out of memory");
        baton_auth_free(a);
        return BATON_ENOMEM;
    }
    if (getrandom(&a->salt, sizeof(a->salt), 0) != (ssize_t)sizeof(a->salt))
        a->salt = (uint64_t)(uintptr_t)a ^ BATON_FNV1A64_INIT;
    int rc = load_files(a, err, errlen);
    if (rc != 0) {
        baton_auth_free(a);
        return rc;
    }
    *auth_p = a;
    return 0;
}

void baton_auth_free(baton_auth_t *a)
{
    if (a == NULL)
        return;
    keyset_free(&a->flag_keys);
    keyset_free(&a->file_keys);
    char *secrets[] = {a->admin_token, a->admin_token_flag, a->metrics_token};
    for (size_t i = 0; i < sizeof(secrets) / sizeof(*secrets); i++) {
        if (secrets[i])
            memset(secrets[i], 0, strlen(secrets[i]));
        free(secrets[i]);
    }
    free(a->key_file);
    free(a->admin_token_file);
    free(a->slots);
    pthread_rwlock_destroy(&a->lock);
    pthread_mutex_destroy(&a->rate_lock);
    free(a);
}

int baton_auth_reload(baton_auth_t *a, char *err, size_t errlen)
{
    if (!a->key_file && !a->admin_token_file)
        return 0;
    return load_files(a, err, errlen);
}

size_t baton_auth_n_keys(baton_auth_t *a)
{
    pthread_rwlock_rdlock(&a->lock);
    size_t n = a->flag_keys.n + a->file_keys.n;
    pthread_rwlock_unlock(&a->lock);
    return n;
}

int baton_auth_has_admin_token(baton_auth_t *a)
{
    pthread_rwlock_rdlock(&a->lock);
    int has = a->admin_token != NULL;
    pthread_rwlock_unlock(&a->lock);
    return has;
}

/* Compares with every key of the set (no early exit: which key matched must not show). */
static int keyset_match(const keyset_t *ks, const char *t, size_t tlen)
{
    int found = 0;
    for (size_t i = 0; i < ks->n; i++)
        found |= baton_auth_ct_equal(t, tlen, ks->v[i], strlen(ks->v[i]));
    return found;
}

static int token_match(const char *secret, const char *t)
{
    return t && baton_auth_ct_equal(t, strlen(t), secret, strlen(secret));
}

baton_auth_result_t baton_auth_check_admin(baton_auth_t *a, const baton_http_req_t *req,
                                           const char *token)
{
    if (a == NULL)
        return BATON_AUTH_OK;
    baton_auth_result_t res = BATON_AUTH_OK;
    pthread_rwlock_rdlock(&a->lock);
    if (a->admin_token)
        res = token_match(a->admin_token, token) ? BATON_AUTH_OK : BATON_AUTH_BAD_TOKEN;
    else if (!baton_auth_peer_is_loopback(req->peer))
        res = BATON_AUTH_NOT_LOOPBACK;
    pthread_rwlock_unlock(&a->lock);
    return res;
}

baton_auth_result_t baton_auth_check(baton_auth_t *a, const baton_http_req_t *req,
                                     baton_route_class_t cls)
{
    if (a == NULL || cls == BATON_ROUTE_OPEN)
        return BATON_AUTH_OK;
    const char *t = baton_auth_bearer(req);
    if (cls == BATON_ROUTE_METRICS)
        return !a->metrics_token || token_match(a->metrics_token, t) ? BATON_AUTH_OK
                                                                     : BATON_AUTH_BAD_TOKEN;
    if (cls == BATON_ROUTE_ADMIN)
        return baton_auth_check_admin(a, req, t);
    baton_auth_result_t res = BATON_AUTH_OK;
    pthread_rwlock_rdlock(&a->lock);
    if (a->flag_keys.n + a->file_keys.n > 0) {
        size_t tlen = t ? strlen(t) : 0;
        int ok = t && (keyset_match(&a->flag_keys, t, tlen) | keyset_match(&a->file_keys, t, tlen));
        res = ok ? BATON_AUTH_OK : BATON_AUTH_NO_KEY;
    }
    pthread_rwlock_unlock(&a->lock);
    return res;
}

/* The class of the key that matches t, compared with every key like keyset_match (the last
 * match wins; BATON_PRIO_NONE when none matches or the key has no class). */
static int keyset_class(const keyset_t *ks, const char *t, size_t tlen, int cls)
{
    for (size_t i = 0; i < ks->n; i++) {
        int m = -baton_auth_ct_equal(t, tlen, ks->v[i], strlen(ks->v[i])); /* 0 or all ones */
        cls = (cls & ~m) | (ks->cls[i] & m);
    }
    return cls;
}

int baton_auth_key_class(baton_auth_t *a, const baton_http_req_t *req)
{
    const char *t = a ? baton_auth_bearer(req) : NULL;
    if (t == NULL)
        return BATON_PRIO_NONE;
    size_t tlen = strlen(t);
    pthread_rwlock_rdlock(&a->lock);
    int cls = keyset_class(&a->flag_keys, t, tlen, BATON_PRIO_NONE);
    cls = keyset_class(&a->file_keys, t, tlen, cls);
    pthread_rwlock_unlock(&a->lock);
    return cls;
}

/* The rate-limited identity: the API key when keys are in use, else the client's address. */
static uint64_t rate_identity(baton_auth_t *a, const baton_http_req_t *req)
{
    uint64_t h = baton_fnv1a64_step(BATON_FNV1A64_INIT, a->salt);
    const char *t = baton_auth_n_keys(a) ? baton_auth_bearer(req) : NULL;
    if (t) {
        h = baton_fnv1a64_add(h, "k:", 2);
        h = baton_fnv1a64_add_str(h, t);
    } else {
        /* "ip:port" or "[v6]:port": the address without the port. */
        const char *colon = strrchr(req->peer, ':');
        size_t len = colon ? (size_t)(colon - req->peer) : strlen(req->peer);
        h = baton_fnv1a64_add(h, "a:", 2);
        h = baton_fnv1a64_add(h, req->peer, len);
    }
    h = baton_hash_u64(h);
    return h ? h : 1;
}

int baton_auth_rate(baton_auth_t *a, const baton_http_req_t *req, uint64_t now_ns,
                    unsigned *retry_after_s_p)
{
    if (a == NULL || a->rate <= 0)
        return 1;
    uint64_t id = rate_identity(a, req);
    pthread_mutex_lock(&a->rate_lock);
    rate_slot_t *slot = NULL, *victim = NULL;
    for (size_t i = 0; i < RATE_PROBE && slot == NULL; i++) {
        rate_slot_t *s = &a->slots[(id + i) & (RATE_SLOTS - 1)];
        if (s->id == id)
            slot = s;
        else if (s->id == 0 || baton_token_bucket_full(&s->tb, a->rate, a->burst, now_ns))
            victim = victim ? victim : s;
        else if (!victim && i == RATE_PROBE - 1)
            victim = &a->slots[id & (RATE_SLOTS - 1)];
    }
    if (slot == NULL) {
        slot = victim;
        slot->id = id;
        baton_token_bucket_init(&slot->tb, a->burst, now_ns);
    }
    uint64_t wait_ms = 0;
    int ok = baton_token_bucket_take(&slot->tb, a->rate, a->burst, now_ns, &wait_ms);
    pthread_mutex_unlock(&a->rate_lock);
    if (!ok && retry_after_s_p)
        *retry_after_s_p =
            wait_ms ? (unsigned)((wait_ms + 999) / 1000) : 1; /* bounded: token_bucket.h */
    return ok;
}
