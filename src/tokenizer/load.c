/* load.c — reading tokenizer.json / tokenizer_config.json into an immutable baton_tok_t: the
 * BPE model (vocabulary, merges, the byte-level alphabet), freeing it, and its accessors. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "baton/error.h"
#include "common/hash.h"
#include "tokenizer/internal.h"

#define TOK_MAX_FILE (512u << 20) /* no tokenizer.json is near this; a bound for hostile input */

void tok__err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* GPT-2's byte-level alphabet: printable bytes stand for themselves, the other 68 bytes for
 * the code points 256.. in byte order. byte_of_cp[cp] is the byte, or -1. */
static void byte_level_table(int16_t byte_of_cp[324])
{
    for (int i = 0; i < 324; i++)
        byte_of_cp[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        byte_of_cp[printable ? b : 256 + n++] = (int16_t)b;
    }
}

/* Decodes one UTF-8 character at s[0..len); returns its length (0 when invalid). */
static size_t utf8_char(const unsigned char *s, size_t len, uint32_t *cp)
{
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    size_t n = s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC0 ? 2 : 0;
    if (!n || n > len)
        return 0;
    uint32_t c = s[0] & (0x7F >> n);
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        c = (c << 6) | (s[i] & 0x3F);
    }
    *cp = c;
    return n;
}

/* A byte-level token's text to its bytes (out has room for len bytes); -1 when some character
 * is outside the alphabet (the token cannot come out of byte-level BPE). */
static ssize_t byte_level_decode(const int16_t *byte_of_cp, const char *s, size_t len, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = utf8_char((const unsigned char *)s + i, len - i, &cp);
        if (!k || cp >= 324 || byte_of_cp[cp] < 0)
            return -1;
        out[o++] = (char)byte_of_cp[cp];
        i += k;
    }
    return (ssize_t)o;
}

static uint64_t pow2_at_least(uint64_t n)
{
    uint64_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

int64_t tok__vocab_lookup(const baton_tok_t *t, const char *s, size_t len)
{
    if (!t->vmap.slots)
        return -1;
    uint64_t h = baton_fnv1a64(s, len);
    for (uint64_t i = h & t->vmap.mask;; i = (i + 1) & t->vmap.mask) {
        uint32_t v = t->vmap.slots[i];
        if (!v)
            return -1;
        uint32_t id = v - 1;
        size_t n = t->off[id + 1] - t->off[id];
        if (n == len && memcmp(t->blob + t->off[id], s, len) == 0)
            return id;
    }
}

static void vmap_insert(baton_tok_t *t, uint32_t id)
{
    const char *s = t->blob + t->off[id];
    size_t len = t->off[id + 1] - t->off[id];
    if (tok__vocab_lookup(t, s, len) >= 0)
        return; /* two ids with the same bytes: the first one wins, as in a dict load */
    uint64_t h = baton_fnv1a64(s, len);
    uint64_t i = h & t->vmap.mask;
    while (t->vmap.slots[i])
        i = (i + 1) & t->vmap.mask;
    t->vmap.slots[i] = id + 1;
}

static void merge_put(tok_merge_map_t *m, uint64_t key, uint64_t val)
{
    key += 1;
    for (uint64_t i = baton_hash_u64(key) & m->mask;; i = (i + 1) & m->mask) {
        if (m->keys[i] == 0 || m->keys[i] == key) {
            m->keys[i] = key; /* a repeated pair keeps its last rank, as a map built in order */
            m->vals[i] = val;
            return;
        }
    }
}

/* A merge's two halves: ["a", "b"] or "a b". */
static int merge_parts(json_t *m, const char **a, size_t *alen, const char **b, size_t *blen)
{
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *alen = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *blen = json_string_length(json_array_get(m, 1));
        return 0;
    }
    if (!json_is_string(m))
        return -1;
    const char *s = json_string_value(m);
    size_t len = json_string_length(m);
    const char *sp = memchr(s, ' ', len);
    if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - s)))
        return -1; /* exactly one space, as the reference parsers require */
    *a = s;
    *alen = (size_t)(sp - s);
    *b = sp + 1;
    *blen = len - *alen - 1;
    return 0;
}

