/* config_help.c — the router's --help: every option of config.c's table, grouped by concern,
 * with its default. */
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "router/control/config.h"
#include "router/control/config_int.h"

#define OFF(f) offsetof(baton_config_t, f)

static void default_text(const baton_config_t *d, const baton__opt_t *o, char *buf, size_t len)
{
    const char *field = (const char *)d + o->offset;
    switch (o->type) {
    case OPT_STR:
    case OPT_RATE:
        snprintf(buf, len, "%s", *(char *const *)field ? *(char *const *)field : "none");
        break;
    case OPT_STRLIST:
    case OPT_MODELMAP:
        snprintf(buf, len, "none");
        break;
    case OPT_BOOL:
        snprintf(buf, len, "%s", *(const int *)field ? "on" : "off");
        break;
    case OPT_INT:
        snprintf(buf, len, "%d", *(const int *)field);
        break;
    case OPT_UINT:
        snprintf(buf, len, "%u", *(const unsigned *)field);
        break;
    case OPT_SIZE:
        snprintf(buf, len, "%zu", *(const size_t *)field);
        break;
    case OPT_U64:
        snprintf(buf, len, "%llu", (unsigned long long)*(const uint64_t *)field);
        break;
    case OPT_POLICY:
        snprintf(buf, len, "%s", baton_policy_name(*(const baton_policy_kind_t *)field));
        break;
    case OPT_LOGLEVEL:
        snprintf(buf, len, "%s", baton_log_level_name(*(const baton_log_level_t *)field));
        break;
    }
}

/* --help groups the options by concern; an option in no group is printed under "other"
 * (tests/integration/test_cli.py fails on that heading, so a new option gets a group). */
static const struct {
    const char *title;
    const char *flags; /* space-separated, in print order */
} help_groups[] = {
    {"listen", "--host --port --threads --log-level"},
    {"workers", "--pd-protocol --worker-api-key --load-poll-interval-ms"},
    {"routing",
     "--policy --prefill-policy --decode-policy --cache-threshold-pct "
     "--balance-abs-threshold --balance-rel-threshold-pct --balance-by-words "
     "--balance-by-tokens --cache-tie-pct --cache-l3-pct --cache-max-blocks --cache-block-words "
     "--hash-vnodes --session-key-field --dp-round-robin --precise-prefill-weight-pct "
     "--precise-load-weight-pct --precise-l2-credit-pct --precise-l3-credit-pct "
     "--store-kv-events --store-kv-events-replay --precise-tie-pct "
     "--precise-temperature-pct --precise-provisional-ms --kv-events-max-blocks "
     "--kv-events-replay-timeout-ms --kv-events-unmatched-after --pd-uncached-token-threshold"},
    {"tokenizer", "--tokenizer --max-model-len --tokenize-cache-bytes --tokenize-cache-entries"},
    {"limits", "--max-header-bytes --max-headers --max-body-bytes --max-connections "
               "--max-buffered-bytes --max-sse-event-bytes --max-concurrent-requests --queue-size "
               "--max-worker-requests --rate-limit"},
    {"timeouts", "--header-timeout-ms --body-timeout-ms --keepalive-timeout-ms "
                 "--connect-timeout-ms --first-byte-timeout-ms --idle-timeout-ms "
                 "--request-timeout-ms --prefill-timeout-ms --queue-timeout-ms "
                 "--drain-timeout-ms --worker-drain-timeout-ms"},
    {"resilience", "--max-retries --retry-backoff-ms --retry-backoff-max-ms --retry-budget-ms "
                   "--migration-limit "
                   "--check-interval-ms --check-fast-interval-ms --check-down-interval-ms "
                   "--check-timeout-ms --check-rise --check-fall --check-path "
                   "--breaker-threshold --breaker-cooldown-ms --breaker-cooldown-max-ms"},
    {"security", "--api-key --api-key-file --admin-token --admin-token-file --metrics-token "
                 "--forward-authorization --tls-cert --tls-key --tls-client-ca --upstream-ca "
                 "--upstream-cert --upstream-key"},
    {"priority", "--priority-reserve-pct --priority-preempt --priority-to-workers"},
    {"registry", "--registry --registry-user --registry-password-file --registry-timeout-ms "
                 "--registry-ca --registry-cert --registry-key"},
};
#define N_HELP_GROUPS (sizeof(help_groups) / sizeof(help_groups[0]))

