#!/usr/bin/env bash
# Mount benchmarks (BENCHMARKS.md, "Mount"): `jfs mount` against the same work on local disk,
# in one run, as ratios. A RocksDB volume whose blocks are in a local directory (file://), so
# the figures measure the mount, not a network. Needs root (drop_caches, bdi read-ahead).
#   bash integration/bench-mount.sh            # 1 GiB file, 10,000 small files
#   SIZE_MB=256 SMALL=2000 ROUNDS=5 bash integration/bench-mount.sh
# Each large-file figure is the median of ROUNDS (default 3) runs, local and mount taken in
# turn, so that a slow moment of the VM's disk does not land on one side only.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/jfs-target}
cargo build --release --locked -p jfs -p bench >/dev/null
JFS=$CARGO_TARGET_DIR/release/jfs
CEILING=$CARGO_TARGET_DIR/release/jfs-fuse-ceiling
SIZE_MB=${SIZE_MB:-1024}
SMALL=${SMALL:-10000}
ROUNDS=${ROUNDS:-3}
D=$(mktemp -d /tmp/jfs-bench-mount.XXXXXX)
MNT=$D/mnt
mkdir -p "$MNT" "$D/local"
META=rocksdb://$D/meta
cleanup() { "$JFS" umount "$MNT" >/dev/null 2>&1 || "$JFS" umount --force "$MNT" >/dev/null 2>&1 || true; rm -rf "$D"; }
trap cleanup EXIT
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
secs() { python3 -c 'import sys,time; t=time.time(); import subprocess; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(f"{time.time()-t:.3f}")' "$@"; }
mbps() { python3 -c "print(f'{$SIZE_MB/$1:.0f}')"; }
ratio() { python3 -c "print(f'{$1/$2:.2f}')"; }
median() { python3 -c 'import sys,statistics; print(f"{statistics.median(map(float,sys.argv[1:])):.3f}")' "$@"; }
# in_turn A B: run shell commands A and B ROUNDS times each, in turn, page cache dropped before
# each; sets TA and TB to their median seconds.
in_turn() {
  local a=() b=()
  for _ in $(seq "$ROUNDS"); do
    drop; a+=("$(secs sh -c "$1")")
    drop; b+=("$(secs sh -c "$2")")
  done
  TA=$(median "${a[@]}"); TB=$(median "${b[@]}")
}
mount_it() { "$JFS" mount "$META" "$MNT" -d --cache-dir "$D/cache" --free-space-ratio 0.01 --log "$D/mount.log" "$@" >/dev/null; }
# CPU seconds (user + system) a process has used so far.
cpu_of() { python3 -c 'import os,sys; f=open(f"/proc/{sys.argv[1]}/stat").read().rsplit(")",1)[1].split(); print((int(f[11])+int(f[12]))/os.sysconf("SC_CLK_TCK"))' "$1"; }
pid_of_mount() { "$JFS" status "$META" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["sessions"][0]["pid"])'; }

"$JFS" format "$META" bench --storage "file://$D/blocks" >/dev/null
head -c $((SIZE_MB << 20)) /dev/urandom > "$D/local/src.bin"
echo "mount benchmark: $SIZE_MB MiB file, $SMALL files of 16 KiB; $(nproc) cores; $(date -u +%F)"
echo

# --- sequential write
mount_it
in_turn "cp $D/local/src.bin $D/local/copy.bin && sync $D/local/copy.bin; rm $D/local/copy.bin" "cp $D/local/src.bin $MNT/a.bin"
t_cp_local=$TA t_cp_mnt=$TB
PYW='import sys
src, dst = sys.argv[1], sys.argv[2]
with open(src, "rb") as s, open(dst, "wb") as d:
    while True:
        b = s.read(65536)
        if not b: break
        d.write(b)
    d.flush()
    import os; os.fsync(d.fileno())'
in_turn "python3 -c '$PYW' $D/local/src.bin $D/local/py.bin; rm $D/local/py.bin" "python3 -c '$PYW' $D/local/src.bin $MNT/py.bin"
t_py_local=$TA t_py_mnt=$TB
cmp "$D/local/src.bin" "$MNT/a.bin"
echo "| write ${SIZE_MB} MiB, median of $ROUNDS | local | mount | mount/local |"
echo "|---|---|---|---|"
echo "| cp (local: cp + sync) | $(mbps "$t_cp_local") MiB/s | $(mbps "$t_cp_mnt") MiB/s | $(ratio "$t_cp_local" "$t_cp_mnt") |"
echo "| Python, 64 KiB writes + fsync | $(mbps "$t_py_local") MiB/s | $(mbps "$t_py_mnt") MiB/s | $(ratio "$t_py_local" "$t_py_mnt") |"
"$JFS" umount "$MNT" >/dev/null

