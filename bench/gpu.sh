#!/usr/bin/env bash
# The launch by hand against torchherd on one GPU machine, side by side in one run: nodes of
# that machine over ansible_connection=local (no SSH counted), an NCCL all-reduce, one process
# per GPU. Alternates: torchrun by hand, torchherd relaunch (code unchanged), a full launch with
# one changed file; one full launch (a changed file, a fresh root) first. Writes one JSON line
# per run and a summary to $OUT (default bench/results/gpu-<date>).
#
#   PY=/opt/torch/.venv/bin/python bench/gpu.sh [reps] [gpus per node] [nodes]
#
# nodes (default 1): that many nodes of the machine, each with its own root and loopback
# address (127.0.0.1, .2, ...), as inventories/local.ini; by hand, as many torchruns started at
# once with their node ranks. With more than one node the master's watch waits on its gang.
#
# BEFORE=<a directory holding ansible_collections/ of another version> adds a third arm to each
# repetition, the relaunch with that collection (TORCHHERD_COLLECTIONS_PATH): before and after a
# change, in one run. BEFORE_TREE=<a checkout of another version> does the same with that
# version's driver and collection both (the driver run from that checkout, its own node roots
# and runs directory, so that neither version reads the other's records or caches).
#
# Needs the driver's dependencies importable by $PY (ansible-core, ansible-runner, rich, ...:
# pip install -e . into that venv, or wheels unpacked onto PYTHONPATH) and rsync.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
NPROC=${2:-1}
NODES=${3:-1}
PY=${PY:-python3}
# Absolute (the other version's arm runs from its own checkout), the venv's link kept.
if [[ $PY == */* ]]; then PY=$(realpath -s "$PY"); fi
OUT=${OUT:-bench/results/gpu-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
{
  echo '[torchherd_nodes]'
  for i in $(seq 0 $((NODES - 1))); do
    echo "gpu$i ansible_host=127.0.0.$((i + 1)) torchherd_root=$WORK/node$i"
  done
  printf '[torchherd_nodes:vars]\nansible_connection=local\nansible_python_interpreter={{ ansible_playbook_python }}\ntorchherd_firewall_enabled=false\n'
} > "$WORK/inv.ini"
sed "s|$WORK/node|$WORK/before|" "$WORK/inv.ini" > "$WORK/inv-before.ini"
cp -r examples "$WORK/code"
cp -r examples "$WORK/code-before"

now() { date +%s.%N; }
by_hand() {
  local s e rc=0
  s=$(now)
  local pids=() i
  for i in $(seq 0 $((NODES - 1))); do
    "$PY" -m torch.distributed.run --nnodes "$NODES" --node-rank "$i" --nproc-per-node "$NPROC" \
      --master-addr 127.0.0.1 --master-port 29631 \
      "$WORK/code/allreduce.py" > "$WORK/hand$i.log" 2>&1 &
    pids+=($!)
  done
  # The job's first output line by hand, as torchherd's first_output counts it: a rank's first
  # line (the example's init line), looked for every 20 ms.
  rm -f "$WORK/hand.first"
  (while ! cat "$WORK"/hand*.log 2>/dev/null | grep -q torchherd-init; do sleep 0.02; done
   now > "$WORK/hand.first") &
  local poll=$!
  for i in "${pids[@]}"; do wait "$i" || rc=$?; done
  e=$(now)
  kill "$poll" 2>/dev/null || true
  wait "$poll" 2>/dev/null || true
  local first=None
  if [ -s "$WORK/hand.first" ]; then first="round($(cat "$WORK/hand.first") - $s, 3)"; fi
  "$PY" -c "import json,sys; print(json.dumps({'method': 'hand', 'wall': round($e - $s, 3), 'rc': $rc, 'first_output': $first}))"
}
torchherd() {
  local s e rc=0
  s=$(now)
  local tree=. inv="$WORK/inv.ini" runs="$WORK/runs"
  local code="$WORK/code"
  if [[ $1 == before* ]] && [ -n "${BEFORE_TREE:-}" ]; then
    # Its own copy of the code: the changed-file arm's edits would make every one a sync.
    tree=$BEFORE_TREE inv="$WORK/inv-before.ini" runs="$WORK/runs-before" code="$WORK/code-before"
  fi
  (cd "$tree" && ${2:+env TORCHHERD_COLLECTIONS_PATH="$2"} "$PY" -m driver launch -i "$inv" \
    --runs-dir "$runs" --code-src "$code" \
    --nproc-per-node "$NPROC" --master-port 29632 --json -- allreduce.py) \
    > "$WORK/th.json" 2> "$WORK/th.err" || rc=$?
  e=$(now)
  if [ "$rc" != 0 ]; then cp "$WORK/th.err" "$OUT/failed-$1-$(date +%H%M%S).err"; fi
  "$PY" - "$1" "$(python3 -c "print($e - $s)")" "$rc" "$WORK/th.json" "$e" <<'EOF'
import json, sys
method, wall, rc, path = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
try:
    doc = json.load(open(path))
except ValueError:
    doc = {}
# The command's return after the job's end on its last node (the nodes' clocks are this one's).
ends = [h.get("ended_at") for h in (doc.get("hosts") or {}).values()]
ends = [t for t in ends if isinstance(t, (int, float))]
print(json.dumps({"method": method, "wall": round(wall, 3), "rc": rc,
                  "state": doc.get("state"), "timings": doc.get("timings"),
                  "returned_after_end": round(float(sys.argv[5]) - max(ends), 3) if ends else None}))
EOF
}

{
  "$PY" -c "import json, sys, torch; print(json.dumps({'python': sys.version.split()[0], 'torch': torch.__version__, 'cuda': torch.version.cuda, 'gpu': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))"
  echo "# $(date -u +%FT%TZ) $(nproc) cores" >> "$WORK/code/allreduce.py"  # a changed file
  torchherd launch
  if [ -n "${BEFORE_TREE:-}" ]; then torchherd before-launch; fi
  for _ in $(seq "$REPS"); do
    by_hand
    torchherd relaunch
    if [ -n "${BEFORE:-}" ]; then torchherd before "$BEFORE"; fi
    if [ -n "${BEFORE_TREE:-}" ]; then torchherd before; fi
    # A full launch with one changed file (the next relaunch finds the code unchanged again).
    echo "# $(date -u +%FT%T.%NZ)" >> "$WORK/code/allreduce.py"
    torchherd changed
  done
} | tee "$OUT/runs.jsonl"

"$PY" - "$OUT/runs.jsonl" <<'EOF' | tee "$OUT/summary.txt"
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
env, runs = runs[0], runs[1:]
print("machine:", env)
for method in ("hand", "launch", "before-launch", "relaunch", "before", "changed"):
    walls = [r["wall"] for r in runs if r["method"] == method]
    if walls:
        print(f"{method:9s} wall median {statistics.median(walls):6.2f} s  all {walls}")
firsts = [r["first_output"] for r in runs if r["method"] == "hand" and r.get("first_output")]
if firsts:
    print(f"hand      first output median {statistics.median(firsts):6.2f} s  all {firsts}")
for method in ("relaunch", "before", "changed"):
    rel = [r for r in runs if r["method"] == method and r.get("timings")]
    for key in ("launch", "plan", "preflight", "sync", "start", "launcher_started",
                "launcher_ready", "first_output", "watch", "collect", "total", "after_end"):
        values = [r["timings"][key] for r in rel if key in r["timings"]]
        if values:
            print(f"{method:8s} {key:12s} median {statistics.median(values):6.2f} s")
    values = [r["returned_after_end"] for r in rel if r.get("returned_after_end") is not None]
    if values:
        print(f"{method:8s} returned after the job's end: median "
              f"{statistics.median(values):5.2f} s  all {values}")
EOF