static int64_t vocab_id(json_t *vocab, const char *s, size_t len)
{
    json_t *v = json_object_getn(vocab, s, len);
    return json_is_integer(v) ? json_integer_value(v) : -1;
}

static int parse_merges(baton_tok_t *t, json_t *vocab, json_t *merges, char *err, size_t errlen)
{
    size_t n = json_array_size(merges);
    t->merges.mask = pow2_at_least(n * 2 + 1) - 1;
    t->merges.keys = calloc(t->merges.mask + 1, sizeof(uint64_t));
    t->merges.vals = calloc(t->merges.mask + 1, sizeof(uint64_t));
    char *cat = NULL;
    size_t cat_cap = 0;
    if (!t->merges.keys || !t->merges.vals)
        return BATON_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const char *a, *b;
        size_t alen, blen;
        if (merge_parts(json_array_get(merges, i), &a, &alen, &b, &blen) < 0) {
            free(cat);
            tok__err(err, errlen, "model.merges[%zu] is not a pair of tokens", i);
            return BATON_EINVAL;
        }
        if (alen + blen > cat_cap) {
            cat_cap = (alen + blen) * 2 + 16;
            char *nc = realloc(cat, cat_cap);
            if (!nc) {
                free(cat);
                return BATON_ENOMEM;
            }
            cat = nc;
        }
        memcpy(cat, a, alen);
        memcpy(cat + alen, b, blen);
        int64_t ia = vocab_id(vocab, a, alen), ib = vocab_id(vocab, b, blen);
        int64_t ic = vocab_id(vocab, cat, alen + blen);
        if (ia < 0 || ib < 0 || ic < 0) {
            free(cat);
            /* The reference would merge into a token it then cannot name: refuse. */
            tok__err(err, errlen, "model.merges[%zu] names a token outside the vocabulary", i);
            return BATON_ENOTSUP;
        }
        merge_put(&t->merges, ((uint64_t)ia << 32) | (uint64_t)ib,
                  ((uint64_t)i << 32) | (uint64_t)ic);
    }
    free(cat);
    return 0;
}

/* Collects the vocabulary into t (ids, bytes), byte-level decoding each entry. Added tokens
 * are placed later (tok__parse_added) and may take ids beyond it. */
