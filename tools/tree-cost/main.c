/* tools/tree-cost/main.c — baton-tree-cost: what cache_aware's per-worker prefix trees cost the
 * router, per request (chain + match over the workers + insert) and in memory, at a given
 * session count. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "baton/error.h"
#include "common/log.h"
#include "router/dataplane/policy.h"
#include "router/control/registry.h"

/* This thread's CPU time: the machine is shared, wall time would count others' work. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void usage(void)
{
    fprintf(stderr,
            "Usage: baton-tree-cost [--sessions N] [--turns K] [--workers W] [--shared-words S]\n"
            "                       [--turn-words T] [--max-blocks B] [--block-words K]\n"
            "Routes N sessions of K turns (each turn = history + T words, after one of 8 shared\n"
            "prompts of S words) through a cache_aware policy over W workers, in process, and\n"
            "prints the tree's cost per request and its memory.\n");
}

int main(int argc, char **argv)
{
    unsigned long sessions = 100000, turns = 4, workers = 8, shared = 300, turn_words = 60;
    baton_policy_params_t pp;
    baton_policy_params_default(&pp);
    for (int i = 1; i < argc; i++) {
        unsigned long *dst = NULL;
        unsigned long tmp = 0;
        if (i + 1 >= argc) {
            usage();
            return 2;
        }
        if (!strcmp(argv[i], "--sessions"))
            dst = &sessions;
        else if (!strcmp(argv[i], "--turns"))
            dst = &turns;
        else if (!strcmp(argv[i], "--workers"))
            dst = &workers;
        else if (!strcmp(argv[i], "--shared-words"))
            dst = &shared;
        else if (!strcmp(argv[i], "--turn-words"))
            dst = &turn_words;
        else if (!strcmp(argv[i], "--max-blocks") || !strcmp(argv[i], "--block-words"))
            dst = &tmp;
        else {
            usage();
            return 2;
        }
        *dst = strtoul(argv[++i], NULL, 10);
        if (!strcmp(argv[i - 1], "--max-blocks"))
            pp.cache_max_blocks = tmp;
        if (!strcmp(argv[i - 1], "--block-words"))
            pp.cache_block_words = (unsigned)tmp;
    }
    if (!workers || !turns || !sessions || workers > 1024) {
        usage();
        return 2;
    }
    baton_log_set_level(BATON_LOG_WARN);
    baton_registry_t *reg;
    if (baton_registry_create(&reg))
        return 1;
    baton_worker_t **ws = calloc(workers, sizeof(*ws));
    for (unsigned long i = 0; i < workers; i++) {
        char url[64];
        snprintf(url, sizeof(url), "http://127.0.0.1:%lu", 20000 + i);
        baton_worker_spec_t spec;
        baton_worker_spec_init(&spec);
        spec.url = url;
        spec.role = BATON_ROLE_PREFILL;
        if (baton_registry_add(reg, &spec, &ws[i], NULL, 0))
            return 1;
    }
    baton_policy_t *p;
    if (baton_policy_create_with(&p, BATON_POLICY_CACHE_AWARE, &pp))
        return 1;

    /* Each session's text grows turn by turn; sessions are interleaved round by round, as
     * live sessions are, so the trees see every session's prefixes while others come in. */
    size_t cap = (shared + turns * (turn_words + 1) + 8) * 12;
    char *text = malloc(cap);
    uint64_t requests = 0, words = 0;
    double dt = 0;
    for (unsigned long t = 0; t < turns; t++) {
        for (unsigned long s = 0; s < sessions; s++) {
            size_t len = 0;
            for (unsigned long w = 0; w < shared; w++)
                len += (size_t)snprintf(text + len, cap - len, "g%luw%lu ", s % 8, w);
            for (unsigned long k = 0; k <= t; k++)
                for (unsigned long w = 0; w < turn_words; w++)
                    len += (size_t)snprintf(text + len, cap - len, "s%lut%luw%lu ", s, k, w);
            baton_route_ctx_t ctx = {.text = text, .text_len = len};
            baton_choice_t why;
            uint32_t m;
            double t0 = cpu_s(); /* only the policy's work: building the text is not timed */
            baton_worker_t *w = baton_policy_select_ctx(p, ws, workers, &ctx, &why, &m);
            baton_policy_chosen(p, w, &ctx, why, m);
            words += ctx.chain.words;
            baton_route_ctx_free(&ctx);
            dt += cpu_s() - t0;
            requests++;
        }
    }
    baton_policy_stats_t st;
    baton_policy_stats(p, &st);
    printf("sessions %lu x %lu turns over %lu workers, %lu shared + %lu words per turn, "
           "block %u words, bound %zu names per worker\n",
           sessions, turns, workers, shared, turn_words, pp.cache_block_words, pp.cache_max_blocks);
    printf("requests %" PRIu64 ", %.1f words each on average\n", requests,
           (double)words / (double)requests);
    printf("tree cost per request (chain + match on every worker + insert), CPU: %.2f us\n",
           dt / (double)requests * 1e6);
    printf("tree memory: %zu names, %.1f MiB (%.1f bytes per name)\n", st.tree_names,
           st.tree_bytes / 1048576.0, st.tree_names ? (double)st.tree_bytes / st.tree_names : 0.0);
    printf("chosen by cache %" PRIu64 ", by load %" PRIu64 "; predicted hit ratio %.3f\n",
           st.chosen[BATON_CHOICE_CACHE], st.chosen[BATON_CHOICE_LOAD],
           st.prompt_words ? (double)st.predicted_hit_words / st.prompt_words : 0.0);
    baton_policy_destroy(p);
    baton_workers_unref(ws, workers);
    free(ws);
    free(text);
    baton_registry_destroy(reg);
    return 0;
}
