/* simtext.c — the simulated model's deterministic text (definition in simtext.h, docs/WORKER.md).
 */
#include "worker/simtext.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/hash.h"
#include "common/rand.h"

/* 64 plain ASCII words; none contains whitespace. Order matters: token id = index. */
const char *const wk_sim_vocab[WK_SIM_VOCAB_SIZE] = {
    "the",   "of",    "and",   "to",    "in",    "is",    "it",    "that",  "for",   "on",
    "with",  "as",    "was",   "at",    "by",    "be",    "this",  "from",  "or",    "an",
    "are",   "not",   "but",   "have",  "all",   "can",   "new",   "one",   "more",  "time",
    "data",  "model", "token", "batch", "cache", "route", "layer", "page",  "queue", "fast",
    "slow",  "river", "stone", "cloud", "light", "north", "south", "green", "blue",  "red",
    "seven", "eight", "nine",  "ten",   "apple", "bread", "lamp",  "door",  "road",  "hill",
    "wind",  "rain",  "snow",  "star",
};

uint64_t wk_sim_fnv1a(const void *data, size_t len)
{
    return baton_fnv1a64(data, len);
}

uint64_t wk_sim_mix(uint64_t seed, uint64_t k)
{
    return baton_mix64(seed + k * WK_SIM_GOLDEN);
}

uint64_t wk_sim_seed_text(const char *s, size_t len)
{
    return wk_sim_fnv1a(s, len);
}

uint64_t wk_sim_seed_ids(const int64_t *ids, size_t n)
{
    /* FNV-1a over "id id id" without materialising the string. */
    uint64_t h = BATON_FNV1A64_INIT;
    char num[32];
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            h = baton_fnv1a64_step(h, ' ');
        int m = snprintf(num, sizeof(num), "%lld", (long long)ids[i]);
        h = baton_fnv1a64_add(h, num, (size_t)m);
    }
    return h;
}

static int is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

uint32_t wk_sim_count_words(const char *s, size_t len)
{
    uint32_t n = 0;
    int in_word = 0;
    for (size_t i = 0; i < len; i++) {
        if (is_ws((unsigned char)s[i])) {
            in_word = 0;
        } else if (!in_word) {
            in_word = 1;
            if (n < UINT32_MAX)
                n++;
        }
    }
    return n ? n : 1;
}

int64_t wk_sim_word_id(const char *w, size_t len)
{
    return (int64_t)(wk_sim_fnv1a(w, len) & 0x7fffffffULL);
}

uint32_t wk_sim_word_ids(const char *s, size_t len, int64_t *out, uint32_t cap)
{
    uint32_t n = 0;
    size_t i = 0;
    while (i < len) {
        while (i < len && is_ws((unsigned char)s[i]))
            i++;
        if (i == len)
            break;
        size_t start = i;
        while (i < len && !is_ws((unsigned char)s[i]))
            i++;
        if (n < cap)
            out[n] = wk_sim_word_id(s + start, i - start);
        if (n < UINT32_MAX)
            n++;
    }
    if (n == 0) {
        if (cap > 0)
            out[0] = wk_sim_word_id("", 0);
        n = 1;
    }
    return n;
}

int32_t wk_sim_token(uint64_t seed, uint32_t i)
{
    return (int32_t)(wk_sim_mix(seed, (uint64_t)i + 1) % WK_SIM_VOCAB_SIZE);
}

double wk_sim_logprob_of(uint64_t z)
{
    return -((double)((z >> 56) + 1) / 256.0);
}

double wk_sim_output_logprob(uint64_t seed, uint32_t i)
{
    return wk_sim_logprob_of(wk_sim_mix(seed, (uint64_t)i + 1));
}

double wk_sim_input_logprob(uint64_t seed, uint32_t j)
{
    return wk_sim_logprob_of(wk_sim_mix(seed, WK_SIM_INPUT_BASE + j));
}

const char *wk_sim_word(int64_t id)
{
    if (id < 0 || id >= WK_SIM_VOCAB_SIZE)
        return "";
    return wk_sim_vocab[id];
}

/* ---- generation state ---- */

void wk_gen_init(wk_gen_t *g, uint64_t seed, uint32_t max_tokens, const wk_stop_t *stop)
{
    memset(g, 0, sizeof(*g));
    g->seed = seed;
    g->max_tokens = max_tokens;
    g->matched_str = -1;
    g->matched_id = -1;
    if (stop != NULL)
        g->stop = *stop;
    for (size_t i = 0; i < g->stop.n; i++)
        if (g->stop.lens[i] > g->max_stop_len)
            g->max_stop_len = g->stop.lens[i];
    if (max_tokens == 0)
        g->finish = WK_FINISH_LENGTH;
}

