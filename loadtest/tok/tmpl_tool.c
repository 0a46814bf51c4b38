/* loadtest/tok/tmpl_tool.c — baton-tmpl: chat templates from the command line, for the
 * template tests against the reference renderer and for timing renders.
 *   baton-tmpl CASES.json   CASES = {"template": "...", "cases": [VARS, ...]}; prints a JSON
 *                           array, per case {"text": "..."} or {"error": "...", "code": N}
 *   baton-tmpl --check TEMPLATE_FILE   compiles one template: prints "ok" or the refusal (exit 1)
 *   baton-tmpl --time N CASES.json     renders each case N times: per case, the median
 *                                      microseconds of one render and the output bytes
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int time_cases(int reps, const char *path)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    json_t *src = root ? json_object_get(root, "template") : NULL;
    if (!json_is_string(src) || reps < 1) {
        fprintf(stderr, "baton-tmpl: bad --time arguments\n");
        json_decref(root);
        return 2;
    }
    char err[512];
    baton_tmpl_t *t;
    if (baton_tmpl_compile(json_string_value(src), json_string_length(src), &t, err, sizeof(err)) <
        0) {
        fprintf(stderr, "baton-tmpl: %s\n", err);
        json_decref(root);
        return 1;
    }
    double *us = calloc((size_t)reps, sizeof(*us));
    size_t i;
    json_t *vars;
    json_array_foreach(json_object_get(root, "cases"), i, vars)
    {
        size_t bytes = 0;
        for (int r = 0; r < reps; r++) {
            baton_buf_t b = BATON_BUF_INIT;
            struct timespec a, z;
            clock_gettime(CLOCK_MONOTONIC, &a);
            int rc = baton_tmpl_render(t, vars, NULL, &b, err, sizeof(err));
            clock_gettime(CLOCK_MONOTONIC, &z);
            us[r] = (double)(z.tv_sec - a.tv_sec) * 1e6 + (double)(z.tv_nsec - a.tv_nsec) / 1e3;
            bytes = rc == 0 ? b.len : 0;
            baton_buf_free(&b);
        }
        qsort(us, (size_t)reps, sizeof(*us), cmp_double);
        printf("case %zu: %.1f us median, %zu bytes\n", i, us[reps / 2], bytes);
    }
    free(us);
    baton_tmpl_free(t);
    json_decref(root);
    return 0;
}

int main(int argc, char **argv)
{
    char err[512];
    if (argc == 4 && strcmp(argv[1], "--time") == 0) {
        return time_cases(atoi(argv[2]), argv[3]);
    }
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
        fprintf(stderr,
                "usage: baton-tmpl CASES.json | --check TEMPLATE_FILE | --time N CASES.json\n");
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
    int rc = baton_tmpl_compile(src, json_string_length(json_object_get(root, "template")), &t, err,
                                sizeof(err));
    size_t i;
    json_t *vars;
    json_array_foreach(cases, i, vars)
    {
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