int tok__parse_model(baton_tok_t *t, json_t *root, char *err, size_t errlen)
{
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) {
        tok__err(err, errlen, "tokenizer.json has no \"model\" object");
        return BATON_EINVAL;
    }
    json_t *type = json_object_get(model, "type");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    if (type && !(json_is_string(type) && strcmp(json_string_value(type), "BPE") == 0)) {
        tok__err(err, errlen, "model type %s is not supported (only BPE)",
                 json_is_string(type) ? json_string_value(type) : "(not a string)");
        return BATON_ENOTSUP;
    }
    if (!json_is_object(vocab) || !json_is_array(merges)) {
        tok__err(err, errlen, "model BPE needs a \"vocab\" object and a \"merges\" array");
        return BATON_EINVAL;
    }
    json_t *v;
    if ((v = json_object_get(model, "dropout")) && !json_is_null(v)) {
        tok__err(err, errlen, "model BPE with dropout is not supported (it is not deterministic)");
        return BATON_ENOTSUP;
    }
    const char *affix_keys[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++) {
        v = json_object_get(model, affix_keys[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0)) {
            tok__err(err, errlen, "model BPE %s is not supported", affix_keys[i]);
            return BATON_ENOTSUP;
        }
    }
    bool byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
    if (t->byte_level && byte_fallback) {
        tok__err(err, errlen,
                 "model BPE byte_fallback with a ByteLevel pre-tokenizer is not "
                 "supported");
        return BATON_ENOTSUP;
    }
    if (!t->byte_level && !byte_fallback) {
        /* Without byte tokens an unknown character becomes unk_token (fused or not): not
         * reproduced. */
        tok__err(err, errlen, "model BPE without ByteLevel needs byte_fallback");
        return BATON_ENOTSUP;
    }
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));

    /* Sizes first: the largest id, the bytes of all entries. */
    int64_t max_id = -1;
    size_t total = 0;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val)
    {
        if (!json_is_integer(val) || json_integer_value(val) < 0 ||
            json_integer_value(val) >= (1 << 24)) {
            tok__err(err, errlen, "model.vocab has an entry whose id is not a small integer");
            return BATON_EINVAL;
        }
        if (json_integer_value(val) > max_id)
            max_id = json_integer_value(val);
        total += strlen(key);
    }
    if (max_id < 0) {
        tok__err(err, errlen, "model.vocab is empty");
        return BATON_EINVAL;
    }
    /* Ids go up to 2^24; added tokens may extend past the vocabulary (grown in parse_added). */
    t->n_ids = (uint32_t)max_id + 1;
    t->off = calloc((size_t)t->n_ids + 1, sizeof(uint64_t));
    t->flags = calloc(t->n_ids, 1);
    uint32_t *len = calloc(t->n_ids, sizeof(uint32_t));
    char **src = calloc(t->n_ids, sizeof(char *));
    t->blob = malloc(total + 1);
    if (!t->off || !t->flags || !len || !src || !t->blob) {
        free(len);
        free(src);
        return BATON_ENOMEM;
    }
    int16_t byte_of_cp[324];
    byte_level_table(byte_of_cp);
    char *tmp = malloc(total + 1);
    if (!tmp) {
        free(len);
        free(src);
        return BATON_ENOMEM;
    }
    /* Decode into tmp (keyed per id), then lay out in id order. */
    size_t used = 0;
    json_object_foreach(vocab, key, val)
    {
        uint32_t id = (uint32_t)json_integer_value(val);
        size_t klen = strlen(key);
        if (src[id]) {
            free(len);
            free(src);
            free(tmp);
            tok__err(err, errlen, "model.vocab gives id %u to two tokens", id);
            return BATON_EINVAL;
        }
        ssize_t bl = t->byte_level ? byte_level_decode(byte_of_cp, key, klen, tmp + used) : -1;
        if (!t->byte_level) {
            memcpy(tmp + used, key, klen); /* SentencePiece-style: the text is the token */
            bl = (ssize_t)klen;
            t->flags[id] |= TOKF_VOCAB;
        } else if (bl < 0) {
            /* Not a byte-level string: byte-level BPE can never produce it; it keeps its text
             * (an added token usually claims it). */
            memcpy(tmp + used, key, klen);
            bl = (ssize_t)klen;
            t->flags[id] |= TOKF_TEXT;
        } else {
            t->flags[id] |= TOKF_VOCAB;
        }
        src[id] = tmp + used;
        len[id] = (uint32_t)bl;
        used += (size_t)bl;
    }
    uint64_t o = 0;
    for (uint32_t id = 0; id < t->n_ids; id++) {
        t->off[id] = o;
        if (src[id]) {
            memcpy(t->blob + o, src[id], len[id]);
            o += len[id];
        }
    }
    t->off[t->n_ids] = o;
    free(tmp);
    free(src);
    free(len);

    t->vmap.mask = pow2_at_least((uint64_t)t->n_ids * 2 + 1) - 1;
    t->vmap.slots = calloc(t->vmap.mask + 1, sizeof(uint32_t));
    if (!t->vmap.slots)
        return BATON_ENOMEM;
    for (uint32_t id = 0; id < t->n_ids; id++)
        if (t->flags[id] & TOKF_VOCAB)
            vmap_insert(t, id);
    for (int b = 0; b < 256; b++) {
        char c[8];
        size_t clen = 1;
        c[0] = (char)b;
        if (!t->byte_level)
            clen = (size_t)snprintf(c, sizeof(c), "<0x%02X>", b);
        int64_t id = tok__vocab_lookup(t, c, clen);
        if (id < 0 && !t->byte_level && b < 0x80) {
            /* An ASCII character that is a token itself never falls back to its byte. */
            char ch = (char)b;
            id = tok__vocab_lookup(t, &ch, 1);
            if (id >= 0) {
                t->byte_id[b] = (uint32_t)id;
                continue;
            }
        }
        if (id < 0) {
            tok__err(err, errlen, "model.vocab lacks the %s token of byte 0x%02x",
                     t->byte_level ? "byte-level" : "byte_fallback", b);
            return BATON_ENOTSUP;
        }
        t->byte_id[b] = (uint32_t)id;
        if (!t->byte_level)
            t->flags[id] |= TOKF_BYTE;
    }
    return parse_merges(t, vocab, merges, err, errlen);
}

