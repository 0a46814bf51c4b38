/* tok_tool.c — baton-tok: the tokenizer from the command line, for the exactness tests (ids of
 * a list of cases as JSON) and the speed benchmark (tokens/s per core, a long prompt's time). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "baton/error.h"
#include "tokenizer/tokenizer.h"

static const char USAGE[] =
    "usage: baton-tok encode DIR [--special] [--add-special] < text    ids, one line\n"
    "       baton-tok cases DIR CASES.json    [{\"text\",\"special\",\"add_special\"}] -> JSON\n"
    "       baton-tok bench DIR TEXTFILE [--runs N] [--chunk BYTES]\n"
    "       baton-tok info DIR\n"
    "DIR is a model directory with tokenizer.json, or the tokenizer.json file.\n";

static char *slurp(FILE *f, size_t *len_p)
{
    size_t cap = 1 << 16, len = 0;
    char *d = malloc(cap);
    size_t r;
    while (d && (r = fread(d + len, 1, cap - len, f)) > 0) {
        len += r;
        if (len == cap) {
            char *n = realloc(d, cap *= 2);
            if (!n)
                free(d);
            d = n;
        }
    }
    *len_p = len;
    return d;
}

static baton_tok_t *load(const char *path)
{
    char err[256] = "";
    baton_tok_t *t = NULL;
    int rc = baton_tok_load(path, &t, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "baton-tok: %s (%s)\n", err, baton_strerror(rc));
        exit(2);
    }
    return t;
}

static double clock_s(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int cmd_encode(int argc, char **argv)
{
    baton_tok_t *t = load(argv[2]);
    unsigned flags = 0;
    for (int i = 3; i < argc; i++) {
        if (strcmp(argv[i], "--special") == 0)
            flags |= BATON_TOK_PARSE_SPECIAL;
        else if (strcmp(argv[i], "--add-special") == 0)
            flags |= BATON_TOK_ADD_SPECIAL;
    }
    size_t len;
    char *text = slurp(stdin, &len);
    baton_tok_scratch_t *sc = baton_tok_scratch_new();
    baton_tok_ids_t ids = BATON_TOK_IDS_INIT;
    int rc = baton_tok_encode(t, sc, text, len, flags, &ids);
    if (rc < 0) {
        fprintf(stderr, "baton-tok: encode: %s\n", baton_strerror(rc));
        return 1;
    }
    for (size_t i = 0; i < ids.len; i++)
        printf(i ? " %u" : "%u", ids.ids[i]);
    printf("\n");
    baton_tok_ids_free(&ids);
    baton_tok_scratch_free(sc);
    baton_tok_free(t);
    free(text);
    return 0;
}

/* Each case: its ids, and the decode of those ids (null when the bytes are not UTF-8). */
static int cmd_cases(int argc, char **argv)
{
    if (argc < 4) {
        fputs(USAGE, stderr);
        return 2;
    }
    baton_tok_t *t = load(argv[2]);
    json_error_t je;
    json_t *cases = json_load_file(argv[3], JSON_ALLOW_NUL, &je);
    if (!json_is_array(cases)) {
        fprintf(stderr, "baton-tok: %s: %s\n", argv[3], je.text);
        return 2;
    }
    baton_tok_scratch_t *sc = baton_tok_scratch_new();
    json_t *outv = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c)
    {
        json_t *text = json_object_get(c, "text");
        unsigned flags =
            (json_is_true(json_object_get(c, "special")) ? BATON_TOK_PARSE_SPECIAL : 0) |
            (json_is_true(json_object_get(c, "add_special")) ? BATON_TOK_ADD_SPECIAL : 0);
        baton_tok_ids_t ids = BATON_TOK_IDS_INIT;
        int rc =
            baton_tok_encode(t, sc, json_string_value(text), json_string_length(text), flags, &ids);
        json_t *r = json_object();
        if (rc < 0) {
            json_object_set_new(r, "error", json_string(baton_strerror(rc)));
        } else {
            json_t *a = json_array();
            for (size_t k = 0; k < ids.len; k++)
                json_array_append_new(a, json_integer(ids.ids[k]));
            json_object_set_new(r, "ids", a);
            baton_buf_t b = BATON_BUF_INIT;
            if (baton_tok_decode(t, ids.ids, ids.len, 0, &b) == 0)
                json_object_set_new(r, "decoded",
                                    b.len ? json_stringn(b.data, b.len) : json_string(""));
            baton_buf_free(&b);
        }
        json_array_append_new(outv, r);
        baton_tok_ids_free(&ids);
    }
    json_dumpf(outv, stdout, JSON_COMPACT);
    printf("\n");
    json_decref(outv);
    json_decref(cases);
    baton_tok_scratch_free(sc);
    baton_tok_free(t);
    return 0;
}

