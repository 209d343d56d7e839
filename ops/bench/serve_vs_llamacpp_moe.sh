#!/usr/bin/env bash
# Online speed of one GGUF served by pagedserve and by llama-server, the same load on both:
#
#   bash ops/bench/serve_vs_llamacpp_moe.sh MODEL_FOLDER LABEL [CONCURRENCIES]
#
# MODEL_FOLDER: a checkpoint folder holding the GGUF (ops/models/random_moe_gguf.py writes one);
# LABEL names the outputs, bench/results/serve-LABEL-{c1,c16,...,prefill}.json (+ PNGs, llama-server's
# log). For each concurrency C (default "1 16 64"): max(C, 4) prompts of 128 random tokens,
# 128 output tokens each, at most C in flight, all sent at once (decode tok/s and TPOT). Then the
# prefill: 3 prompts of 1024 tokens, 1 output token, one at a time (prefill tok/s = 1024 / TTFT;
# PREFILL=0 skips it; MAX_MODEL_LEN caps a long-context model's to what the 2 GiB pool holds).
# Any folder holding one GGUF works (ops/models/random_dense_gguf.py writes Gemma and Phi ones).
# pagedserve runs as `pagedserve serve` (all services, 2 threads, --quantization gguf) with room in its
# KV pool for every request in flight; llama-server (LLAMACPP_VENV, default /work/main/.venv-llamacpp)
# gets C slots of the longest request each, 2 threads. The load starts once /health says a worker is
# ready (its model loaded), and `bench serve` warms each server up with one untimed request first.
# rss-LABEL.txt holds each process's RSS then, and the worker's own figures before and after its model
# loaded (`memory` on its worker_started line: the runtime, and what the weights add);
# rss-peaks-LABEL.json every process's peak over the whole run with its parts, llama-server's too
# (rss_peaks.py). Every process started here is stopped on exit.
set -euo pipefail
model=${1:?model folder}
label=${2:?label}
concurrencies=${3:-"1 16 64"}
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$repo/bench/results
port=${PORT:-8710}  # and the six ports above it (a peer's server on the defaults does not clash)
export LLAMACPP_VENV=${LLAMACPP_VENV:-$repo/.venv-llamacpp}
logdir=$(mktemp -d)

"$repo/.venv/bin/pagedserve" serve "$model" --quantization gguf --num-threads 2 \
    --kv-cache-memory 2147483648 --max-num-seqs 64 ${MAX_MODEL_LEN:+--max-model-len "$MAX_MODEL_LEN"} \
    --api-port "$port" --log-dir "$logdir" \
    --front-endpoint tcp://127.0.0.1:$((port + 1)) --worker-endpoint tcp://127.0.0.1:$((port + 2)) \
    --block-manager-endpoint tcp://127.0.0.1:$((port + 3)) --scheduler-ops-port $((port + 5)) \
    --block-manager-ops-port $((port + 6)) &
server=$!
"$repo/.venv/bin/python" -m pagedserve.ops.bench.rss_peaks $server $((port + 4)) "$out/rss-peaks-$label.json" &
sampler=$!  # from the start: the model's load is part of the peak too
trap 'kill -TERM $sampler $server 2>/dev/null; wait $sampler $server 2>/dev/null || true' EXIT
for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break  # a worker is ready
    kill -0 $server 2>/dev/null || { tail -n 50 "$logdir"/*.log; exit 1; }
    sleep 1
done
{
    grep -m1 "model name" /proc/cpuinfo
    for f in "$model"/*.gguf; do echo "file: $(stat -L -c %s "$f") $(basename "$f")"; done  # no machine path
    ps -o pid,rss,args --ppid $server | grep -v "ps -o"
    grep -h -o '"memory": {[^}]*}' "$logdir"/worker-0.log | head -1
} | sed -e "s#$repo/#./#g" -e "s#$HOME/#~/#g" | tee "$out/rss-$label.txt"  # no machine paths

bench() {  # NAME ARGS...
    local name=$1; shift
    "$repo/.venv/bin/pagedserve" bench serve --base-url "http://127.0.0.1:$port/v1" --workload random \
        --request-rate inf --threads 2 --peer-llamacpp --llamacpp-port $((port + 4)) --no-progress \
        --label "$label $name" --out "$out/serve-$label-$name.json" "$@"
}
for c in $concurrencies; do
    n=$((c < 4 ? 4 : c))  # one wave of C at once (4 in a row for C=1): a bounded run time
    bench "c$c" --num-prompts "$n" --max-concurrency "$c" --input-len 128 --output-len 128
done
if [ "${PREFILL:-1}" = 1 ]; then  # PREFILL=0: decode rows only (a shorter run)
    bench prefill --num-prompts 3 --max-concurrency 1 --input-len 1024 --output-len 1
fi
