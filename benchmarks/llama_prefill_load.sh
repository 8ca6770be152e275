#!/usr/bin/env bash
# Issue 38's Llama target on a lent GPU: Llama-3.2-1B shape (random weights, bf16) served,
# 128 streams decoding (short prompts, long outputs) alone, then with ~1,000-token prompts
# arriving at 10 req/s beside them; the decode streams' ITL p50 / p99 in both. Then sampled
# against greedy decoding at 64 requests through the engine (`bench sampling`).
#   bash benchmarks/llama_prefill_load.sh          (JSON and logs in $OUT or /tmp/llama_load)
#   SERVE_ARGS="--chunked-prefill-size 512" SAMPLING=0 bash benchmarks/llama_prefill_load.sh
cd "$(dirname "$0")/.." || exit 1
source benchmarks/gpu_setup.sh
OUTDIR=${OUT:-/tmp/llama_load}; mkdir -p "$OUTDIR"; PORT=30001
MODEL=$(python3 -c "from seq2serve.runtime.bench.shapes import write_shape; print(write_shape('llama-3.2-1b', '/tmp/shape-llama'))")
S2S="python3 -m seq2serve.runtime.cli"
$S2S serve --model-path "$MODEL" --load-format dummy --dtype bfloat16 --port $PORT \
    --mem-fraction 0.45 --max-running-requests 256 ${SERVE_ARGS:-} >"$OUTDIR/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; sleep 2' EXIT
for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
    kill -0 $SERVER 2>/dev/null || { tail -40 "$OUTDIR/serve.log"; exit 1; }
    sleep 1
done
URL="http://127.0.0.1:$PORT"
DECODE="--concurrency 128 --input-len 32 --output-len ${DECODE_LEN:-512} --workers 4"
echo "== 128 decoding streams alone"
$S2S bench serving --base-url $URL --num-requests 384 $DECODE --json "$OUTDIR/decode_alone.json" \
    | grep -E "requests|ITL|TTFT"
echo "== the same, with long prompts arriving at ${RATE:-10} req/s"
$S2S bench serving --base-url $URL --num-requests 640 $DECODE --json "$OUTDIR/decode_mixed.json" \
    >"$OUTDIR/decode_mixed.txt" &
DEC=$!
sleep 2
$S2S bench serving --base-url $URL --num-requests ${PROMPTS:-100} --input-len ${PROMPT_WORDS:-1000} \
    --output-len 8 --request-rate ${RATE:-10} --workers 2 --seed 7 --json "$OUTDIR/long_prompts.json" \
    | grep -E "requests|TTFT"
wait $DEC
grep -E "requests|ITL|TTFT" "$OUTDIR/decode_mixed.txt"
python3 - "$OUTDIR" <<'PY'
import json, sys
d = sys.argv[1]
for name in ("decode_alone", "decode_mixed"):
    r = json.load(open(f"{d}/{name}.json"))
    itl = r["itl"]
    print(f"{name}: ITL p50 {itl['p50_ms']:.2f} ms, p99 {itl['p99_ms']:.2f} ms: "
          f"p99/p50 {itl['p99_ms'] / itl['p50_ms']:.2f}x; {r['output_tokens_per_s']:.0f} tok/s")
r = json.load(open(f"{d}/long_prompts.json"))
print(f"long prompts: {r['input_tokens'] / r['requests']:.0f} tokens each, TTFT p50 "
      f"{r['ttft']['p50_ms']:.1f} ms, p99 {r['ttft']['p99_ms']:.1f} ms")
PY
kill $SERVER; wait $SERVER 2>/dev/null
[ "${SAMPLING:-1}" = 0 ] && exit 0  # SAMPLING=0: the serving part only
echo "== sampled against greedy, 64 requests together (engine)"
for EXTRA in "" "--unseeded" "--top-p 0.9" "--unseeded --top-p 0.9"; do
    echo "-- temperature 0.8 $EXTRA"
    $S2S bench sampling --shape llama-3.2-1b --device cuda --dtype bfloat16 --num-requests 64 \
        --output-len 256 $EXTRA --json "$OUTDIR/sampling${EXTRA// /_}.json" | tail -3
done