/* Tokens per second over the whole file (a fresh scratch per run: no warm piece cache carried
 * between runs), median of N runs; and the time of one encode of the whole file, as wall time
 * and as this thread's CPU time (what a loaded machine does not inflate). */
static int cmd_bench(int argc, char **argv)
{
    if (argc < 4) {
        fputs(USAGE, stderr);
        return 2;
    }
    int runs = 9;
    for (int i = 4; i + 1 < argc; i++)
        if (strcmp(argv[i], "--runs") == 0)
            runs = atoi(argv[i + 1]);
    if (runs < 1 || runs > 1000)
        runs = 9;
    baton_tok_t *t = load(argv[2]);
    FILE *f = fopen(argv[3], "rb");
    if (!f) {
        perror(argv[3]);
        return 2;
    }
    size_t len;
    char *text = slurp(f, &len);
    fclose(f);
    double *cold = calloc((size_t)runs, sizeof(double));
    double *warm = calloc((size_t)runs, sizeof(double));
    double *cpu = calloc((size_t)runs, sizeof(double));
    size_t ntok = 0;
    for (int r = 0; r < runs; r++) {
        baton_tok_scratch_t *sc = baton_tok_scratch_new();
        baton_tok_ids_t ids = BATON_TOK_IDS_INIT;
        double c0 = clock_s(CLOCK_THREAD_CPUTIME_ID), t0 = clock_s(CLOCK_MONOTONIC);
        int rc = baton_tok_encode(t, sc, text, len, 0, &ids);
        double t1 = clock_s(CLOCK_MONOTONIC), c1 = clock_s(CLOCK_THREAD_CPUTIME_ID);
        ntok = ids.len;
        ids.len = 0;
        rc |= baton_tok_encode(t, sc, text, len, 0, &ids); /* the same scratch: warm cache */
        double t2 = clock_s(CLOCK_MONOTONIC);
        if (rc < 0) {
            fprintf(stderr, "baton-tok: encode failed\n");
            return 1;
        }
        cold[r] = t1 - t0;
        cpu[r] = c1 - c0;
        warm[r] = t2 - t1;
        baton_tok_ids_free(&ids);
        baton_tok_scratch_free(sc);
    }
    qsort(cold, (size_t)runs, sizeof(double), cmp_double);
    qsort(warm, (size_t)runs, sizeof(double), cmp_double);
    qsort(cpu, (size_t)runs, sizeof(double), cmp_double);
    double mc = cold[runs / 2], mw = warm[runs / 2], mcpu = cpu[runs / 2];
    printf("{\"bytes\": %zu, \"tokens\": %zu, \"runs\": %d, \"cold_ms\": %.3f, \"warm_ms\": %.3f, "
           "\"cold_cpu_ms\": %.3f, \"cold_tok_per_s\": %.0f, \"warm_tok_per_s\": %.0f}\n",
           len, ntok, runs, mc * 1e3, mw * 1e3, mcpu * 1e3, (double)ntok / mc, (double)ntok / mw);
    free(cpu);
    free(cold);
    free(warm);
    free(text);
    baton_tok_free(t);
    return 0;
}

static int cmd_info(int argc, char **argv)
{
    baton_tok_t *t = load(argv[2]);
    printf("{\"vocab_size\": %u, \"bos_id\": %lld, \"eos_id\": %lld, \"model_max_length\": %llu}\n",
           baton_tok_vocab_size(t), (long long)baton_tok_bos_id(t), (long long)baton_tok_eos_id(t),
           (unsigned long long)baton_tok_model_max_length(t));
    baton_tok_free(t);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fputs(USAGE, stderr);
        return 2;
    }
    if (strcmp(argv[1], "encode") == 0)
        return cmd_encode(argc, argv);
    if (strcmp(argv[1], "cases") == 0)
        return cmd_cases(argc, argv);
    if (strcmp(argv[1], "bench") == 0)
        return cmd_bench(argc, argv);
    if (strcmp(argv[1], "info") == 0)
        return cmd_info(argc, argv);
    fputs(USAGE, stderr);
    return 2;
}
