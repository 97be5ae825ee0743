#!/usr/bin/env bash
# The launch by hand against torchherd on one GPU machine, side by side in one run: nodes of
# that machine over ansible_connection=local (no SSH counted), an NCCL all-reduce, one process
# per GPU. Alternates: torchrun by hand, torchherd relaunch (code unchanged); one full launch
# (a changed file) first. Writes one JSON line per run and a summary to $OUT (default
# bench/results/gpu-<date>).
#
#   PY=/opt/torch/.venv/bin/python bench/gpu.sh [reps] [gpus per node]
#
# BEFORE=<a directory holding ansible_collections/ of another version> adds a third arm to each
# repetition, the relaunch with that collection (TORCHHERD_COLLECTIONS_PATH): before and after a
# change, in one run.
#
# Needs the driver's dependencies importable by $PY (ansible-core, ansible-runner, rich, ...:
# pip install -e . into that venv, or wheels unpacked onto PYTHONPATH) and rsync.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-3}
NPROC=${2:-1}
PY=${PY:-python3}
OUT=${OUT:-bench/results/gpu-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
printf '[torchherd_nodes]\ngpu0 ansible_host=127.0.0.1 torchherd_root=%s/node0\n[torchherd_nodes:vars]\nansible_connection=local\nansible_python_interpreter={{ ansible_playbook_python }}\ntorchherd_firewall_enabled=false\n' "$WORK" > "$WORK/inv.ini"
cp -r examples "$WORK/code"

now() { date +%s.%N; }
by_hand() {
  local s e rc=0
  s=$(now)
  "$PY" -m torch.distributed.run --nproc-per-node "$NPROC" --master-port 29631 \
    "$WORK/code/allreduce.py" > "$WORK/hand.log" 2>&1 || rc=$?
  e=$(now)
  "$PY" -c "import json,sys; print(json.dumps({'method': 'hand', 'wall': round($e - $s, 3), 'rc': $rc}))"
}
torchherd() {
  local s e rc=0
  s=$(now)
  ${2:+env TORCHHERD_COLLECTIONS_PATH="$2"} "$PY" -m driver launch -i "$WORK/inv.ini" --runs-dir "$WORK/runs" --code-src "$WORK/code" \
    --nproc-per-node "$NPROC" --master-port 29632 --json -- allreduce.py \
    > "$WORK/th.json" 2> "$WORK/th.err" || rc=$?
  e=$(now)
  "$PY" - "$1" "$(python3 -c "print($e - $s)")" "$rc" "$WORK/th.json" <<'EOF'
import json, sys
method, wall, rc, path = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
try:
    doc = json.load(open(path))
except ValueError:
    doc = {}
print(json.dumps({"method": method, "wall": round(wall, 3), "rc": rc,
                  "state": doc.get("state"), "timings": doc.get("timings")}))
EOF
}

{
  "$PY" -c "import json, sys, torch; print(json.dumps({'python': sys.version.split()[0], 'torch': torch.__version__, 'cuda': torch.version.cuda, 'gpu': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))"
  echo "# $(date -u +%FT%TZ) $(nproc) cores" >> "$WORK/code/allreduce.py"  # a changed file
  torchherd launch
  for _ in $(seq "$REPS"); do
    by_hand
    torchherd relaunch
    if [ -n "${BEFORE:-}" ]; then torchherd before "$BEFORE"; fi
  done
} | tee "$OUT/runs.jsonl"

"$PY" - "$OUT/runs.jsonl" <<'EOF' | tee "$OUT/summary.txt"
import json, statistics, sys
runs = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
env, runs = runs[0], runs[1:]
print("machine:", env)
for method in ("hand", "launch", "relaunch", "before"):
    walls = [r["wall"] for r in runs if r["method"] == method]
    if walls:
        print(f"{method:9s} wall median {statistics.median(walls):6.2f} s  all {walls}")
for method in ("relaunch", "before"):
    rel = [r for r in runs if r["method"] == method and r.get("timings")]
    for key in ("launch", "preflight", "sync", "start", "first_output", "watch", "collect",
                "total"):
        values = [r["timings"][key] for r in rel if key in r["timings"]]
        if values:
            print(f"{method:8s} {key:12s} median {statistics.median(values):6.2f} s")
EOF
