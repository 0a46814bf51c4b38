/* prompts.c — random prompts, the ShareGPT loader and JSON request bodies for baton-bench. */
#include "prompts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "baton/error.h"

static const char *const vocab[] = {
    "alpha",  "bravo",  "charlie", "delta",  "echo",    "foxtrot",  "golf",    "hotel",
    "india",  "juliet", "kilo",    "lima",   "mike",    "november", "oscar",   "papa",
    "quebec", "romeo",  "sierra",  "tango",  "uniform", "victor",   "whiskey", "xray",
    "yankee", "zulu",   "red",     "orange", "yellow",  "green",    "blue",    "indigo",
    "violet", "north",  "south",   "east",   "west",    "river",    "stone",   "cloud",
    "rain",   "wind",   "fire",    "ice",    "sand",    "wave",     "tree",    "leaf",
    "root",   "seed",   "bird",    "fish",   "horse",   "tiger",    "eagle",   "whale",
    "apple",  "bread",  "cheese",  "honey",  "lemon",   "mango",    "olive",   "pepper",
};
#define VOCAB_N (sizeof(vocab) / sizeof(vocab[0]))

int bb_random_prompt(baton_buf_t *out, bb_rng_t *rng, uint32_t n_words)
{
    /* One reservation up front: words are at most 8 bytes plus a space. */
    if (baton_buf_reserve(out, (size_t)n_words * 9 + 1))
        return BATON_ENOMEM;
    for (uint32_t i = 0; i < n_words; i++) {
        const char *w = vocab[bb_rng_u64(rng) % VOCAB_N];
        if ((i && baton_buf_append(out, " ", 1)) || baton_buf_append_str(out, w))
            return BATON_ENOMEM;
    }
    return 0;
}

/* The turns joined by newlines, as one prompt string (JSON-quoted). */
static int joined_prompt(baton_buf_t *out, const bb_turn_t *turns, size_t n)
{
    if (n == 1)
        return baton_buf_append_json_string(out, turns[0].user, turns[0].user_len);
    baton_buf_t tmp = BATON_BUF_INIT;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        if (i)
            rc = baton_buf_append(&tmp, "\n", 1);
        if (!rc)
            rc = baton_buf_append(&tmp, turns[i].user, turns[i].user_len);
        if (!rc && turns[i].assistant)
            rc = baton_buf_append(&tmp, "\n", 1) ||
                 baton_buf_append(&tmp, turns[i].assistant, turns[i].assistant_len);
    }
    if (!rc)
        rc = baton_buf_append_json_string(out, tmp.data ? tmp.data : "", tmp.len);
    baton_buf_free(&tmp);
    return rc ? BATON_ENOMEM : 0;
}

/* The words of s as ids, appended as JSON integers: FNV-1a of each word, 31 bits. */
static int append_ids(baton_buf_t *out, const char *s, size_t n, int *first)
{
    size_t k = 0;
    while (k < n) {
        while (k < n && (s[k] == ' ' || (s[k] >= '\t' && s[k] <= '\r')))
            k++;
        if (k >= n)
            break;
        uint32_t h = 2166136261u;
        while (k < n && !(s[k] == ' ' || (s[k] >= '\t' && s[k] <= '\r')))
            h = (h ^ (uint8_t)s[k++]) * 16777619u;
        if (baton_buf_printf(out, *first ? "%u" : ",%u", h & 0x7fffffffu))
            return BATON_ENOMEM;
        *first = 0;
    }
    return 0;
}

/* The turns' words as one array of token ids: what a client with its own tokenizer sends. */
static int joined_ids(baton_buf_t *out, const bb_turn_t *turns, size_t n)
{
    int first = 1, rc = baton_buf_append_str(out, "[");
    for (size_t i = 0; i < n && !rc; i++) {
        rc = append_ids(out, turns[i].user, turns[i].user_len, &first);
        if (!rc && turns[i].assistant)
            rc = append_ids(out, turns[i].assistant, turns[i].assistant_len, &first);
    }
    return rc || baton_buf_append_str(out, "]") ? BATON_ENOMEM : 0;
}

