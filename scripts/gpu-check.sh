#!/usr/bin/env bash
# scripts/gpu-check.sh — libbaton's CUDA paths on a GPU machine, in one bounded run (a few minutes;
# every step has its own time limit). What it does:
#   1. builds the programs it needs with the CUDA Toolkit (skipped with --no-build, e.g. when the
#      build directory was made elsewhere and carried here);
#   2. records what the machine has: GPU, driver, toolkit, kernel, RDMA devices;
#   3. with no RDMA device, tries Soft-RoCE (rdma_rxe on a dummy interface; root only), so the
#      rdma transport meets a real verbs provider;
#   4. runs baton-gpu-check (tests/gpu/gpu_check.c): registration 4 KiB-4 GiB, CUDA IPC hand-offs
#      between two processes with every byte verified, device memory over tcp, a real kernel and
#      write_layer_after_event, aborts and fencing, rdma when present, bandwidth against
#      cuMemcpyDtoD; then, when RDMA exists, baton-xfer-bench over rdma (host memory);
#   5. writes everything to OUT: machine.txt, gpu-report.txt (one line per check), gpu-report.json,
#      gpu-check.log (the engines' logs), rdma-bench.json.
# Without a driver or device every GPU check is skipped, visibly, and the script exits 77.
# --fake runs the same checks on tests/gpu/fake_cuda.c (a CPU rehearsal, small sizes).
# A GPU machine without Baton's build dependencies (libuv, mbedTLS, rdma-core, jansson): make a
# bundle where they are installed, `--bundle-to DIR` (the programs, the fake driver and every
# shared library they need beyond glibc), take DIR there and run `--bundle DIR` (no build).
# Exit: 0 every check passed; 1 a check failed; 77 skipped (no GPU); 2 usage or build error.
set -u

BUILD=build-gpu
OUT=
DO_BUILD=1
FAKE=0
BUNDLE=
BUNDLE_TO=
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-build) DO_BUILD=0; shift ;;
    --fake) FAKE=1; shift ;;
    --bundle-to) BUNDLE_TO=$2; shift 2 ;;
    --bundle) BUNDLE=$2; DO_BUILD=0; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0"
      echo "usage: $0 [--build DIR] [--out DIR] [--no-build] [--fake] [--bundle-to DIR | --bundle DIR]"
      exit 0 ;;
    *) echo "gpu-check: unknown option $1" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
OUT=${OUT:-$BUILD/gpu-check}
mkdir -p "$OUT"
T0=$(date +%s)
say() { echo "gpu-check: $*"; }

# 1. build (the CUDA Toolkit is found by CMake; nvcc compiles the one kernel)
if [ "$DO_BUILD" = 1 ]; then
  CUDA_ROOT=${CUDA_ROOT:-/usr/local/cuda}
  say "building in $BUILD (CUDA Toolkit at $CUDA_ROOT)"
  if ! timeout 300 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCUDAToolkit_ROOT="$CUDA_ROOT" >"$OUT/build.log" 2>&1 ||
     ! timeout 600 cmake --build "$BUILD" -j"$(nproc)" --target baton-gpu-check baton-xfer-bench \
      >>"$OUT/build.log" 2>&1; then
    say "build failed, see $OUT/build.log"; tail -20 "$OUT/build.log"; exit 2
  fi
fi
CHECK=$BUILD/baton-gpu-check
XBENCH=$BUILD/baton-xfer-bench
FAKE_DIR=$BUILD/tests/gpu/fake-driver
if [ -n "$BUNDLE" ]; then
  CHECK=$BUNDLE/bin/baton-gpu-check
  XBENCH=$BUNDLE/bin/baton-xfer-bench
  FAKE_DIR=$BUNDLE/fake-driver
  export LD_LIBRARY_PATH="$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if [ ! -x "$CHECK" ]; then
  say "$CHECK is missing: the build found no CUDA Toolkit or no nvcc (see $OUT/build.log)"; exit 2
fi

if [ -n "$BUNDLE_TO" ]; then
  # the programs, the fake driver, and their shared libraries except glibc's own
  mkdir -p "$BUNDLE_TO/bin" "$BUNDLE_TO/lib" "$BUNDLE_TO/fake-driver"
  cp "$CHECK" "$XBENCH" "$BUNDLE_TO/bin/" && cp "$FAKE_DIR/libcuda.so.1" "$BUNDLE_TO/fake-driver/" || exit 2
  ldd "$CHECK" "$XBENCH" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$BUNDLE_TO/lib/"; done
  say "bundle in $BUNDLE_TO ($(du -sh "$BUNDLE_TO" | cut -f1)): run scripts/gpu-check.sh --bundle $BUNDLE_TO there"
  exit 0
