/* tok_api.c — vLLM's /tokenize and /detokenize bodies over a loaded tokenizer, and the bos
 * transformers adds to a prompt: shared by the router and the worker. */
#include "tokenizer/tok_api.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"

int baton_tok_prompt_adds_bos(const baton_tok_t *tok, baton_tok_scratch_t *sc)
{
    const json_t *cfg = baton_tok_config_json(tok);
    size_t n = 1;
    if (!cfg || !json_is_true(json_object_get(cfg, "add_bos_token")) || baton_tok_bos_id(tok) < 0)
        return 0;
    return baton_tok_count(tok, sc, "", 0, BATON_TOK_ADD_SPECIAL, &n) == 0 && n == 0;
}

json_t *baton_tok_api_error_json(const char *message, const char *param)
{
    return json_pack("{s:{s:s,s:s,s:s?,s:i}}", "error", "message", message, "type",
                     "BadRequestError", "param", param, "code", 400);
}

/* GPT-2's byte-to-character map of byte-level vocabularies: printable Latin-1 bytes stand for
 * themselves, the others for U+0100 upwards in byte order. */
static size_t byte_char(unsigned char b, char out[2])
{
    unsigned cp;
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) {
        cp = b;
    } else {
        unsigned n = 0;
        for (unsigned x = 0; x < b; x++)
            if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE))
                n++;
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* A token's string as transformers' convert_ids_to_tokens gives it: an added token's content,
 * else the vocabulary entry (byte-level: its bytes through GPT-2's map). */
static json_t *token_str(const baton_tok_t *tok, uint32_t id)
{
    size_t len;
    const char *b = baton_tok_token_bytes(tok, id, &len);
    if (!b)
        return json_null();
    if (baton_tok_is_added(tok, id)) /* an added token keeps its content */
        return json_stringn(b, len);
    char buf[256];
    size_t o = 0;
    for (size_t i = 0; i < len && o + 2 <= sizeof(buf); i++)
        o += byte_char((unsigned char)b[i], buf + o);
    return json_stringn(buf, o);
}

__attribute__((format(printf, 3, 4))) static int bad(baton_tok_api_err_t *ref, const char *param,
                                                     const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ref->param = param;
    vsnprintf(ref->message, sizeof(ref->message), fmt, ap);
    va_end(ap);
    return 1;
}

/* A boolean field with its default; -1 when present but not a boolean. */
static int get_bool(const json_t *body, const char *key, int dflt)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v))
        return dflt;
    return json_is_boolean(v) ? json_is_true(v) : -1;
}

int baton_tok_api_tokenize(const baton_tok_api_t *a, const json_t *body, json_t **resp,
                           baton_tok_api_err_t *ref)
{
    json_t *msgs = json_object_get(body, "messages"), *prompt = json_object_get(body, "prompt");
    int chat = msgs != NULL;
    int add_special = get_bool(body, "add_special_tokens", chat ? 0 : 1);
    int strs = get_bool(body, "return_token_strs", 0);
    if (add_special < 0)
        return bad(ref, "add_special_tokens", "'%s' must be a boolean", "add_special_tokens");
    if (strs < 0)
        return bad(ref, "return_token_strs", "'%s' must be a boolean", "return_token_strs");
    baton_tok_ids_t ids = BATON_TOK_IDS_INIT;
    int rc;
    if (chat) {
        if (!json_is_array(msgs))
            return bad(ref, "messages", "'%s' must be a list of messages", "messages");
        if (get_bool(body, "add_generation_prompt", 1) < 0)
            return bad(ref, "add_generation_prompt", "'%s' must be a boolean",
                       "add_generation_prompt");
        if (get_bool(body, "continue_final_message", 0) != 0)
            return bad(ref, "continue_final_message",
                       "'%s' is not supported by the router's tokenizer", "continue_final_message");
        if (!a->tmpl)
            return bad(ref, "messages", "%s",
                       "the model's tokenizer_config.json has no chat_template");
        baton_buf_t text = BATON_BUF_INIT;
        char err[256] = "";
        rc = baton_tmpl_render_chat(a->tmpl, a->tok, body, NULL, &text, err, sizeof(err));
        if (rc == 0)
            rc = a->encode(a->arg, text.data ? text.data : "", text.len, !add_special, add_special,
                           &ids);
        baton_buf_free(&text);
        if (rc && rc != BATON_ENOMEM) {
            baton_tok_ids_free(&ids);
            return bad(ref, "messages", "chat template: %s", err[0] ? err : baton_strerror(rc));
        }
    } else {
        if (!json_is_string(prompt))
            return bad(ref, "prompt", "'%s' must be a string (or give 'messages')", "prompt");
        rc = a->encode(a->arg, json_string_value(prompt), json_string_length(prompt), 0,
                       add_special, &ids);
        if (rc == BATON_EINVAL)
            return bad(ref, "prompt", "'%s' is not valid UTF-8", "prompt");
    }
    if (rc) {
        baton_tok_ids_free(&ids);
        return rc;
    }
    if (ids.len > BATON_TOK_API_MAX_IDS) {
        baton_tok_ids_free(&ids);
        return bad(ref, "prompt", "%s", "the prompt is too long to tokenize here");
    }
    json_t *toks = json_array(), *ts = strs ? json_array() : NULL;
    for (size_t i = 0; toks && i < ids.len; i++) {
        json_array_append_new(toks, json_integer(ids.ids[i]));
        if (ts)
            json_array_append_new(ts, token_str(a->tok, ids.ids[i]));
    }
    *resp = json_pack("{s:I,s:I,s:o*}", "count", (json_int_t)ids.len, "max_model_len",
                      (json_int_t)a->max_model_len, "tokens", toks);
    if (*resp && ts)
        json_object_set_new(*resp, "token_strs", ts);
    else
        json_decref(ts);
    baton_tok_ids_free(&ids);
    return *resp ? 0 : BATON_ENOMEM;
}