/* Whether `flag` is one of the words of `list`. */
static int in_word_list(const char *list, const char *flag)
{
    size_t n = strlen(flag);
    for (const char *p = list; (p = strstr(p, flag)) != NULL; p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0'))
            return 1;
    return 0;
}

static void print_option(FILE *out, const baton_config_t *d, int have_defaults,
                         const baton__opt_t *o)
{
    char left[64], def[64] = "";
    snprintf(left, sizeof(left), "%s %s", o->flag, o->metavar);
    if (have_defaults)
        default_text(d, o, def, sizeof(def));
    if (o->type == OPT_POLICY && o->set_flag != 0)
        snprintf(def, sizeof(def), "same as --policy");
    if (o->offset == OFF(threads))
        snprintf(def, sizeof(def), "number of cores, here %u", d->threads);
    if (o->offset == OFF(upstream_ca) || o->offset == OFF(registry_ca))
        snprintf(def, sizeof(def), "the system bundle");
    fprintf(out, "  %-32s %s (default: %s)\n", left, o->help, def);
}

void baton_config_print_help(FILE *out, const char *argv0)
{
    baton_config_t d;
    int have_defaults = baton_config_init(&d) == 0;
    fprintf(out,
            "Usage: %s [options]\n"
            "Baton: an OpenAI-compatible prefill/decode disaggregation router.\n"
            "Every option is also a key of the JSON config file (dashes become underscores;\n"
            "HTTP limits go under \"limits\", upstream timeouts under \"timeouts\", retry\n"
            "settings under \"retries\", admission control under \"admission\", health checks\n"
            "and breakers under \"health\", keys, tokens and rate limits under \"auth\");\n"
            "options given here override the file. Times are in milliseconds. SIGHUP reloads\n"
            "the workers, policies and tokenizers from --config and the key and token files;\n"
            "SIGTERM drains in-flight requests (--drain-timeout-ms) and exits 0.\n\n",
            argv0 ? argv0 : "baton");
    fprintf(out, "  %-32s %s\n", "--config FILE", "JSON config file (see conf/baton.json)");
    fprintf(out, "  %-32s %s\n", "-h, --help", "print this help and exit");
    fprintf(out, "  %-32s %s\n", "--version", "print the version and exit");
    for (size_t g = 0; g < N_HELP_GROUPS; g++) {
        fprintf(out, "\n%s:\n", help_groups[g].title);
        if (strcmp(help_groups[g].title, "workers") == 0) {
            fprintf(out, "  %-32s %s\n", "--prefill URL [BOOTSTRAP_PORT]",
                    "add a prefill worker (repeatable; port: 1..65535 or none; for");
            fprintf(out, "  %-32s %s\n", "",
                    "vllm-mooncake, the port of its Mooncake bootstrap server)");
            fprintf(out, "  %-32s %s\n", "--prefill-engine-id ID",
                    "vllm-mooncake: the engine id of the --prefill before it");
            fprintf(out, "  %-32s %s\n", "--decode URL", "add a decode worker (repeatable)");
            fprintf(out, "  %-32s %s\n", "--worker URL",
                    "add a regular (non-PD) worker (repeatable)");
        }
        const char *list = help_groups[g].flags;
        for (const char *p = list; *p;) {
            size_t n = strcspn(p, " ");
            for (size_t i = 0; i < baton__config_n_options; i++)
                if (strlen(baton__config_options[i].flag) == n &&
                    strncmp(baton__config_options[i].flag, p, n) == 0)
                    print_option(out, &d, have_defaults, &baton__config_options[i]);
            p += n;
            p += strspn(p, " ");
        }
    }
    int other = 0;
    for (size_t i = 0; i < baton__config_n_options; i++) {
        size_t g = 0;
        while (g < N_HELP_GROUPS &&
               !in_word_list(help_groups[g].flags, baton__config_options[i].flag))
            g++;
        if (g < N_HELP_GROUPS)
            continue;
        if (!other++)
            fprintf(out, "\nother:\n");
        print_option(out, &d, have_defaults, &baton__config_options[i]);
    }
    if (have_defaults)
        baton_config_free(&d);
}
