#!/usr/bin/env bash
# PAT's reference kernel (.peers/, ../shared/peers/pat/README.md) on the cases a bench_attn run
# timed, at the read bandwidth it measured:
#   tests/gpu/pat_bench.sh BENCH_ATTN.jsonl PAT.jsonl
# (run.sh and ab.sh call it, from the repository root, after bench_attn on the same GPU)
set -euo pipefail
[ $# = 2 ] || { echo "usage: $0 BENCH_ATTN.jsonl PAT.jsonl" >&2; exit 2; }
args=$(python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(round(rows[0]["read_bw"] / 1e9))
print(";".join(dict.fromkeys(r["tree"] for r in rows)))
print(",".join(dict.fromkeys("%d/%d" % (r["q_heads"], r["kv_heads"]) for r in rows)))
PY
)
{ read -r bw; read -r trees; read -r heads; } <<<"$args"
exec .peers/tools/run.sh bench --read-bw "$bw" --trees "$trees" --heads "$heads" --json "$2"