int baton_tok_api_detokenize(const baton_tok_api_t *a, const json_t *body, json_t **resp,
                             baton_tok_api_err_t *ref)
{
    json_t *toks = json_object_get(body, "tokens"), *v;
    if (!json_is_array(toks))
        return bad(ref, "tokens", "'%s' must be a list of token ids", "tokens");
    size_t n = json_array_size(toks), i;
    if (n > BATON_TOK_API_MAX_IDS)
        return bad(ref, "tokens", "%s", "too many tokens");
    uint32_t *ids = malloc((n ? n : 1) * sizeof(*ids));
    if (!ids)
        return BATON_ENOMEM;
    uint32_t vocab = baton_tok_vocab_size(a->tok);
    json_array_foreach(toks, i, v)
    {
        json_int_t x = json_is_integer(v) ? json_integer_value(v) : -1;
        size_t len;
        if (x < 0 || x >= (json_int_t)vocab || !baton_tok_token_bytes(a->tok, (uint32_t)x, &len)) {
            free(ids);
            char num[32];
            snprintf(num, sizeof(num), "%zu", i);
            return bad(ref, "tokens", "tokens[%s] is not an id of the model's vocabulary", num);
        }
        ids[i] = (uint32_t)x;
    }
    baton_buf_t out = BATON_BUF_INIT;
    /* vLLM decodes with skip_special_tokens off: specials are in the text */
    int rc = baton_tok_decode(a->tok, ids, n, 0, &out);
    free(ids);
    if (rc == 0) {
        /* a cut inside a character decodes as U+FFFD, as Python's errors="replace" */
        baton_buf_t fixed = BATON_BUF_INIT;
        const unsigned char *p = (const unsigned char *)(out.data ? out.data : "");
        for (size_t k = 0; k < out.len && rc == 0;) {
            size_t cl = p[k] < 0x80         ? 1
                        : (p[k] >> 5) == 6  ? 2
                        : (p[k] >> 4) == 14 ? 3
                        : (p[k] >> 3) == 30 ? 4
                                            : 0;
            int ok = cl && k + cl <= out.len;
            for (size_t j = 1; ok && j < cl; j++)
                ok = (p[k + j] & 0xC0) == 0x80;
            rc = ok ? baton_buf_append(&fixed, (const char *)p + k, cl)
                    : baton_buf_append(&fixed, "\xEF\xBF\xBD", 3);
            k += ok ? cl : 1;
        }
        if (rc == 0)
            *resp = json_pack("{s:s%}", "prompt", fixed.data ? fixed.data : "", fixed.len);
        baton_buf_free(&fixed);
    }
    baton_buf_free(&out);
    return rc ? rc : *resp ? 0 : BATON_ENOMEM;
}
