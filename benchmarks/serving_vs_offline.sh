#!/usr/bin/env bash
# Issue 38's serving figures on a lent GPU: `seq2serve serve` of a real shape (random weights,
# bf16), a fixed-concurrency load from client processes with the offline engine on the same
# workload in the same run, then Poisson arrival rates. Every figure's JSON goes to $OUT.
#   bash benchmarks/serving_vs_offline.sh [shape] [concurrency] [requests] [in] [out] [rates]  ("": none)
# SERVE_ARGS: more `serve` flags (e.g. "--api-server-count 4"); NO_SPY=1: no py-spy (its
# sampling stops the processes it reads, which slows the server it measures); BEAMS=N: beam
# search with N beams (requests answered whole; the server runs CONC x N rows); ENGINE_ARGS:
# the offline engine's options as JSON (default: dummy weights, bf16, mem_fraction 0.9);
# AUDIO_SECONDS=S: a Whisper shape's load, S-second WAV clips to /v1/audio/transcriptions
# (`bench serving --audio-seconds`; [in] unused); IMAGE_SIZE=S: an image model's load (Florence-2,
# Mllama), chat messages of a distinct SxS JPEG image and [in] words (`--image-size`); SPY_AT, SPY_SECONDS, SPY_ARGS: when py-spy
# starts (s after the server is up), for how long, more py-spy flags; NO_OFFLINE=1: the
# fixed-concurrency load without the offline engine's run beside it
cd "$(dirname "$0")/.." || exit 1
source benchmarks/gpu_setup.sh
SHAPE=${1:-mt5-large} CONC=${2:-256} NREQ=${3:-2048} IN=${4:-64} OUTLEN=${5:-128}
RATES=${6-"20 40 80"} WORKERS=${WORKERS:-8} PORT=30000 BEAMS=${BEAMS:-1}
MEDIA="${AUDIO_SECONDS:+--audio-seconds $AUDIO_SECONDS} ${IMAGE_SIZE:+--image-size $IMAGE_SIZE}"
OUTDIR=${OUT:-/tmp/serving_bench}; mkdir -p "$OUTDIR"
MODEL=$(python3 -c "from seq2serve.runtime.bench.shapes import write_shape; print(write_shape('$SHAPE', '/tmp/shape-$SHAPE'))")
S2S="python3 -m seq2serve.runtime.cli"
$S2S serve --model-path "$MODEL" --load-format dummy --dtype bfloat16 --port $PORT \
    --mem-fraction 0.45 --max-running-requests "$((CONC * BEAMS))" ${SERVE_ARGS:-} \
    >"$OUTDIR/serve_$SHAPE.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; sleep 2; pkill -f "seq2serve.runtime.cli serve" 2>/dev/null' EXIT
for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
    kill -0 $SERVER 2>/dev/null || { tail -40 "$OUTDIR/serve_$SHAPE.log"; exit 1; }
    sleep 1
done
echo "server ready after $SECONDS s"
# the server processes' CPU while the fixed-concurrency load runs (one snapshot a few s in)
# and, where py-spy was carried (.whl), where the processes' time goes (collapsed stacks)
(sleep ${SPY_AT:-3}; top -b -n 1 -w 200 | head -25 >"$OUTDIR/top_c$CONC.txt") &
SPY=/tmp/site/bin/py-spy
[ -x $SPY ] && [ -z "${NO_SPY:-}" ] && (sleep ${SPY_AT:-3}; $SPY record -p $SERVER --subprocesses -d ${SPY_SECONDS:-8} -r 200 -f raw ${SPY_ARGS:-} \
    -o "$OUTDIR/spy_c$CONC.txt" >"$OUTDIR/spy.log" 2>&1) &
$S2S bench serving --base-url "http://127.0.0.1:$PORT" --num-requests "$NREQ" --input-len "$IN" \
    --output-len "$OUTLEN" --concurrency "$CONC" --workers "$WORKERS" $([ -z "${NO_OFFLINE:-}" ] && echo --compare-offline) \
    --num-beams "$BEAMS" $MEDIA \
    --engine-args "${ENGINE_ARGS:-{\"load_format\": \"dummy\", \"dtype\": \"bfloat16\", \"mem_fraction\": 0.9\}}" \
    --json "$OUTDIR/serving_c$CONC.json" | grep -Ev '^\s*[][{}"0-9-]'
curl -s "http://127.0.0.1:$PORT/metrics" >"$OUTDIR/metrics_c$CONC.txt"
curl -s "http://127.0.0.1:$PORT/debug/stats" >"$OUTDIR/stats_c$CONC.json"
# each rate's load its own prompts (--seed): the concurrency load's, repeated, would be
# answered by the server's encoder and prefix caches
SEED=0
for RATE in $RATES; do
    SEED=$((SEED + 1))
    N=$(python3 -c "print(int($RATE * ${RATE_SECONDS:-20}))")
    $S2S bench serving --base-url "http://127.0.0.1:$PORT" --num-requests "$N" --seed "$SEED" \
        --input-len "$IN" --output-len "$OUTLEN" --request-rate "$RATE" --workers "$WORKERS" \
        --num-beams "$BEAMS" $MEDIA \
        --json "$OUTDIR/serving_rate$RATE.json" | grep -Ev '^\s*[][{}"0-9-]'
done
cat "$OUTDIR/top_c$CONC.txt" 2>/dev/null | sed -n 7,16p
