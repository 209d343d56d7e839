#!/usr/bin/env bash
# pagedserve serve against llama-server on the same GGUF, over HTTP, at a few concurrencies, with the
# peak RSS of every process of both. Run from the repo root, alone on the machine:
#
#   LLAMACPP_VENV=/path/.venv-llamacpp bash ops/bench/serve_vs_llamacpp.sh MODEL_FOLDER NAME [1 4 16]
#
# MODEL_FOLDER holds the GGUF (e.g. $PAGEDSERVE_CACHE/smollm2-135m-q4_k_m from
# `python -m pagedserve.ops.models.requantize_gguf Q4_K_M`). Per concurrency c: `bench serve` with c
# requests in flight (6 prompts at c=1, 2c above), 64 prompt tokens, 128 output tokens, greedy, EOS
# ignored, then the same load on llama-server with c slots and 2 threads. Writes
# bench/results/NAME-c<c>.{json,png} and bench/results/NAME-rss.json.
set -u
model=$1; name=$2; shift 2
concurrencies=${*:-1 4 16}
out=bench/results; logs=$(mktemp -d)
.venv/bin/pagedserve serve --model "$model" --quantization gguf --num-threads 2 --kv-cache-memory 536870912 \
  --api-port 18431 --scheduler-ops-port 18433 --block-manager-ops-port 18434 --log-dir "$logs" > "$logs/serve.out" 2>&1 &
serve=$!
for _ in $(seq 1 300); do curl -sf http://127.0.0.1:18431/health > /dev/null && break; sleep 1; done
.venv/bin/python -m pagedserve.ops.bench.rss_peaks "$serve" 18432 "$out/$name-rss.json" &
sampler=$!
for c in $concurrencies; do
  n=$(( c < 4 ? 6 : c * 2 ))
  echo "c=$c ($n prompts) from $(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg)"
  .venv/bin/pagedserve bench serve --base-url http://127.0.0.1:18431/v1 --workload random --num-prompts "$n" \
    --input-len 64 --output-len 128 --max-concurrency "$c" --threads 2 --peer-llamacpp --llamacpp-port 18432 \
    --llamacpp-parallel "$c" --no-progress --label "$name c$c" --out "$out/$name-c$c.json"
done
kill "$sampler"; wait "$sampler"
kill -INT "$serve"; wait "$serve"
echo "done $(date -u +%T); logs in $logs"
