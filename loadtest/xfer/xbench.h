/* xfer/xbench.h — baton-xfer-bench: options, the source pattern both processes derive, and the
 * entry points of its parts (prefill server, decode driver, memcpy baseline, report). */
#ifndef BATON_XFER_BENCH_H
#define BATON_XFER_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "baton/error.h"
#include "baton/transfer.h"
#include "xfer_pattern.h"

/*
 * Processes. `baton-xfer-bench` (the DRIVER) owns the decode engine: it offers rooms, times them
 * from baton_xfer_offer() to the offer callback (every byte in place, DONE received) and checks
 * the bytes. It starts itself a second time as the SERVER (`--serve`, the prefill engine) in
 * its own process, which answers every offered room by writing pattern bytes into it. The two
 * meet over loopback like a real prefill/decode pair; only the chosen transport differs.
 *
 * Pattern. Both processes fill a source buffer of src_bytes from the same seed; the bytes of
 * (room, layer, page) start at a page-aligned offset derived from those three numbers
 * (xb_src_offset), so a byte written into the wrong page, layer or room is caught, and the
 * driver can check a received page without being told what was sent. The source is large
 * (256 MiB by default) so the sender reads it from memory, not from cache, like real KV.
 */

#define XB_MAX_SIZES    32
#define XB_MAX_TP       4
#define XB_SRC_ALIGN    4096u
#define XB_DONE_PAYLOAD 16 /* DONE payload: room id + page count, echoed for checking */

typedef enum { XB_VERIFY_NONE = 0, XB_VERIFY_SAMPLE, XB_VERIFY_ALL } xb_verify_t;

/* The KV shape of a hand-off (the preset: 64 layers, 8 KV heads, 128 head dim, bf16, 64-token
 * pages). A page holds page_tokens tokens of K (or of V) for one layer, so a layer has
 * 2 * ceil(tokens / page_tokens) pages. */
typedef struct {
    uint32_t layers, kv_heads, head_dim, dtype_bytes, page_tokens;
} xb_kv_shape_t;

typedef struct {
    /* both processes */
    uint32_t slice;      /* baton_xfer_config_t.slice_size (0: the engine default) */
    uint32_t lanes;      /* baton_xfer_config_t.lanes (0: the engine default) */
    size_t src_bytes;    /* source pattern buffer */
    uint64_t seed;       /* pattern seed */
    const char *log_lvl; /* libbaton log level */

    /* server (--serve) */
    int serve;
    const char *listen_host;
    int listen_port;
    int notify_fd; /* the driver's pipe: "port=N\n" once listening (-1: print to stdout) */

    /* driver */
    baton_xfer_transport_t tps[XB_MAX_TP];
    int n_tps;
    const char *connect_host; /* an external server (--connect H:P); NULL: start one */
    int connect_port;
    uint64_t sizes[XB_MAX_SIZES]; /* block sizes: rooms of one layer x one page */
    int n_sizes;
    uint32_t kv_tokens[XB_MAX_SIZES]; /* whole KV hand-offs */
    int n_kv;
    xb_kv_shape_t kv;
    uint32_t runs;         /* measured runs per case (medians over them) */
    uint32_t warmup_rooms; /* rooms per case before measuring (at least one window) */
    uint32_t run_ms;       /* a throughput run stops starting rooms after this... */
    uint64_t run_bytes;    /* ...or after this many bytes, whichever first */
    uint32_t lat_ms;       /* latency run (one room at a time) per measured run */
    uint32_t lat_rooms;    /* at most this many rooms per latency run */
    uint64_t window_bytes; /* throughput runs keep ~this many bytes of rooms in flight */
    uint32_t max_window;   /* at most this many rooms in flight */
    uint32_t kv_runs;      /* measured runs per KV hand-off case */
    xb_verify_t verify;
    int memcpy_baseline;   /* measure memcpy for the same cases */
    const char *json_path; /* NULL: none; "-": stdout */
    int quiet;
} xb_opts_t;

/* A case: rooms of n_layers x ppl pages of page_len bytes each. */
typedef struct {
    char name[32];
    const char *kind; /* "block" or "kv" */
    uint32_t n_layers, ppl;
    uint64_t page_len;
    uint64_t room_bytes;
    uint32_t tokens; /* kv only */
    uint32_t window; /* rooms in flight in throughput runs (kv: 1) */
} xb_case_t;

/* Page-aligned offset in the source where the bytes of (room, layer, page) start. */
static inline size_t xb_src_offset(uint64_t room, uint32_t layer, uint32_t page, size_t src_len,
                                   uint64_t page_len)
{
    uint64_t slots = (src_len - page_len) / XB_SRC_ALIGN + 1;
    uint64_t h = xfer_mix(room ^ xfer_mix(((uint64_t)layer << 32) | page));
    return (size_t)(h % slots) * XB_SRC_ALIGN;
}

/* The source buffer (page-aligned, filled with the pattern of seed). NULL on failure. */
uint8_t *xb_source_new(size_t len, uint64_t seed);

/* Builds the case list of opts (block sizes, then KV hand-offs). Returns the count. */
int xb_cases(const xb_opts_t *o, xb_case_t *cases, int cap);

/* Monotonic nanoseconds. */
uint64_t xb_now_ns(void);
/* p in [0, 100] of n sorted values (nearest rank). */
double xb_percentile(const double *sorted, size_t n, double p);
double xb_median(double *v, size_t n); /* sorts v */
/* CPU seconds (user + system) of this process, and of another process from /proc (-1: gone). */
double xb_cpu_self(void);
double xb_cpu_pid(int pid);

/* Parts. Each returns a process exit status (0 ok, 3 corrupted bytes, 1 other failure). */
int xb_serve(const xb_opts_t *o);
/* Runs the memcpy baseline for every case; appends to `out` (a JSON array). */
int xb_memcpy_baseline(const xb_opts_t *o, const xb_case_t *cases, int n_cases, const uint8_t *src,
                       json_t *out);
/* Runs every case over transport tp; appends one object to `out` (a JSON array). */
int xb_drive_transport(const xb_opts_t *o, baton_xfer_transport_t tp, const xb_case_t *cases,
                       int n_cases, const uint8_t *src, json_t *out);

/* Prints the human tables of a finished result. */
void xb_print_report(const json_t *result);
/* The machine: {"nproc", "cpu_model", "mem_gib", "kernel"}. */
json_t *xb_machine_json(void);

#endif
