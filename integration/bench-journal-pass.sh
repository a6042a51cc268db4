#!/usr/bin/env bash
# The cost of a RocksDB volume's first open after a bulk write, and of the incremental
# volume -> volume pass that follows (`jfs-sync --from-journal` after 100 changes). Run on
# demand, as root (it drops the page cache):
#   bash integration/bench-journal-pass.sh [N=50000] [BINDIR=$CARGO_TARGET_DIR/release]
# A full copy of N files (1 B to 4 KiB, 100 folders) from a directory into volume A, A's
# write-ahead log left behind, the first and second open of A (`jfs status`), a full copy A -> B,
# 100 files changed in A, then the timed incremental pass A -> B.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-50000}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/jfs-target}
if [ -z "${2:-}" ]; then cargo build --release --locked -p jfs -p sync-cli >/dev/null; fi
B=${2:-$CARGO_TARGET_DIR/release}
W=$(mktemp -d /tmp/jfs-bench-jp.XXXXXX)
trap 'rm -rf "$W"' EXIT
python3 integration/trees.py tiny "$W/src" "$N"
mkdir -p $W/sa $W/sb
$B/jfs format rocksdb://$W/ma va --storage file://$W/sa >/dev/null 2>&1
$B/jfs format rocksdb://$W/mb vb --storage file://$W/sb >/dev/null 2>&1
export A=rocksdb://$W/ma BV=rocksdb://$W/mb
export XDG_CACHE_HOME=$W/cache
t() { local t0; t0=$(date +%s.%N); "$@" >/dev/null 2>$W/err || { cat $W/err; exit 1; }; echo "$(date +%s.%N) - $t0" | bc; }
echo "full copy dir -> A:        $(t $B/jfs-sync $W/src/ jfs://A/)"
echo "WAL files in A:            $(ls -la $W/ma/*.log 2>/dev/null | awk '{s+=$5} END {print s+0}') bytes"
sync; echo 3 > /proc/sys/vm/drop_caches
echo "first open of A (status):  $(t $B/jfs status $A)"
echo "second open of A (status): $(t $B/jfs status $A)"
echo "full copy A -> B:          $(t $B/jfs-sync jfs://A/ jfs://BV/ --from-journal)"
for i in $(seq 0 99); do echo "changed $i" > $W/c; $B/jfs put $A $W/c /d$(printf %03d $((i % 100)))/f$(printf %06d $i) >/dev/null 2>&1; done
sync; echo 3 > /proc/sys/vm/drop_caches
echo "incremental A -> B (100):  $(t $B/jfs-sync jfs://A/ jfs://BV/ --from-journal)"
