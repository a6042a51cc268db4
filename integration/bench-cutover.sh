#!/usr/bin/env bash
# Storage cutover benchmarks (BENCHMARKS.md, "Storage cutover"), in one run, as ratios:
#  - writer pause: a Python writer through a `jfs mount` writes 1 MiB checkpoints (write,
#    fsync, rename) in a loop; the latency of each, before the cutover and around `switch`
#    and `finish` (p50 / p99 / max);
#  - the cost of dual write: 512 MiB written through the mount (dd + fsync), single store vs
#    dual write;
#  - backfill throughput (MiB/s of what it copied) against jfs-sync copying the old store's
#    block files directory to directory.
# A RocksDB volume, stores in local directories (A and B on the same disk), so the figures
# measure the mechanism, not a network. Needs root (FUSE, drop_caches).
#   bash integration/bench-cutover.sh            # 1 GiB to backfill
#   SIZE_MB=256 bash integration/bench-cutover.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/jfs-target}
cargo build --release --locked -p jfs -p sync-cli >/dev/null
JFS=$CARGO_TARGET_DIR/release/jfs
SYNC=$CARGO_TARGET_DIR/release/jfs-sync
SIZE_MB=${SIZE_MB:-1024}
D=$(mktemp -d /tmp/jfs-bench-cutover.XXXXXX)
MNT=$D/mnt
META=rocksdb://$D/meta
mkdir -p "$MNT"
W=
cleanup() {
  [ -n "$W" ] && kill "$W" 2>/dev/null || true
  "$JFS" umount "$MNT" >/dev/null 2>&1 || "$JFS" umount --force "$MNT" >/dev/null 2>&1 || true
  rm -rf "$D"
}
trap cleanup EXIT
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
secs() { python3 -c 'import sys,time,subprocess; t=time.time(); subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(f"{time.time()-t:.3f}")' "$@"; }
ratio() { python3 -c "print(f'{$1/$2:.2f}')"; }
mbps() { python3 -c "print(f'{$1/$2:.0f}')"; }

"$JFS" format "$META" bench --storage "file://$D/a" >/dev/null
"$JFS" mount "$META" "$MNT" -d --cache-size 0 --log "$D/mount.log" >/dev/null
echo "storage cutover benchmark: $SIZE_MB MiB to backfill; $(nproc) cores; $(date -u +%F)"
echo

# The data to move: SIZE_MB of 4 MiB files, written through the mount.
mkdir -p "$MNT/data"
python3 - "$MNT/data" "$SIZE_MB" <<'PY'
import os, sys
root, mb = sys.argv[1], int(sys.argv[2])
for i in range(mb // 4):
    with open(os.path.join(root, "f%05d" % i), "wb") as f:
        f.write(os.urandom(4 << 20))
PY

# Throughput through the mount, single store.
dd_write() { secs dd if=/dev/zero of="$MNT/$1" bs=1M count=512 conv=fsync; }
t_single=$(dd_write single.bin)

# The checkpoint writer, logging "start_time latency" per checkpoint.
python3 - "$MNT" "$D/lat.txt" <<'PY' &
import os, sys, time
mnt, out = sys.argv[1], sys.argv[2]
buf = os.urandom(1 << 20)
with open(out, "w") as log:
    i = 0
    while True:
        t = time.time()
        p = os.path.join(mnt, "ckpt.tmp")
        with open(p, "wb") as f:
            f.write(buf); f.flush(); os.fsync(f.fileno())
        os.rename(p, os.path.join(mnt, "ckpt-%d" % (i % 20)))
        log.write(f"{t} {time.time() - t}\n"); log.flush()
        i += 1
PY
W=$!
sleep 3
mark() { python3 -c 'import time; print(time.time())'; }
t0=$(mark)
"$JFS" cutover start "$META" --to "file://$D/b" >/dev/null 2>&1
t_dual=$(dd_write dual.bin)
drop
"$JFS" cutover backfill "$META" --threads 16 --json > "$D/bf.json" 2>/dev/null
"$JFS" cutover verify "$META" >/dev/null 2>&1
sleep 2
s0=$(mark); "$JFS" cutover switch "$META" >/dev/null 2>&1; s1=$(mark)
sleep 2
f0=$(mark); "$JFS" cutover finish "$META" >/dev/null 2>&1; f1=$(mark)
sleep 2
kill "$W"; W=
# jfs-sync copying the same block files (what the backfill moved), directory to directory.
drop
"$SYNC" "$D/a/bench" "$D/c" --threads 16 --json > "$D/sync.json" 2>/dev/null

stats() { # stats FROM TO: p50 p99 max (ms) and count of checkpoints overlapping [FROM-0.5, TO+0.5]
  python3 - "$D/lat.txt" "$1" "$2" <<'PY'
import sys
path, a, b = sys.argv[1], float(sys.argv[2]) - 0.5, float(sys.argv[3]) + 0.5
v = sorted(l for t, l in (map(float, x.split()) for x in open(path)) if t + l >= a and t <= b)
q = lambda p: v[min(len(v) - 1, int(len(v) * p))] * 1000
print(f"{q(0.5):.0f} ms | {q(0.99):.0f} ms | {v[-1]*1000:.0f} ms | {len(v)}")
PY
}
first=$(head -1 "$D/lat.txt" | cut -d' ' -f1)
echo "| checkpoint of 1 MiB (write, fsync, rename) through the mount | p50 | p99 | max | checkpoints |"
echo "|---|---|---|---|---|"
echo "| before the cutover | $(stats "$first" "$t0") |"
echo "| around \`switch\` ($(python3 -c "print(f'{$s1-$s0:.1f}')") s) | $(stats "$s0" "$s1") |"
echo "| around \`finish\` ($(python3 -c "print(f'{$f1-$f0:.1f}')") s) | $(stats "$f0" "$f1") |"
echo
echo "| 512 MiB through the mount (dd, fsync) | single store | dual write | dual/single |"
echo "|---|---|---|---|"
echo "| MiB/s | $(mbps 512 "$t_single") | $(mbps 512 "$t_dual") | $(ratio "$t_single" "$t_dual") |"
echo
rate() { python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(f\"{s['bytes']/2**20:.0f} MiB in {s['seconds']:.1f} s | {s['bytes']/2**20/s['seconds']:.0f}\")" "$1"; }
r_bf=$(python3 -c "import json; s=json.load(open('$D/bf.json')); print(s['bytes']/s['seconds'])")
r_sy=$(python3 -c "import json; s=json.load(open('$D/sync.json')); print(s['bytes']/s['seconds'])")
echo "| copy blocks, directory to directory | copied | MiB/s | vs jfs-sync |"
echo "|---|---|---|---|"
echo "| jfs cutover backfill (metadata walk + jfs-sync engine; what B lacked) | $(rate "$D/bf.json") | $(ratio "$r_bf" "$r_sy") |"
echo "| jfs-sync of the old store's block directory | $(rate "$D/sync.json") | 1.00 |"
