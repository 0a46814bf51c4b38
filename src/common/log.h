/* log.h — structured, levelled log lines on stderr: ts level comp event key=value... */
#ifndef BATON_COMMON_LOG_H
#define BATON_COMMON_LOG_H

typedef enum {
    BATON_LOG_DEBUG = 0,
    BATON_LOG_INFO = 1,
    BATON_LOG_WARN = 2,
    BATON_LOG_ERROR = 3,
} baton_log_level_t;

/* Thread-safe. Default level INFO; BATON_LOG_LEVEL=debug|info|warn|error overrides. A thread
 * with a sink of its own level (baton_log_sink_swap) uses that level instead. */
void baton_log_set_level(baton_log_level_t level);
int baton_log_parse_level(const char *name, baton_log_level_t *level_p);
/* "debug", "info", "warn", "error"; "info" for a value outside the enum. */
const char *baton_log_level_name(baton_log_level_t level);
int baton_log_enabled(baton_log_level_t level);

/*
 * A thread's log destination, for a library that routes its lines elsewhere (libbaton: an
 * engine's log callback and level). fn NULL: stderr as usual; level < 0: the process level.
 * fn gets the line without time stamp and level: "comp=xfer event key=value...".
 */
typedef void (*baton_log_fn)(void *data, baton_log_level_t level, const char *msg);
typedef struct {
    baton_log_fn fn;
    void *data;
    int level;
} baton_log_sink_t;

/* Sets the calling thread's sink (NULL: none, the default) and returns the previous one. The
 * sink must outlive its use on the thread. */
const baton_log_sink_t *baton_log_sink_swap(const baton_log_sink_t *sink);

/*
 * One logfmt-style line: `2026-11-22T07:00:00.123Z level=info comp=router listening port=8000`.
 * By convention the format starts with a bare event word and adds ` key=value` fields.
 */
void baton_log(baton_log_level_t level, const char *comp, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define BATON_LOG_DEBUG_(comp, ...)                                                                \
    do {                                                                                           \
        if (baton_log_enabled(BATON_LOG_DEBUG))                                                    \
            baton_log(BATON_LOG_DEBUG, comp, __VA_ARGS__);                                         \
    } while (0)
#define log_debug(comp, ...) BATON_LOG_DEBUG_(comp, __VA_ARGS__)
#define log_info(comp, ...)  baton_log(BATON_LOG_INFO, comp, __VA_ARGS__)
#define log_warn(comp, ...)  baton_log(BATON_LOG_WARN, comp, __VA_ARGS__)
#define log_error(comp, ...) baton_log(BATON_LOG_ERROR, comp, __VA_ARGS__)

/*
 * Rate-limited lines, for every warning an outside party can trigger at will (accept failures,
 * refused connections, bad credentials): an attacker must not be able to fill the disk or burn
 * a core on logging. One limiter per call site (a static), shared by all threads: at most
 * `per_sec` lines per wall-clock second pass; the rest are counted, and the first line let
 * through in a later second is preceded by one `log_suppressed event=EVENT count=N` line.
 * `event` is the site's name in that line.
 */
typedef struct baton_log_limit_s {
    const char *event;
    unsigned per_sec;
    /* Private: guarded by an internal lock. */
    long long window_s;
    unsigned in_window;
    unsigned long long suppressed;
} baton_log_limit_t;

#define BATON_LOG_LIMIT_INIT(event_name, n)                                                        \
    {                                                                                              \
        (event_name), (n), -1, 0, 0                                                                \
    }

/* 1 when this occurrence may be logged (after writing a pending suppression summary at
 * `level`/`comp`), 0 when it is to be dropped (and counted). Thread-safe. */
int baton_log_limit_pass(baton_log_limit_t *lim, baton_log_level_t level, const char *comp);

/* One line through the site's limiter. The per-site static makes each call site separate. */
#define baton_log_limited(level, per_sec, comp, event, ...)                                        \
    do {                                                                                           \
        static baton_log_limit_t lim_ = BATON_LOG_LIMIT_INIT(event, per_sec);                      \
        if (baton_log_enabled(level) && baton_log_limit_pass(&lim_, level, comp))                  \
            baton_log(level, comp, __VA_ARGS__);                                                   \
    } while (0)
/* The default for outside-triggered warnings: 10 lines a second per call site. */
#define log_warn_limited(comp, event, ...)                                                         \
    baton_log_limited(BATON_LOG_WARN, 10, comp, event, __VA_ARGS__)

#endif
