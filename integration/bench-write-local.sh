#!/usr/bin/env bash
# Goal 4 of issue 27: a 1 GiB write through the mount against the same write to the local
# disk made durable (`cp` + `sync`; a Python loop of 64 KiB writes + `fsync`), in turn, page
# cache dropped before each, with the mount's CPU for each write. Run as root:
#   bash integration/bench-write-local.sh [ROUNDS=3] [JFS=$CARGO_TARGET_DIR/release/jfs]
# The volume is RocksDB with blocks in a local directory on the same disk as the local copy.
set -euo pipefail
cd "$(dirname "$0")/.."
R=${1:-3}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/jfs-target}
if [ -z "${2:-}" ]; then cargo build --release --locked -p jfs >/dev/null; fi
JFS=${2:-$CARGO_TARGET_DIR/release/jfs}
D=$(mktemp -d /var/tmp/jfs-bench-wl.XXXXXX)
trap '"$JFS" umount "$D/mnt" >/dev/null 2>&1 || true; rm -rf "$D"' EXIT
mkdir -p "$D/local" "$D/mnt"
head -c $((1024 << 20)) /dev/urandom > "$D/src.bin"
"$JFS" format "rocksdb://$D/meta" bench --storage "file://$D/blocks" >/dev/null
"$JFS" mount "rocksdb://$D/meta" "$D/mnt" -d --cache-dir "$D/cache" --free-space-ratio 0.01 --log "$D/mount.log" >/dev/null
PID=$(cat "$D/cache"/*/pid 2>/dev/null || pgrep -n -f "mount rocksdb://$D/meta")
cpu() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
now() { date +%s.%N; }
PYW='import os, sys
src, dst = open(sys.argv[1], "rb"), open(sys.argv[2], "wb")
while b := src.read(65536):
    dst.write(b)
dst.flush()
if len(sys.argv) > 3:
    os.fsync(dst.fileno())
dst.close()'
echo "| try | local, durable | jfs mount | ours / local | mount CPU |"
echo "|---|---|---|---|---|"
for r in $(seq "$R"); do
  rm -f "$D/local/x" "$D/mnt/x"; drop
  t0=$(now); cp "$D/src.bin" "$D/local/x"; sync; t1=$(now)
  drop; c0=$(cpu); t2=$(now); cp "$D/src.bin" "$D/mnt/x"; t3=$(now); c1=$(cpu)
  cmp "$D/src.bin" "$D/mnt/x"
  python3 -c "l=$t1-$t0; o=$t3-$t2; print(f'| cp {$r} | {1024/l:.0f} MiB/s | {1024/o:.0f} MiB/s | {l/o:.2f} | {($c1-$c0)/100:.2f} s |')"
  rm -f "$D/local/x" "$D/mnt/x"; drop
  t0=$(now); python3 -c "$PYW" "$D/src.bin" "$D/local/x" fsync; t1=$(now)
  drop; c0=$(cpu); t2=$(now); python3 -c "$PYW" "$D/src.bin" "$D/mnt/x"; t3=$(now); c1=$(cpu)
  cmp "$D/src.bin" "$D/mnt/x"
  python3 -c "l=$t1-$t0; o=$t3-$t2; print(f'| 64 KiB writes {$r} | {1024/l:.0f} MiB/s | {1024/o:.0f} MiB/s | {l/o:.2f} | {($c1-$c0)/100:.2f} s |')"
done
