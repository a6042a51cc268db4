#!/usr/bin/env bash
# Benchmarks, run on demand (never part of the test suite): metadata ops/s and journal rates per
# engine (jfs-bench), and put/get of a 1 GiB file against cp. Prints Markdown for BENCHMARKS.md.
# usage: bash integration/bench.sh [FILES_PER_TASK]
set -euo pipefail
cd "$(dirname "$0")/.."
FILES=${1:-2000}
bash integration/install-deps.sh test
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/jfs-target}
cargo build --release --locked -p jfs -p bench >/dev/null
JFS=$CARGO_TARGET_DIR/release/jfs; BENCH=$CARGO_TARGET_DIR/release/jfs-bench
W=$(mktemp -d /tmp/jfs-bench.XXXXXX); chmod 755 "$W"; SVC=$W/svc
cleanup() { bash integration/services.sh down "$SVC" || true; rm -rf "$W"; }
trap cleanup EXIT
bash integration/services.sh up "$SVC" >/dev/null
# shellcheck disable=SC1091
source "$SVC/env"

echo "### Metadata and journal, 4 concurrent writers x $FILES files, blocks on a local directory"
echo
echo "| engine | create + 4 KiB write /s | lookup /s | rename /s | journal append /s | journal read /s |"
echo "|---|---|---|---|---|---|"
for url in "rocksdb://$W/meta" "$JFS_TEST_REDIS?prefix=bench" "$JFS_TEST_PG?schema=bench"; do
  j=$($BENCH --meta "$url" --storage "file://$W/blocks-$RANDOM" --files "$FILES")
  python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print("| {engine} | {create_write_per_s:.0f} | {lookup_per_s:.0f} | {rename_per_s:.0f} | {journal_append_per_s:.0f} | {journal_read_per_s:.0f} |".format(**r))' "$j"
done

echo
echo "### 1 GiB file: jfs put / jfs get (RocksDB + local directory store) vs cp, same disk"
echo
head -c $((1 << 30)) /dev/urandom > "$W/big"
sync
secs() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null 2>&1; sync; t1=$(date +%s.%N); echo "$t1 - $t0" | bc; }
median() { printf '%s\n' "$@" | sort -n | sed -n 2p; }
cps=(); puts=(); gets=()
for i in 1 2 3; do
  rm -rf "$W/cp.out" "$W/v$i" "$W/get$i"
  cps+=("$(secs cp "$W/big" "$W/cp.out")")
  $JFS -q format "rocksdb://$W/v$i/meta" b --storage "file://$W/v$i/blocks" >/dev/null
  puts+=("$(secs $JFS -q put "rocksdb://$W/v$i/meta" "$W/big" /big)")
  gets+=("$(secs $JFS -q get "rocksdb://$W/v$i/meta" /big "$W/get$i")")
  cmp "$W/big" "$W/get$i"
  rm -rf "$W/v$i" "$W/get$i"
done
cp_s=$(median "${cps[@]}"); put_s=$(median "${puts[@]}"); get_s=$(median "${gets[@]}")
echo "| operation | seconds (median of 3, incl. sync) | MiB/s | vs cp |"
echo "|---|---|---|---|"
for row in "cp:$cp_s" "jfs put:$put_s" "jfs get:$get_s"; do
  name=${row%%:*}; s=${row#*:}
  python3 -c 'import sys; s=float(sys.argv[2]); c=float(sys.argv[3]); print(f"| {sys.argv[1]} | {s:.2f} | {1024/s:.0f} | {c/s:.2f}x |")' "$name" "$s" "$cp_s"
done
