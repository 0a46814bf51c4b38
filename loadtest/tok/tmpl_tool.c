/* loadtest/tok/tmpl_tool.c — baton-tmpl: chat templates from the command line, for the
 * template tests against the reference renderer and for timing renders.
 *   baton-tmpl CASES.json   CASES = {"template": "...", "cases": [VARS, ...]}; prints a JSON
 *                           array, per case {"text": "..."} or {"error": "...", "code": N}
 *   baton-tmpl --check TEMPLATE_FILE   compiles one template: prints "ok" or the refusal (exit 1)
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/chat_template.h"

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        return NULL;
    }
    baton_buf_t b = BATON_BUF_INIT;
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
        if (baton_buf_append(&b, chunk, n) < 0) {
            fclose(f);
            baton_buf_free(&b);
            return NULL;
        }
    }
    fclose(f);
    return baton_buf_steal(&b, len);
}

int main(int argc, char **argv)
{
    char err[512];
    if (argc == 3 && strcmp(argv[1], "--check") == 0) {
        size_t len;
        char *src = slurp(argv[2], &len);
        if (!src) {
            fprintf(stderr, "baton-tmpl: cannot read %s\n", argv[2]);
            return 2;
        }
        baton_tmpl_t *t;
        int rc = baton_tmpl_compile(src, len, &t, err, sizeof(err));
        free(src);
        if (rc < 0) {
            printf("%s\n", err);
            return 1;
        }
        baton_tmpl_free(t);
        printf("ok\n");
        return 0;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: baton-tmpl CASES.json | baton-tmpl --check TEMPLATE_FILE\n");
        return 2;
    }
    json_error_t jerr;
    json_t *root = json_load_file(argv[1], 0, &jerr);
    if (!root) {
        fprintf(stderr, "baton-tmpl: %s: %s\n", argv[1], jerr.text);
        return 2;
    }
    const char *src = json_string_value(json_object_get(root, "template"));
    json_t *cases = json_object_get(root, "cases");
    if (!src || !json_is_array(cases)) {
        fprintf(stderr, "baton-tmpl: expected {\"template\": ..., \"cases\": [...]}\n");
        json_decref(root);
        return 2;
    }
    json_t *out = json_array();
    baton_tmpl_t *t;
    int rc = baton_tmpl_compile(src, json_string_length(json_object_get(root, "template")), &t,
                                err, sizeof(err));
    size_t i;
    json_t *vars;
    json_array_foreach(cases, i, vars) {
        if (rc < 0) {
            json_array_append_new(out, json_pack("{s:s,s:i}", "error", err, "code", rc));
            continue;
        }
        baton_buf_t b = BATON_BUF_INIT;
        int r = baton_tmpl_render(t, vars, NULL, &b, err, sizeof(err));
        if (r < 0) {
            json_array_append_new(out, json_pack("{s:s,s:i}", "error", err, "code", r));
        } else {
            json_array_append_new(out, json_pack("{s:s%}", "text", b.data ? b.data : "", b.len));
        }
        baton_buf_free(&b);
    }
    if (rc == 0) {
        baton_tmpl_free(t);
    }
    char *s = json_dumps(out, JSON_COMPACT);
    fputs(s, stdout);
    free(s);
    json_decref(out);
    json_decref(root);
    return 0;
}
