#!/usr/bin/env bash
# Every GPU check of the triton backend on a CUDA machine (about 9 minutes on an H200 before the
# local tiles' step and the GATv2 chunk rows: about 11 now; the step limits add up to 17), from the
# repository root:  OUT=<folder> bash benchmarks/gpu_check.sh
# Where one command may run 10 minutes at most, split it in two:
#   PARTS="tests random windows" OUT=<folder> bash benchmarks/gpu_check.sh
#   PARTS="layers ab" OUT=<folder> bash benchmarks/gpu_check.sh
#   PARTS="gps" OUT=<folder> bash benchmarks/gpu_check.sh     # not in the default: about 5 minutes more
#   1. versions; the triton tests on CUDA (test_triton.py, edge terms, bf16, non-finite values, GQA);
#   2. random 2^20 nodes, in-degree 16, both modes: triton fwd and fwd+bwd in float32 and in bfloat16
#      (the float32 / bfloat16 time ratio is read from the two JSON files);
#   3. windows of radius 8 and 64 against FlexAttention (bfloat16, clamp): the triton backend, and the
#      local backend's Triton tiles (kernel_options local_tiles="triton") with other key blocks and
#      tile rows, and its torch tiles;
#   4. TransformerConv, GATConv and GATv2Conv on 20K nodes against PyG eager and compiled, GATv2's score
#      op also in chunks of 2^20 .. 2^27 values (the sweep behind its CUDA CHUNK_VALUES);
#   5. float32 A/B: the peaked-softmax gradient tests and the random graph's times with the forward's
#      scores kept (the default) and with every kernel summing them in float64 instead
#      (--float32-scores wide); the float32 forward's launch settings swept.
#   6. (PARTS "gps") the GraphGPS model's training step against PyG's eager and compiled, and ours captured in
#      CUDA graphs (bench_layers --gps --device cuda; the capture also runs a warm step under
#      torch.cuda.set_sync_debug_mode("error"), whose traceback names any op that reads back to the host).
# PARTS="tests random windows layers ab" (the default: all but "gps") picks steps.
# Each step has its own time limit, so a slow one costs only its share. $OUT gets the log
# (gpu_check.log) and, after every step, gpu_results.tar.gz: the benchmarks' JSON, PNG and logs, by run.
set -o pipefail
OUT=${OUT:-benchmarks/results}
RUNS=$(mktemp -d)
mkdir -p "$OUT" "$RUNS/windows" "$RUNS/local"
LOG="$OUT/gpu_check.log"
export PYTHONUNBUFFERED=1
t0=$(date +%s)

step() {  # step <seconds> <command...>: run it with a limit, log its output and exit status
    local limit=$1
    shift
    echo "=== +$(($(date +%s) - t0)) s: $* (limit ${limit} s)" | tee -a "$LOG"
    timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
    echo "=== exit ${PIPESTATUS[0]}" | tee -a "$LOG"
    tar czf "$OUT/gpu_results.tar.gz" -C "$RUNS" .
}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    python3 -c "import torch_geometric; print('torch_geometric', torch_geometric.__version__)"
    git rev-parse --short HEAD 2>/dev/null
} 2>&1 | tee "$LOG"

PARTS=${PARTS:-tests random windows layers ab}
has() { [[ " $PARTS " == *" $1 "* ]]; }

PYTEST=(python3 -m pytest -q -p no:cacheprovider -m "not slow" -n 8 --maxfail=20)
has tests && step 150 "${PYTEST[@]}" tests/kernels/test_triton.py tests/kernels/test_triton_edge_terms.py
has tests && step 80 "${PYTEST[@]}" tests/kernels/test_sharp_bf16.py tests/kernels/test_non_finite.py tests/kernels/test_gqa.py \
    tests/kernels/test_triton_blocks.py tests/kernels/test_local_triton.py tests/test_capturable_step.py -k "triton or cuda"

BENCH=(python3 benchmarks/bench_triton_gpu.py --warmup 2 --rep 5 --contender-s 2)
has random && step 75 "${BENCH[@]}" --out "$RUNS" --cases random --contenders triton --dtype float32 --budget 60
has random && step 65 "${BENCH[@]}" --out "$RUNS" --cases random --contenders triton --budget 50
has windows && step 60 "${BENCH[@]}" --out "$RUNS/windows" --cases window8,window64 --modes clamp \
    --contenders triton,flex --budget 45
has windows && step 100 "${BENCH[@]}" --out "$RUNS/local" --cases window8,window64 --modes clamp,exact \
    --contenders local-triton,local-triton-n16,local-triton-n64,local-triton-t32,local-triton-t64,local-torch,flex --budget 85
has layers && step 130 python3 -m benchmarks.bench_layers --device cuda --big-layers --nodes 20000 --out "$RUNS" \
    --gatv2-chunks 20,22,24,26,27

has gps && step 300 python3 -m benchmarks.bench_layers --device cuda --gps --out "$RUNS/gps"

WIDE="from sparseattn.kernels.triton import launch; launch.SAVE_FLOAT32_SCORES = False"
PEAKED=(tests/kernels/test_triton.py -q -p no:cacheprovider -k "peaked or bit_for_bit")
has ab && step 60 python3 -m pytest "${PEAKED[@]}"
has ab && step 60 python3 -c "$WIDE; import sys, pytest; sys.exit(pytest.main(sys.argv[1:]))" "${PEAKED[@]}"
has ab && step 75 "${BENCH[@]}" --out "$RUNS" --cases random --contenders triton --dtype float32 --budget 60 \
    --float32-scores wide
has ab && step 150 "${BENCH[@]}" --out "$RUNS" --sweep --cases random --modes exact --dtype float32 --budget 130
echo "=== done at +$(($(date +%s) - t0)) s" | tee -a "$LOG"
