#!/usr/bin/env bash
# make demo: train the default model if there is none, export it, serve it, stream a sampled and a
# greedy completion, run a short benchmark, print the summary, stop the server. Run from the project root.
set -euo pipefail
BIN=.venv/bin
RUN=${DEMO_RUN:-runs/small}
MODEL=${DEMO_MODEL:-models/small}
PORT=${DEMO_PORT:-50151}
BUDGET=${DEMO_TRAIN_SECONDS:-180}
LOG=$(mktemp -t attnserve-demo-XXXX.log)

step() { printf '\n== %s\n' "$*"; }

if [ ! -f "$RUN/checkpoint.pt" ]; then
  step "1/6 training the default model ($BUDGET s on CPU; progress below)"
  "$BIN/attnserve" train --out "$RUN" --time-budget "$BUDGET"
else
  step "1/6 using the trained model in $RUN (delete it to train again)"
fi

step "2/6 exporting to ONNX with the parity gate"
"$BIN/attnserve" export "$RUN/checkpoint.pt" --out "$MODEL"

step "3/6 serving $MODEL on 127.0.0.1:$PORT (log: $LOG)"
"$BIN/attnserve" serve --model "$MODEL" --host 127.0.0.1 --port "$PORT" >"$LOG" 2>&1 &
SERVER=$!
trap 'kill -TERM $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  if "$BIN/python" -c "
import sys
from attnserve.clients import Client
sys.exit(0 if Client('127.0.0.1:$PORT').health(timeout=1.0) else 1)" 2>/dev/null; then break; fi
  kill -0 $SERVER 2>/dev/null || { cat "$LOG"; exit 1; }
  sleep 0.5
done

SAMPLED="--temperature 0.8 --top-p 0.95 --repetition-penalty 1.1 --seed 7"
step "4/6 streaming a sampled completion: $SAMPLED (the README's recommended sampling)"
# shellcheck disable=SC2086
"$BIN/attnserve" generate "def parse_args(" --target "127.0.0.1:$PORT" --max-new-tokens 100 $SAMPLED
echo

step "5/6 the greedy completion (the default, temperature 0): the decoding the export's parity gate checked against PyTorch"
"$BIN/attnserve" generate "def parse_args(" --target "127.0.0.1:$PORT" --max-new-tokens 60
echo

step "6/6 a short benchmark (prompts of exactly 32 token ids, 64 new tokens each)"
mkdir -p reports  # attnserve bench writes its files, never the directory they go in
"$BIN/attnserve" bench --target "127.0.0.1:$PORT" --concurrency 1,4,16 --requests 32 \
  --max-new-tokens 64 --out reports/demo-bench.json --plot reports/demo-bench.png

step "done: model in $MODEL, benchmark in reports/demo-bench.json and reports/demo-bench.png"
