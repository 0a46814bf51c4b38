/* tokenizer/chat_template.h — chat templates: compiling the Jinja subset that models' chat
 * templates use (tokenizer_config.json's "chat_template") and rendering a conversation with it. */
#ifndef BATON_TOKENIZER_CHAT_TEMPLATE_H
#define BATON_TOKENIZER_CHAT_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

struct json_t;

/*
 * A compiled template is IMMUTABLE: render takes it const, so one template is shared read-only
 * by any number of threads. Each render allocates its own working memory and frees it before
 * returning.
 *
 * The language is the subset of Jinja2 that the chat templates of the supported model families
 * use (docs/TOKENIZER.md lists it), with the environment Hugging Face's transformers renders
 * them in: trim_blocks and lstrip_blocks on, no autoescape, loop controls (break, continue),
 * the globals raise_exception, namespace, range, dict and strftime_now, and tojson as
 * json.dumps(ensure_ascii=False). Values behave as in Python (the engines that serve these
 * models render with Jinja2): strip('\n') strips newlines only, True prints as "True", a float
 * keeps its ".0".
 *
 * A template that uses a construct outside the subset (a statement, filter, test, global or
 * method the subset lacks) is refused by compile with a message that names the construct and
 * its line; it never renders approximately.
 *
 * Errors: 0 or a negative baton_errno_t: BATON_EINVAL (a syntax error, or at render a
 * template error such as raise_exception's message or an undefined value used), BATON_ENOTSUP
 * (a construct outside the subset), BATON_ETOOBIG (a bound below was reached), BATON_ENOMEM.
 * err receives a one-line message without internal addresses.
 */

typedef struct baton_tmpl baton_tmpl_t;

/* Bounds of one render. Zero fields take the defaults (BATON_TMPL_DEFAULT_*). */
typedef struct {
    size_t max_output;  /* bytes rendered */
    size_t max_memory;  /* bytes of working values (strings built, lists, dicts) */
    uint64_t max_steps; /* loop iterations plus macro calls, all loops together */
    unsigned max_depth; /* nesting of macro calls, evaluation and input JSON */
} baton_tmpl_limits_t;

#define BATON_TMPL_MAX_SOURCE         (512u * 1024u) /* template source bytes */
#define BATON_TMPL_DEFAULT_MAX_OUTPUT (32u * 1024u * 1024u)
#define BATON_TMPL_DEFAULT_MAX_MEMORY (256u * 1024u * 1024u)
#define BATON_TMPL_DEFAULT_MAX_STEPS  1000000u
#define BATON_TMPL_DEFAULT_MAX_DEPTH  64u

/* Compiles src[0..len) (UTF-8). On success *out owns the template (free with baton_tmpl_free). */
int baton_tmpl_compile(const char *src, size_t len, baton_tmpl_t **out, char *err, size_t errlen);

/* Renders with the variables of the JSON object vars (messages, tools, add_generation_prompt,
 * bos_token, eos_token and any other keyword the caller passes), appending to out. lim may be
 * NULL (defaults). On an error out may hold part of the output; the caller discards it. */
int baton_tmpl_render(const baton_tmpl_t *t, const struct json_t *vars,
                      const baton_tmpl_limits_t *lim, baton_buf_t *out, char *err, size_t errlen);

/* Renders an OpenAI chat request body (/v1/chat/completions) as vLLM does: messages, tools,
 * add_generation_prompt (true unless the body says false), the tokenizer's bos_token and
 * eos_token (tok may be NULL: both empty), and the keys of chat_template_kwargs (the body's own
 * fields win). The rendered prompt is to be encoded with BATON_TOK_PARSE_SPECIAL and without
 * BATON_TOK_ADD_SPECIAL (the template writes its own bos). */
struct baton_tok;
int baton_tmpl_render_chat(const baton_tmpl_t *t, const struct baton_tok *tok,
                           const struct json_t *body, const baton_tmpl_limits_t *lim,
                           baton_buf_t *out, char *err, size_t errlen);

void baton_tmpl_free(baton_tmpl_t *t);

#endif