static int read_file(const char *path, char **data_p, size_t *len_p)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > TOK_MAX_FILE) {
        int e = S_ISREG(st.st_mode) ? BATON_ETOOBIG : BATON_EINVAL;
        close(fd);
        return e;
    }
    char *d = malloc((size_t)st.st_size + 1);
    if (!d) {
        close(fd);
        return BATON_ENOMEM;
    }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, d + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    d[got] = 0;
    *data_p = d;
    *len_p = got;
    return 0;
}

int baton_tok_load(const char *path, baton_tok_t **tok_p, char *err, size_t errlen)
{
    *tok_p = NULL;
    struct stat st;
    if (!path || stat(path, &st) < 0) {
        int e = path ? -errno : BATON_EINVAL;
        tok__err(err, errlen, "tokenizer path not found");
        return e;
    }
    size_t plen = strlen(path);
    char *json_path = malloc(plen + 32), *cfg_path = malloc(plen + 32);
    if (!json_path || !cfg_path) {
        free(json_path);
        free(cfg_path);
        return BATON_ENOMEM;
    }
    if (S_ISDIR(st.st_mode)) {
        snprintf(json_path, plen + 32, "%s/tokenizer.json", path);
        snprintf(cfg_path, plen + 32, "%s/tokenizer_config.json", path);
    } else {
        memcpy(json_path, path, plen + 1);
        const char *slash = strrchr(path, '/');
        size_t dir = slash ? (size_t)(slash - path) + 1 : 0;
        memcpy(cfg_path, path, dir);
        memcpy(cfg_path + dir, "tokenizer_config.json", sizeof("tokenizer_config.json"));
    }
    char *data = NULL, *cfg = NULL;
    size_t len = 0, cfg_len = 0;
    int rc = read_file(json_path, &data, &len);
    if (rc < 0) {
        tok__err(err, errlen, "cannot read tokenizer.json: %s", baton_strerror(rc));
    } else {
        int crc = read_file(cfg_path, &cfg, &cfg_len);
        if (crc < 0 && crc != -ENOENT) {
            tok__err(err, errlen, "cannot read tokenizer_config.json: %s", baton_strerror(crc));
            rc = crc;
        } else {
            rc = baton_tok_load_json(data, len, cfg, cfg_len, tok_p, err, errlen);
        }
    }
    free(data);
    free(cfg);
    free(json_path);
    free(cfg_path);
    return rc;
}

int baton_tok_load_json(const char *tokenizer_json, size_t len, const char *config_json,
                        size_t config_len, baton_tok_t **tok_p, char *err, size_t errlen)
{
    static uint64_t generations; /* distinct per load, so a scratch can tell loads apart */
    *tok_p = NULL;
    json_error_t je;
    json_t *root = json_loadb(tokenizer_json, len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(root)) {
        tok__err(err, errlen, "tokenizer.json is not a JSON object (line %d: %s)", je.line,
                 je.text);
        json_decref(root);
        return BATON_EINVAL;
    }
    baton_tok_t *t = calloc(1, sizeof(*t));
    if (!t) {
        json_decref(root);
        return BATON_ENOMEM;
    }
    t->bos_id = t->eos_id = -1;
    t->generation = __atomic_add_fetch(&generations, 1, __ATOMIC_RELAXED);
    if (config_json) {
        t->config = json_loadb(config_json, config_len, JSON_DECODE_INT_AS_REAL, &je);
        if (!json_is_object(t->config)) {
            tok__err(err, errlen, "tokenizer_config.json is not a JSON object (line %d: %s)",
                     je.line, je.text);
            json_decref(root);
            baton_tok_free(t);
            return BATON_EINVAL;
        }
    }
    int rc = tok__parse_pipeline(t, root, err, errlen);
    if (rc == 0)
        rc = tok__parse_model(t, root, err, errlen);
    if (rc == 0)
        rc = tok__parse_added(t, root, err, errlen);
    if (rc == 0)
        rc = tok__parse_post(t, root, err, errlen);
    json_decref(root);
    if (rc < 0) {
        if (rc == BATON_ENOMEM)
            tok__err(err, errlen, "out of memory loading the tokenizer");
        baton_tok_free(t);
        return rc;
    }
    tok__config(t);
    *tok_p = t;
    return 0;
}