fi

# 2. the machine
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (modified)')"
  echo "kernel: $(uname -r)"
  echo "cpu: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv,noheader 2>&1 |
      sed 's/^/gpu: /'
    nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/driver cuda version: \1/p'
  else
    echo "gpu: nvidia-smi not found"
  fi
  echo "toolkit: $( (${CUDA_ROOT:-/usr/local/cuda}/bin/nvcc --version 2>/dev/null || echo none) | tail -1)"
  if command -v ibv_devices >/dev/null; then
    echo "ibv_devices:"; ibv_devices 2>&1 | sed 's/^/  /'
  else
    echo "ibv_devices: not installed (the check lists devices through libibverbs itself)"
  fi
  echo "rdma_rxe module: $(modinfo -F filename rdma_rxe 2>/dev/null || echo 'not available')"
} >"$OUT/machine.txt"
cat "$OUT/machine.txt"

# 3. Soft-RoCE when there is no RDMA device (root, and a kernel with rdma_rxe)
RXE_MADE=0
have_rdma() { [ -n "$(ls /sys/class/infiniband 2>/dev/null)" ]; }
if [ "$FAKE" = 0 ] && ! have_rdma; then
  if [ "$(id -u)" = 0 ] && timeout 20 modprobe rdma_rxe 2>/dev/null && command -v rdma >/dev/null; then
    ip link add baton-rxe0 type dummy 2>/dev/null
    ip addr add 10.251.77.1/24 dev baton-rxe0 2>/dev/null
    ip link set baton-rxe0 up 2>/dev/null
    if timeout 20 rdma link add baton_rxe0 type rxe netdev baton-rxe0 2>>"$OUT/machine.txt"; then
      RXE_MADE=1
      say "Soft-RoCE: baton_rxe0 on baton-rxe0 (10.251.77.1)" | tee -a "$OUT/machine.txt"
    else
      ip link del baton-rxe0 2>/dev/null
      say "Soft-RoCE: rdma link add failed" | tee -a "$OUT/machine.txt"
    fi
  else
    say "no RDMA device, and no Soft-RoCE here (needs root, the rdma_rxe module and iproute2's rdma)" |
      tee -a "$OUT/machine.txt"
  fi
fi
cleanup() {
  if [ "$RXE_MADE" = 1 ]; then
    rdma link delete baton_rxe0 2>/dev/null
    ip link del baton-rxe0 2>/dev/null
  fi
}
trap cleanup EXIT

# 4. the checks
ARGS=(run --out "$OUT/gpu-report.json")
ENVV=()
if [ "$FAKE" = 1 ]; then
  ARGS+=(--quick --max-bytes 16777216 --no-rdma)
  ENVV=(LD_LIBRARY_PATH="$FAKE_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" BATON_GPU_CHECK_FAKE=1)
fi
say "running baton-gpu-check (at most 9 minutes)"
env "${ENVV[@]}" timeout 560 "$CHECK" "${ARGS[@]}" 2>"$OUT/gpu-check.log" | tee "$OUT/gpu-report.txt"
RC=${PIPESTATUS[0]}
if [ "$RC" = 124 ]; then
  say "baton-gpu-check ran out of time"; RC=1
fi

if [ "$FAKE" = 0 ] && [ "$RC" != 77 ] && have_rdma; then
  # a real provider: the rdma transport between two processes, host memory, every byte checked
  # on the smoke run, then a short measured run
  say "rdma: baton-xfer-bench on $(ls /sys/class/infiniband | tr '\n' ' ')"
  timeout 60 "$XBENCH" --transports rdma --smoke >"$OUT/rdma-smoke.txt" 2>&1
  echo "rdma smoke: exit $?" | tee -a "$OUT/gpu-report.txt"
  timeout 120 "$XBENCH" --transports rdma --sizes 64K,1M,16M --kv-tokens 4k \
    --json "$OUT/rdma-bench.json" --quiet >>"$OUT/rdma-smoke.txt" 2>&1
  echo "rdma bench: exit $? ($OUT/rdma-bench.json)" | tee -a "$OUT/gpu-report.txt"
fi

say "done in $(( $(date +%s) - T0 )) s; exit $RC; reports in $OUT/"
exit "$RC"
