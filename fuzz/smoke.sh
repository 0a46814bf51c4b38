#!/bin/sh
# fuzz/smoke.sh SRC_DIR FUZZ_BUILD_DIR SECONDS — builds the libFuzzer harnesses with clang and runs
# each for SECONDS over a scratch copy of its seed corpus (fuzz/corpus/<harness>/ stays as
# committed). Exit 77 (skipped) without clang or libFuzzer; non-zero when a harness finds a crash,
# a leak or a timeout (its reproducer is kept under FUZZ_BUILD_DIR/artifacts/).
set -eu
src=$1
bdir=$2
secs=$3
harnesses="fuzz_http_server fuzz_pdreq fuzz_sse_logprobs fuzz_ctrl_frame fuzz_config fuzz_json_scan
    fuzz_kv_preauth fuzz_sse_relay fuzz_tokenizer fuzz_tokenizer_load fuzz_chat_template
    fuzz_store_proto"

cc=$(command -v clang || true)
if [ -z "$cc" ]; then
    echo "SKIPPED: clang not found (scripts/install-deps.sh --test installs clang and libFuzzer)"
    exit 77
fi
if ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n){return 0;}' |
    "$cc" -x c -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then
    echo "SKIPPED: clang cannot link -fsanitize=fuzzer (install libclang-rt-dev / libclang-rt-14-dev)"
    exit 77
fi

cmake -S "$src" -B "$bdir" -DCMAKE_C_COMPILER="$cc" -DBATON_FUZZ=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$bdir" --target baton_fuzzers -j 2 >/dev/null

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$bdir/artifacts"
status=0
for h in $harnesses; do
    mkdir -p "$scratch/$h"
    # -max_total_time is wall time including the seed run; ASan's leak check stays on.
    if "$bdir/fuzz/$h" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$bdir/artifacts/$h-" -print_final_stats=1 \
        "$scratch/$h" "$src/fuzz/corpus/$h" >"$scratch/$h.log" 2>&1; then
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$scratch/$h.log")
        echo "ok   $h: $runs executions in ${secs}s"
    else
        echo "FAIL $h (reproducer under $bdir/artifacts/):"
        tail -n 40 "$scratch/$h.log"
        status=1
    fi
done
exit $status
