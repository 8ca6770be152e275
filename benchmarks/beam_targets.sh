#!/usr/bin/env bash
# Issue 40's offline beam targets in one call on a lent GPU: each shape's `bench offline` with
# 4 beams against HF `generate(num_beams=4)` at several batch sizes in the same command (best
# against best), and, for OPUS-MT, the scheduler's full-pass policy against Python's own
# collector trigger on the same machine. JSON and text go to $OUT (default /tmp/beam_targets).
#   bash benchmarks/beam_targets.sh [parts]   parts: any of "mt5 opus nllb gc" (default: all)
# ~6-9 minutes for all four on an H200; run the parts apart if a call's limit is near.
cd "$(dirname "$0")/.." || exit 1
source benchmarks/gpu_setup.sh
OUTDIR=${OUT:-/tmp/beam_targets}; mkdir -p "$OUTDIR"
PARTS=${1:-"mt5 opus nllb gc"}
B="python3 -m seq2serve.runtime.cli bench offline --num-beams 4 --baseline hf --hf-modes default --hf-max-batches 1"
run() {  # name, then bench offline's arguments
    local name=$1; shift
    echo "== $name"
    $B "$@" --json "$OUTDIR/$name.json" >"$OUTDIR/$name.txt" 2>&1
    grep -E "tok/s|best against best" "$OUTDIR/$name.txt"
}
for part in $PARTS; do
    case $part in
    mt5)  # mT5-large, 128 -> 64, 64 / 128 / 512 requests at once (256 / 512 / 2,048 rows)
        run mt5_large --shape mt5-large --num-requests 512 --input-len 128 --output-len 64 \
            --batch-sizes 256,512,2048 --engine-args '{"cuda_graph_max_bs": 2048}' \
            --hf-batch-size 256,512 ;;
    opus)
        run opus_mt --shape opus-mt --num-requests 8192 --input-len 64 --output-len 64 \
            --batch-sizes 2048,4096 --engine-args '{"cuda_graph_max_bs": 4096}' \
            --hf-batch-size 2048,4096 ;;
    nllb)
        run nllb_600m --shape nllb-200-distilled-600m --num-requests 2048 --input-len 64 \
            --output-len 64 --batch-sizes 512,2048 --engine-args '{"cuda_graph_max_bs": 2048}' \
            --hf-batch-size 1024,2048 ;;
    gc)  # the same OPUS-MT run with Python's collector trigger (0) and the default policy
        i=0
        for interval in 0 600 0 600; do
            i=$((i + 1))
            echo "== opus_mt gc_full_pass_interval $interval (run $i)"
            python3 -m seq2serve.runtime.cli bench offline --shape opus-mt --num-requests 8192 \
                --input-len 64 --output-len 64 --num-beams 4 --batch-sizes 2048 \
                --engine-args "{\"cuda_graph_max_bs\": 2048, \"gc_full_pass_interval\": $interval}" \
                --json "$OUTDIR/opus_mt_gc${interval}_$i.json" 2>&1 | grep "tok/s"
        done ;;
    esac
done