void wk_gen_free(wk_gen_t *g)
{
    free(g->ids);
    free(g->tok_end);
    baton_buf_free(&g->text);
    g->ids = NULL;
    g->tok_end = NULL;
}

int32_t wk_gen_next_id(const wk_gen_t *g)
{
    return wk_sim_token(g->seed, g->n_tokens);
}

static void finish(wk_gen_t *g, wk_finish_t why, size_t final_len)
{
    g->finish = why;
    g->final_len = final_len;
}

/* Earliest stop-string occurrence that ends after `old_len` (none can end before it). */
static int find_stop(const wk_gen_t *g, size_t old_len, size_t *pos_p)
{
    int best = -1;
    size_t best_pos = 0;
    for (size_t i = 0; i < g->stop.n; i++) {
        size_t sl = g->stop.lens[i];
        if (sl == 0 || sl > g->text.len)
            continue;
        size_t from = old_len + 1 > sl ? old_len + 1 - sl : 0;
        const char *hit = memmem(g->text.data + from, g->text.len - from, g->stop.strs[i], sl);
        if (hit == NULL)
            continue;
        size_t pos = (size_t)(hit - g->text.data);
        if (best < 0 || pos < best_pos) {
            best = (int)i;
            best_pos = pos;
        }
    }
    if (best >= 0)
        *pos_p = best_pos;
    return best;
}

int wk_gen_push(wk_gen_t *g, int32_t id)
{
    if (g->finish != WK_FINISH_NONE)
        return BATON_EINVAL;
    if (g->n_tokens == g->ids_cap) {
        uint32_t cap = g->ids_cap ? g->ids_cap * 2 : 16;
        if (cap > g->max_tokens)
            cap = g->max_tokens;
        if (cap <= g->n_tokens)
            cap = g->n_tokens + 1;
        int32_t *ids = realloc(g->ids, cap * sizeof(*ids));
        if (ids == NULL)
            return BATON_ENOMEM;
        g->ids = ids;
        size_t *ends = realloc(g->tok_end, cap * sizeof(*ends));
        if (ends == NULL)
            return BATON_ENOMEM;
        g->tok_end = ends;
        g->ids_cap = cap;
    }
    for (size_t i = 0; i < g->stop.n_ids; i++) {
        if (g->stop.ids[i] == id) {
            g->ids[g->n_tokens] = id;
            g->tok_end[g->n_tokens] = g->text.len;
            g->n_tokens++;
            g->matched_id = id;
            finish(g, WK_FINISH_STOP, g->text.len);
            return 0;
        }
    }
    size_t old_len = g->text.len;
    const char *w = wk_sim_word(id);
    size_t wl = strlen(w);
    if (baton_buf_reserve(&g->text, wl + 1) != 0)
        return BATON_ENOMEM;
    if (g->text.len > 0)
        baton_buf_append(&g->text, " ", 1);
    baton_buf_append(&g->text, w, wl);
    g->ids[g->n_tokens] = id;
    g->tok_end[g->n_tokens] = g->text.len;
    g->n_tokens++;
    size_t pos;
    int s = find_stop(g, old_len, &pos);
    if (s >= 0) {
        g->matched_str = s;
        finish(g, WK_FINISH_STOP, pos);
    } else if (g->n_tokens >= g->max_tokens) {
        finish(g, WK_FINISH_LENGTH, g->text.len);
    }
    return 0;
}

size_t wk_gen_visible_len(const wk_gen_t *g)
{
    if (g->finish != WK_FINISH_NONE)
        return g->final_len;
    size_t len = g->text.len;
    size_t hold = 0;
    for (size_t i = 0; i < g->stop.n; i++) {
        size_t sl = g->stop.lens[i];
        /* longest k < sl with text ending in stop[0:k] */
        size_t k = sl > 0 ? sl - 1 : 0;
        if (k > len)
            k = len;
        for (; k > hold; k--) {
            if (memcmp(g->text.data + len - k, g->stop.strs[i], k) == 0) {
                hold = k;
                break;
            }
        }
    }
    return len - hold;
}

int wk_gen_token_text(const wk_gen_t *g, uint32_t i, baton_buf_t *out)
{
    if (i >= g->n_tokens)
        return BATON_EINVAL;
    if (i > 0 && baton_buf_append(out, " ", 1) != 0)
        return BATON_ENOMEM;
    return baton_buf_append_str(out, wk_sim_word(g->ids[i]));
}