static void added_set_free(tok_added_set_t *s)
{
    free(s->ids);
}

void baton_tok_free(baton_tok_t *t)
{
    if (!t)
        return;
    free(t->off);
    free(t->blob);
    free(t->flags);
    free(t->vmap.slots);
    free(t->merges.keys);
    free(t->merges.vals);
    for (int i = 0; i < t->n_splits; i++)
        pcre2_code_free(t->splits[i].re);
    for (int i = 0; i < t->n_norms; i++) {
        free(t->norms[i].a);
        free(t->norms[i].b);
    }
    added_set_free(&t->added_raw);
    added_set_free(&t->added_norm);
    json_decref(t->config);
    free(t);
}

uint32_t baton_tok_vocab_size(const baton_tok_t *t)
{
    return t->n_ids;
}

const char *baton_tok_token_bytes(const baton_tok_t *t, uint32_t id, size_t *len_p)
{
    if (id >= t->n_ids || !(t->flags[id] & TOKF_KNOWN))
        return NULL;
    *len_p = t->off[id + 1] - t->off[id];
    return t->blob + t->off[id];
}

int baton_tok_is_special(const baton_tok_t *t, uint32_t id)
{
    return id < t->n_ids && (t->flags[id] & TOKF_SPECIAL);
}

int baton_tok_is_added(const baton_tok_t *t, uint32_t id)
{
    return id < t->n_ids && (t->flags[id] & TOKF_ADDED);
}

int64_t baton_tok_token_id(const baton_tok_t *t, const char *text, size_t len)
{
    for (int s = 0; s < 2; s++) {
        const tok_added_set_t *set = s ? &t->added_norm : &t->added_raw;
        for (uint32_t i = 0; i < set->n; i++) {
            uint32_t id = set->ids[i];
            if (t->off[id + 1] - t->off[id] == len && memcmp(t->blob + t->off[id], text, len) == 0)
                return id;
        }
    }
    return tok__vocab_lookup(t, text, len);
}

int64_t baton_tok_bos_id(const baton_tok_t *t)
{
    return t->bos_id;
}

int64_t baton_tok_eos_id(const baton_tok_t *t)
{
    return t->eos_id;
}

const struct json_t *baton_tok_config_json(const baton_tok_t *t)
{
    return t->config;
}

uint64_t baton_tok_model_max_length(const baton_tok_t *t)
{
    return t->model_max_length;
}

const char *baton_tok_config_str(const baton_tok_t *t, const char *key)
{
    json_t *v = t->config ? json_object_get(t->config, key) : NULL;
    if (json_is_object(v))
        v = json_object_get(v, "content");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

void tok__config(baton_tok_t *t)
{
    const char *bos = baton_tok_config_str(t, "bos_token");
    const char *eos = baton_tok_config_str(t, "eos_token");
    if (bos)
        t->bos_id = baton_tok_token_id(t, bos, strlen(bos));
    if (eos)
        t->eos_id = baton_tok_token_id(t, eos, strlen(eos));
    json_t *m = t->config ? json_object_get(t->config, "model_max_length") : NULL;
    /* transformers writes a huge placeholder (1e30) when the length is unknown. */
    if (json_is_integer(m) && json_integer_value(m) > 0 && json_integer_value(m) < (1ll << 40))
        t->model_max_length = (uint64_t)json_integer_value(m);
    else if (json_is_real(m) && json_real_value(m) > 0 && json_real_value(m) < 1e12)
        t->model_max_length = (uint64_t)json_real_value(m);
}
