/* wtok.h — baton-worker's optional real tokenizer (--tokenizer): prompts become the model's token
 * ids and chat messages are rendered with the model's chat template, with the same code as the
 * router; without it the worker keeps its word tokenizer (simtext.h). */
#ifndef BATON_WORKER_WTOK_H
#define BATON_WORKER_WTOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

struct json_t;

/* Loads the tokenizer (a directory with tokenizer.json, or the file) and compiles its
 * tokenizer_config.json chat_template when it has one. Once, before any request; 0 or an error
 * with a one-line reason (an unsupported tokenizer or template is refused, never used
 * approximately). */
int wk_tok_load(const char *path, char *err, size_t errlen);
void wk_tok_unload(void);
bool wk_tok_enabled(void);
/* Whether a chat template was loaded (chat prompts are rendered with it). */
bool wk_tok_has_template(void);

/* The ids of a prompt text, in a malloc'd array (*ids_p, *n_p). chat: a rendered template
 * (special-token text is parsed, nothing added); otherwise a completion prompt (the
 * post-processor's tokens added, special-token text parsed, as vLLM's tokenizer call does).
 * 0, BATON_EINVAL (not UTF-8) or BATON_ENOMEM. Any thread. */
int wk_tok_encode(const char *s, size_t len, bool chat, int64_t **ids_p, uint32_t *n_p);

/* Renders a chat body's messages (with tools, add_generation_prompt — true unless the body says
 * false — and chat_template_kwargs) with the model's template into out. A template error is
 * BATON_EINVAL with its message in err. */
/* POST /tokenize (detok 0) or /detokenize (1) in vLLM's shapes (tokenizer/tok_api.h): 0 and
 * *resp, 1 (a bad request: *e), or BATON_ENOMEM. Only with a tokenizer loaded. */
struct baton_tok_api_err_s;
int wk_tok_api(int detok, const char *body, size_t len, struct json_t **resp,
               struct baton_tok_api_err_s *e);

int wk_tok_render_chat(const struct json_t *body, baton_buf_t *out, char *err, size_t errlen);

#endif
