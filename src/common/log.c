/* log.c — structured log lines, one write(2) per line so threads never interleave. */
#include "common/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static atomic_int current_level = -1;

/* Per thread, not process-wide: each libbaton engine sets it on its own threads. */
static __thread const baton_log_sink_t *thread_sink;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

int baton_log_parse_level(const char *name, baton_log_level_t *level_p)
{
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(name, level_names[i]) == 0) {
            *level_p = (baton_log_level_t)i;
            return 0;
        }
    }
    return -1;
}

const char *baton_log_level_name(baton_log_level_t level)
{
    return (unsigned)level < 4 ? level_names[level] : "info";
}

void baton_log_set_level(baton_log_level_t level)
{
    atomic_store(&current_level, (int)level);
}

const baton_log_sink_t *baton_log_sink_swap(const baton_log_sink_t *sink)
{
    const baton_log_sink_t *prev = thread_sink;
    thread_sink = sink;
    return prev;
}

int baton_log_enabled(baton_log_level_t level)
{
    const baton_log_sink_t *sink = thread_sink;
    if (sink != NULL && sink->level >= 0)
        return (int)level >= sink->level;
    int cur = atomic_load(&current_level);
    if (cur < 0) {
        baton_log_level_t env = BATON_LOG_INFO;
        const char *s = getenv("BATON_LOG_LEVEL");
        if (s != NULL)
            baton_log_parse_level(s, &env);
        cur = (int)env;
        atomic_store(&current_level, cur);
    }
    return (int)level >= cur;
}

void baton_log(baton_log_level_t level, const char *comp, const char *fmt, ...)
{
    if (!baton_log_enabled(level))
        return;
    const baton_log_sink_t *sink = thread_sink;
    if (sink != NULL && sink->fn != NULL) {
        char msg[2048];
        int n = snprintf(msg, sizeof(msg), "comp=%s ", comp);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
        va_end(ap);
        sink->fn(sink->data, level, msg);
        return;
    }
    char line[2048];
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    int n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ level=%s comp=%s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     (int)(tv.tv_usec / 1000), level_names[level], comp);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 2, fmt, ap);
    va_end(ap);
    if (m < 0)
        m = 0;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof(line) - 2)
        len = sizeof(line) - 2;
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}

/* One lock for every limiter: taken only on warning paths, never on the request path's happy
 * case, so contention does not matter and the limiter struct stays a plain static. */
static pthread_mutex_t limit_lock = PTHREAD_MUTEX_INITIALIZER;

int baton_log_limit_pass(baton_log_limit_t *lim, baton_log_level_t level, const char *comp)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    unsigned long long flushed = 0;
    int pass;
    pthread_mutex_lock(&limit_lock);
    if (lim->window_s != (long long)ts.tv_sec) {
        lim->window_s = (long long)ts.tv_sec;
        lim->in_window = 0;
        flushed = lim->suppressed;
        lim->suppressed = 0;
    }
    pass = lim->in_window < lim->per_sec;
    if (pass)
        lim->in_window++;
    else
        lim->suppressed++;
    pthread_mutex_unlock(&limit_lock);
    if (flushed)
        baton_log(level, comp, "log_suppressed event=%s count=%llu", lim->event, flushed);
    return pass;
}
