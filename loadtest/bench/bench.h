/* bench.h — baton-bench's run configuration, results, and the entry points main.c calls. */
#ifndef BATON_BENCH_BENCH_H
#define BATON_BENCH_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "arrival.h"
#include "http/common.h"
#include "prompts.h"
#include "resp.h"
#include "stats.h"

typedef struct bb_config_s {
    const char *base_url;
    baton_url_t url;
    bb_endpoint_t endpoint;
    int stream;

    /* Load shape: closed loop when request_rate == 0 (concurrency users, each sends its next
     * request when the previous one ends); open loop otherwise (arrivals at request_rate,
     * at most max_concurrency in flight, 0 = unbounded; the others wait their turn). */
    unsigned concurrency;
    double request_rate;
    bb_arrival_kind_t arrival;
    unsigned max_concurrency;

    uint64_t num_requests; /* measured requests; 0 when duration_s is used */
    double duration_s;     /* measured time; 0 when num_requests is used */
    double warmup_s;       /* requests sent in the first warmup_s are not measured */

    uint32_t in_lo, in_hi;       /* prompt words (random prompts) */
    uint32_t out_lo, out_hi;     /* max_tokens */
    int out_given;               /* --output-len given: overrides a dataset's reply lengths */
    const bb_dataset_t *dataset; /* NULL: random prompts */
    unsigned multi_turn;         /* turns per session, >= 1 */
    /* --shared-prefix N[:G]: each session's first turn starts with one of G shared "system
     * prompts" of N words (session i uses prompt i % G); 0 = none */
    uint32_t shared_prefix_words;
    unsigned shared_prefix_groups;
    double think_s; /* --think-time: a session's pause between an answer and its next turn */

    const char *model;
    int ignore_eos;
    int token_ids; /* --token-ids: prompts as integer ids (completions, generate) */
    double slo_ttft_ms, slo_tpot_ms, slo_e2e_ms; /* 0 = no such SLO */
    uint64_t seed;
    double timeout_s; /* per request, 0 = none */
    int progress;     /* live progress line (main.c decides: stdout is a terminal) */

    /* https:// base URLs go through the project's TLS layer (src/http/tls.h): the server is
     * verified against ca_file (NULL: the system bundle), host name or IP checked. */
    const char *ca_file;
    int new_connection; /* a new connection (and TLS handshake) per request: no keep-alive */
    /* --header: "Name: value" lines sent with every request (borrowed from argv) */
#define BB_MAX_HEADERS 8
    const char *headers[BB_MAX_HEADERS];
    unsigned n_headers;
} bb_config_t;

typedef struct bb_results_s {
    uint64_t completed;       /* measured requests that succeeded */
    uint64_t failed;          /* measured requests that failed */
    uint64_t warmup_requests; /* sent during warm-up (not in any figure) */
    uint64_t errors[BB_ERR_COUNT];
    uint64_t http_status[600]; /* failed requests by HTTP status */
    char first_error[BB_ERR_COUNT][200];
    uint64_t total_input_tokens, total_output_tokens;
    /* server-reported prompt tokens and cached prompt tokens (usage.prompt_tokens_details /
     * meta_info.cached_tokens) of the measured requests that reported them */
    uint64_t usage_prompt_tokens, cached_tokens;
    uint64_t good; /* completed requests within every SLO given */
    double duration_s;
    bb_vec_t ttft_ms, tpot_ms, itl_ms, e2e_ms; /* samples (sorted by bb_results_summarize) */
    bb_summary_t ttft, tpot, itl, e2e;         /* filled by bb_results_summarize */
    double max_lag_ms; /* open loop: latest a request left after its scheduled arrival */
    uint64_t connections_opened;
    double bench_cpu_s; /* the bench's own user+system CPU over the measured window */
    int interrupted;    /* stopped by SIGINT */
} bb_results_t;

/* Runs the benchmark on a private loop. 0, or a negative error before any request was sent
 * (message printed on stderr). */
int bb_run(const bb_config_t *cfg, bb_results_t *res);
void bb_results_free(bb_results_t *res);
/* Sorts the samples and fills the summaries. */
void bb_results_summarize(bb_results_t *res);

/* The report: a table on stdout, the JSON result file, --compare, --plot. */
void bb_report_print(const bb_config_t *cfg, const bb_results_t *res);
/* 0, or -1 (message printed) when the file cannot be written. */
int bb_report_json(const bb_config_t *cfg, const bb_results_t *res, const char *path);
/* Prints b / a ratios of two result files. 0, or 1 when a file cannot be read. */
int bb_compare(const char *a_path, const char *b_path);
/* Writes a PNG of the latency CDFs with gnuplot; prints a message and returns 0 when gnuplot
 * is missing. */
int bb_plot(const bb_results_t *res, const char *png_path);

#endif