# --- sequential read, cold (no local cache: blocks from the file store) and warm (cache)
mount_it --cache-size 0
PID=$(pid_of_mount)
PYR='import sys
with open(sys.argv[1], "rb") as f: f.read()'
CPU0=$(cpu_of "$PID")
in_turn "dd if=$D/local/src.bin of=/dev/null bs=1M status=none" "dd if=$MNT/a.bin of=/dev/null bs=1M status=none"
t_dd_local=$TA t_dd_cold=$TB
CPU_GIB=$(python3 -c "print(f'{($(cpu_of "$PID") - $CPU0) / $ROUNDS / ($SIZE_MB / 1024):.2f}')")
HWM=$(awk '/VmHWM/ {print $2}' /proc/"$PID"/status)
in_turn "python3 -c '$PYR' $D/local/src.bin" "python3 -c '$PYR' $MNT/a.bin"
t_py_local=$TA t_py_cold=$TB
"$JFS" umount "$MNT" >/dev/null
mount_it
"$JFS" warmup "$MNT/a.bin" >/dev/null
in_turn "dd if=$D/local/src.bin of=/dev/null bs=1M status=none" "dd if=$MNT/a.bin of=/dev/null bs=1M status=none"
t_dd_local_w=$TA t_dd_warm=$TB
in_turn "python3 -c '$PYR' $D/local/src.bin" "python3 -c '$PYR' $MNT/a.bin"
t_py_local_w=$TA t_py_warm=$TB
# A second open of an unchanged file keeps the page cache (FOPEN_KEEP_CACHE).
t_py_again=$(secs python3 -c "$PYR" "$MNT/a.bin")
echo
echo "| read ${SIZE_MB} MiB, median of $ROUNDS | local (cold) | mount cold | ratio | mount warm (local cache) | ratio |"
echo "|---|---|---|---|---|---|"
echo "| dd bs=1M | $(mbps "$t_dd_local") MiB/s | $(mbps "$t_dd_cold") MiB/s | $(ratio "$t_dd_local" "$t_dd_cold") | $(mbps "$t_dd_warm") MiB/s (local $(mbps "$t_dd_local_w")) | $(ratio "$t_dd_local_w" "$t_dd_warm") |"
echo "| Python open().read() | $(mbps "$t_py_local") MiB/s | $(mbps "$t_py_cold") MiB/s | $(ratio "$t_py_local" "$t_py_cold") | $(mbps "$t_py_warm") MiB/s (local $(mbps "$t_py_local_w")) | $(ratio "$t_py_local_w" "$t_py_warm") |"
echo
echo "second open of the unchanged file (page cache kept): $(mbps "$t_py_again") MiB/s"
echo "CPU of the mount process per GiB of the cold dd read: $CPU_GIB s"
echo "peak RSS of the mount process during the cold read: $((HWM / 1024)) MiB (buffer 300 MiB + 64 MiB = 364 MiB allowed)"

# --- the FUSE path's own bound: a fuser file system that answers every read from memory,
# with the mount's settings, against the same local file
mkdir -p "$D/null"
echo "a FUSE file system serving reads from memory (jfs-fuse-ceiling): $("$CEILING" --mountpoint "$D/null" --local "$D/local/src.bin" --rounds "$ROUNDS")"

# --- jfs get vs cp (jfs get syncs what it wrote before it renames it into place; plain cp
# leaves it in the page cache, so both are shown)
in_turn "cp $D/local/src.bin $D/local/cp-out.bin; rm $D/local/cp-out.bin" "$JFS get $META /a.bin $D/local/get-out.bin; rm $D/local/get-out.bin"
t_cp=$TA t_get=$TB
in_turn "cp $D/local/src.bin $D/local/cp-out.bin && sync $D/local/cp-out.bin; rm $D/local/cp-out.bin" "$JFS get $META /a.bin $D/local/get-out.bin"
t_cps=$TA t_get2=$TB
cmp "$D/local/src.bin" "$D/local/get-out.bin"
echo
echo "jfs get of the ${SIZE_MB} MiB file (median of $ROUNDS): $(mbps "$t_get") MiB/s; cp: $(mbps "$t_cp") MiB/s, get/cp $(ratio "$t_cp" "$t_get"); cp + sync: $(mbps "$t_cps") MiB/s, get/(cp + sync) $(ratio "$t_cps" "$t_get2")"

# --- many small files
PYS=integration/smallfiles.py
mkdir -p "$D/local/small" "$MNT/small"
w_local=$(python3 "$PYS" "$D/local/small" "$SMALL" write); sync
w_mnt=$(python3 "$PYS" "$MNT/small" "$SMALL" write)
drop
r_local=$(python3 "$PYS" "$D/local/small" "$SMALL" read)
r_mnt=$(python3 "$PYS" "$MNT/small" "$SMALL" read)
per() { python3 -c "print(f'{$1*1000/$SMALL:.3f}')"; }
echo
echo "| $SMALL files of 16 KiB | local | mount | mount/local | mount per file |"
echo "|---|---|---|---|---|"
echo "| create+write+close | ${w_local} s | ${w_mnt} s | $(ratio "$w_local" "$w_mnt") | $(per "$w_mnt") ms |"
echo "| open+read+close (cold) | ${r_local} s | ${r_mnt} s | $(ratio "$r_local" "$r_mnt") | $(per "$r_mnt") ms |"
