/* fuzz/fuzz_config.c — libFuzzer harness for the router's config file loader (JSON text → the
 * option table → baton_config_t), applied twice as a reload applies a file over a live config. */
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/log.h"
#include "fuzz_check.h"
#include "router/control/config.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    baton_log_set_level(BATON_LOG_ERROR);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    baton_config_t cfg;
    CHECK(baton_config_init(&cfg) == 0);
    char err[256];
    for (int i = 0; i < 2; i++) {
        memset(err, 'x', sizeof(err));
        int rc = baton_config_load_json(&cfg, text, "fuzz", err, sizeof(err));
        CHECK(rc == 0 || rc == BATON_EINVAL || rc == BATON_ENOMEM);
        if (rc != 0)
            CHECK(memchr(err, '\0', sizeof(err)) != NULL && err[0] != '\0');
    }
    baton_config_free(&cfg);
    free(text);
    return 0;
}