int bb_render_body(baton_buf_t *out, const bb_body_opts_t *o, const bb_turn_t *turns,
                   size_t n_turns, uint32_t max_tokens)
{
    int rc = baton_buf_append_str(out, "{");
    if (!rc && o->model) {
        rc = baton_buf_append_str(out, "\"model\":") ||
             baton_buf_append_json_string(out, o->model, strlen(o->model)) ||
             baton_buf_append_str(out, ",");
    }
    if (rc)
        return BATON_ENOMEM;
    switch (o->endpoint) {
    case BB_EP_CHAT:
        rc = baton_buf_append_str(out, "\"messages\":[");
        for (size_t i = 0; i < n_turns && !rc; i++) {
            rc = baton_buf_append_str(out, i ? ",{\"role\":\"user\",\"content\":"
                                             : "{\"role\":\"user\",\"content\":") ||
                 baton_buf_append_json_string(out, turns[i].user, turns[i].user_len) ||
                 baton_buf_append_str(out, "}");
            if (!rc && turns[i].assistant)
                rc =
                    baton_buf_append_str(out, ",{\"role\":\"assistant\",\"content\":") ||
                    baton_buf_append_json_string(out, turns[i].assistant, turns[i].assistant_len) ||
                    baton_buf_append_str(out, "}");
        }
        if (!rc)
            rc = baton_buf_printf(out, "],\"max_tokens\":%u,\"temperature\":0", max_tokens);
        break;
    case BB_EP_COMPLETIONS:
        rc =
            baton_buf_append_str(out, "\"prompt\":") ||
            (o->token_ids ? joined_ids(out, turns, n_turns) : joined_prompt(out, turns, n_turns)) ||
            baton_buf_printf(out, ",\"max_tokens\":%u,\"temperature\":0", max_tokens);
        break;
    case BB_EP_GENERATE:
        rc = (o->token_ids
                  ? baton_buf_append_str(out, "\"input_ids\":") || joined_ids(out, turns, n_turns)
                  : baton_buf_append_str(out, "\"text\":") || joined_prompt(out, turns, n_turns)) ||
             baton_buf_printf(out,
                              ",\"sampling_params\":{\"max_new_tokens\":%u,\"temperature\":0%s}",
                              max_tokens, o->ignore_eos ? ",\"ignore_eos\":true" : "");
        break;
    }
    if (!rc && o->user)
        rc = baton_buf_append_str(out, ",\"user\":") ||
             baton_buf_append_json_string(out, o->user, strlen(o->user));
    if (!rc && o->ignore_eos && o->endpoint != BB_EP_GENERATE)
        rc = baton_buf_append_str(out, ",\"ignore_eos\":true");
    if (!rc && o->stream) {
        rc = baton_buf_append_str(out, ",\"stream\":true");
        if (!rc && o->endpoint != BB_EP_GENERATE)
            rc = baton_buf_append_str(out, ",\"stream_options\":{\"include_usage\":true}");
    } else if (!rc) {
        rc = baton_buf_append_str(out, ",\"stream\":false");
    }
    if (!rc)
        rc = baton_buf_append_str(out, "}");
    return rc ? BATON_ENOMEM : 0;
}

static int take_pair(json_t *entry, const char **p, size_t *pl, const char **r, size_t *rl)
{
    json_t *conv = json_object_get(entry, "conversations");
    if (!conv)
        conv = json_object_get(entry, "conversation");
    if (!json_is_array(conv) || json_array_size(conv) < 2)
        return 0;
    json_t *a = json_object_get(json_array_get(conv, 0), "value");
    json_t *b = json_object_get(json_array_get(conv, 1), "value");
    if (!json_is_string(a) || !json_is_string(b))
        return 0;
    *p = json_string_value(a);
    *pl = json_string_length(a);
    *r = json_string_value(b);
    *rl = json_string_length(b);
    return 1;
}

int bb_dataset_load_sharegpt(bb_dataset_t *ds, const char *path, char *err, size_t errlen)
{
    memset(ds, 0, sizeof(*ds));
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) {
        snprintf(err, errlen, "%s: %s (line %d)", path, jerr.text, jerr.line);
        return BATON_EINVAL;
    }
    if (!json_is_array(root)) {
        snprintf(err, errlen, "%s: not a ShareGPT file (the top level must be an array)", path);
        json_decref(root);
        return BATON_EINVAL;
    }
    size_t n = json_array_size(root);
    ds->items = calloc(n ? n : 1, sizeof(*ds->items));
    if (!ds->items) {
        json_decref(root);
        return BATON_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        const char *p, *r;
        size_t pl, rl;
        if (!take_pair(json_array_get(root, i), &p, &pl, &r, &rl))
            continue;
        uint32_t pw = bb_count_words(p, pl), rw = bb_count_words(r, rl);
        if (pw < 4 || rw < 4 || pw > 1024 || pw + rw > 2048)
            continue;
        bb_item_t *it = &ds->items[ds->n];
        it->prompt = malloc(pl + 1);
        if (!it->prompt) {
            json_decref(root);
            bb_dataset_free(ds);
            return BATON_ENOMEM;
        }
        memcpy(it->prompt, p, pl);
        it->prompt[pl] = '\0';
        it->prompt_len = pl;
        it->prompt_words = pw;
        it->output_words = rw;
        ds->n++;
    }
    json_decref(root);
    if (ds->n == 0) {
        snprintf(err, errlen, "%s: no usable conversation (need >= 2 turns of 4..1024 words)",
                 path);
        bb_dataset_free(ds);
        return BATON_EINVAL;
    }
    return 0;
}

void bb_dataset_free(bb_dataset_t *ds)
{
    for (size_t i = 0; i < ds->n; i++)
        free(ds->items[i].prompt);
    free(ds->items);
    ds->items = NULL;
    ds->n = 0;
}
