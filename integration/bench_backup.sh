#!/usr/bin/env bash
# Metadata backup benchmark (BENCHMARKS.md, "Metadata backups"): the metadata of N files
# (default 1,000,000, 1,000 per directory) made with `jfs load` of a generated dump on
# RocksDB; then a consistent snapshot into the volume's store (`jfs backup --now`: time,
# bytes, peak RSS) and `jfs recover` of it into empty RocksDB (time, peak RSS), checked by
# listing a directory and the inode count of the recovered volume.
#   bash integration/bench_backup.sh
#   N=100000 bash integration/bench_backup.sh
set -euo pipefail
N=${N:-1000000}
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release --locked -p jfs >/dev/null
JFS=$CARGO_TARGET_DIR/release/jfs
D=$(mktemp -d /tmp/jfs-bench-backup.XXXXXX)
trap 'rm -rf "$D"' EXIT
META=rocksdb://$D/meta
STORE=file://$D/store
# A template: one file of one 4 KiB block, dumped; the generated dump gives every file
# that file's slice (metadata only: the benchmark reads no block).
"$JFS" format "rocksdb://$D/t" bench --storage "$STORE" >/dev/null 2>&1
head -c 4096 /dev/urandom >"$D/x"
"$JFS" put "rocksdb://$D/t" "$D/x" /x >/dev/null 2>&1
"$JFS" dump "rocksdb://$D/t" "$D/t.json" 2>/dev/null
rm -rf "$D/t"
python3 - "$D/t.json" "$D/big.json" "$N" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
n = int(sys.argv[3])
per = 1000
dirs = max(1, (n + per - 1) // per)
root, f = t["inodes"]["1"], t["inodes"]["2"]
D0, F0 = 10_000, 10_000_000
c = dict(t["counters"])
c["next_inode"] = F0 + n + 1
c["used_inodes"] = 1 + dirs + n
c["used_space"] = 4096 * n
out = open(sys.argv[2], "w")
head = {k: v for k, v in t.items() if k not in ("inodes", "counters", "source")}
head["counters"] = c
out.write(json.dumps(head)[:-1] + ',"inodes":{')
r = dict(root, entries={"d%04d" % i: D0 + i for i in range(dirs)})
r["attr"] = dict(root["attr"], nlink=2 + dirs)
out.write('"1":' + json.dumps(r))
fa = f["attr"]
chunks = json.dumps(f["chunks"])
for i in range(dirs):
    lo, hi = i * per, min(n, (i + 1) * per)
    d = {"attr": dict(root["attr"], nlink=2, parent=1),
         "entries": {"f%04d" % (j - lo): F0 + j for j in range(lo, hi)}}
    out.write(',"%d":%s' % (D0 + i, json.dumps(d)))
    for j in range(lo, hi):
        a = json.dumps(dict(fa, parent=D0 + i))
        out.write(',"%d":{"attr":%s,"chunks":%s}' % (F0 + j, a, chunks))
out.write("}}")
PY
measure() { /usr/bin/time -f '%e %M' -o "$D/time" "$@" >"$D/out" 2>"$D/err" || { cat "$D/err"; exit 1; }; read -r SECS KB <"$D/time"; }
echo "metadata backup benchmark: $N files; $(nproc) cores; $(date -u +%F)"
measure "$JFS" load "$META" "$D/big.json" --take-over
echo "jfs load of the generated dump ($(du -m "$D/big.json" | cut -f1) MiB): ${SECS}s, peak RSS $((KB / 1024)) MiB"
rm "$D/big.json"
measure "$JFS" backup "$META" --now --json
SNAP_BYTES=$(du -sb "$D/store/bench/meta-backup/snap" | cut -f1)
KEYS=$("$JFS" recover "$STORE" --name bench --list --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["snapshots"][-1]["keys"])')
echo "snapshot (jfs backup --now): ${SECS}s, $KEYS keys, $((SNAP_BYTES / 1024 / 1024)) MiB in the store, peak RSS $((KB / 1024)) MiB"
measure "$JFS" recover "$STORE" --name bench "rocksdb://$D/new"
echo "recover into empty RocksDB (jfs recover): ${SECS}s, peak RSS $((KB / 1024)) MiB"
got=$("$JFS" ls "rocksdb://$D/new" /d0000 | wc -l)
want=$((N < 1000 ? N : 1000))
[ "$got" = "$want" ] || { echo "recovered /d0000 has $got entries, not $want" >&2; exit 1; }
echo "checked: /d0000 of the recovered volume lists $got entries"
