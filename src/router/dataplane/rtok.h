/* rtok.h — the router's tokenizers: one per model (--tokenizer), loaded once into a refcounted
 * snapshot shared read-only by every loop thread and swapped whole by a SIGHUP reload; each loop
 * keeps its own scratch, its reference to the snapshot and a cache of prompt prefixes. */
#ifndef BATON_ROUTER_RTOK_H
#define BATON_ROUTER_RTOK_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/metrics.h"
#include "router/control/config.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

/* Longest cut token (bytes) the prefix cache looks for, and how many it knows. */
#define BATON_RTOK_CUT_MAX 64

/* One model's tokenizer. */
typedef struct baton_rtok_model_s {
    char *model; /* NULL: every model without a tokenizer of its own */
    char *path;
    baton_tok_t *tok;
    baton_tmpl_t *tmpl;     /* NULL: the tokenizer has no chat_template (chat is not tokenized) */
    uint64_t max_model_len; /* --max-model-len for the model (0: no context-length check) */
    uint64_t report_len;    /* max_model_len, else tokenizer_config's model_max_length, else 0 */
    /* Completions with add_special_tokens: prepend bos as transformers does for a tokenizer
     * whose tokenizer_config says add_bos_token while its post-processor adds none (DeepSeek
     * V3): what vLLM's tokenizer call gives. */
    int add_bos;
    /* The prefix cache's cut tokens: special-token texts that no other added token overlaps,
     * so a rendered prompt cut right after one encodes as its two halves do. n_cuts 0: the
     * cache is off for this tokenizer. */
    size_t n_cuts;
    char **cuts;
    size_t *cut_lens;
    uint64_t cut_first[4]; /* bitmap of the cut tokens' first bytes */
} baton_rtok_model_t;

/* The tokenizers of one configuration. Immutable once loaded; refcounted. */
typedef struct baton_rtok_set_s {
    atomic_long refs;
    size_t n;
    baton_rtok_model_t *m;
} baton_rtok_set_t;

/* Loads every tokenizer the configuration names (cfg->tokenizers: "[MODEL=]PATH";
 * cfg->max_model_lens: "[MODEL=]N"). *out is NULL when none is configured. An unloadable one,
 * a bad entry or a --max-model-len for a model without a tokenizer is an error with a one-line
 * reason (the start is refused; a reload keeps the previous set). */
int baton_rtok_set_load(const baton_config_t *cfg, baton_rtok_set_t **out, char *err,
                        size_t errlen);
void baton_rtok_set_unref(baton_rtok_set_t *s);
/* The tokenizer for a request's model (NULL model: the default one, or the only one); NULL
 * when the router has none for it. */
const baton_rtok_model_t *baton_rtok_find(const baton_rtok_set_t *s, const char *model);

/* What is shared by the loops: the current set (swapped by a reload), the cache bounds and the
 * metrics. Thread-safe. */
typedef struct baton_rtok_s baton_rtok_t;

/* Takes the reference of `set` (may be NULL). reg may be NULL (no metrics). */
int baton_rtok_create(baton_rtok_t **out, baton_rtok_set_t *set, size_t cache_bytes,
                      size_t cache_entries, baton_metrics_t *reg);
void baton_rtok_destroy(baton_rtok_t *rt);
/* Installs a new set (its reference taken; NULL: no tokenizers); the old one is freed when the
 * last loop let go of it. */
void baton_rtok_install(baton_rtok_t *rt, baton_rtok_set_t *set);

/* One loop's side: its reference to the set, its scratch and its prefix cache. Used only by
 * its loop's thread. */
typedef struct baton_rtok_local_s baton_rtok_local_t;
baton_rtok_local_t *baton_rtok_local_new(baton_rtok_t *rt);
void baton_rtok_local_free(baton_rtok_local_t *L);
/* The current set (a reload is picked up here: one atomic load when nothing changed); NULL
 * when no tokenizer is configured. Valid until the next call on this loop. */
const baton_rtok_set_t *baton_rtok_local_set(baton_rtok_local_t *L);

/*
 * Token ids of a prompt as the engine computes them, appended to out:
 *   chat:  text is a rendered chat template; special-token text parsed, nothing added (the
 *          template writes its own bos); whole-prompt prefixes are looked up in and added to
 *          the loop's prefix cache;
 *   else:  a completion prompt; special-token text parsed, with add_special the
 *          post-processor's tokens (and the bos transformers adds, add_bos).
 * 0, BATON_EINVAL (not UTF-8) or BATON_ENOMEM.
 */
int baton_rtok_encode(baton_rtok_local_t *L, const baton_rtok_model_t *m, const char *text,
                      size_t len, int chat, int add_special, baton_tok_ids_t *out);
/* Records one routed request's tokenization (baton_tokenize_seconds from t0_ns, a uv_hrtime()
 * reading, and baton_prompt_tokens_total). */
void baton_rtok_observe(baton_rtok_local_t *L, int chat, uint64_t t0_ns, size_t n_tokens);
/* The loop's scratch (for callers that encode pieces themselves). */
baton_tok_scratch_t *baton_rtok_scratch(baton_rtok_local_t *L);

/* Metrics the request path records (NULL-safe): a context-length refusal (by the parameter
 * vLLM names: "input_tokens", "max_tokens"), a prompt left without token ids (by reason). */
void baton_rtok_count_refusal(baton_rtok_local_t *L, const char *param);
void baton_rtok_count_failure(baton_rtok_local_t *L, const char *reason);

/* The prefix cache's counters (tests and loadtest read them through /metrics). */
typedef struct baton_rtok_cache_stats_s {
    uint64_t hits, misses, tokens_reused, entries, bytes;
} baton_rtok_cache_stats_t;
void baton_rtok_cache_stats(const baton_rtok_local_t *L, baton_rtok_cache_stats_t *st);

#endif
