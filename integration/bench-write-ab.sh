#!/usr/bin/env bash
# Two (or more) builds' `jfs mount` writes, timed in turn so that the VM's noisy disk lands
# on every side alike: a fresh volume and mount per try, page cache dropped, a 1 GiB `cp`.
# Run as root:  bash integration/bench-write-ab.sh ROUNDS JFS_A JFS_B ...
# (build each with `cargo build --release -p jfs` in a worktree of its commit).
set -euo pipefail
R=$1; shift
D=$(mktemp -d /tmp/jfs-bench-ab.XXXXXX)
cleanup() { for m in "$D"/*/mnt; do [ -d "$m" ] && "$1" umount "$m" >/dev/null 2>&1; done; rm -rf "$D"; }
trap 'cleanup "$1"' EXIT
head -c $((1024<<20)) /dev/urandom > $D/src.bin
for r in $(seq $R); do
  for J in "$@"; do
    V=$D/v$r-$(basename $(dirname $J)); mkdir -p $V/mnt
    $J format rocksdb://$V/meta b --storage file://$V/blocks >/dev/null 2>&1
    $J mount rocksdb://$V/meta $V/mnt -d --cache-dir $V/cache --free-space-ratio 0.01 --log $V/log >/dev/null
    sync; echo 3 > /proc/sys/vm/drop_caches
    t0=$(date +%s.%N); cp $D/src.bin $V/mnt/a.bin; t1=$(date +%s.%N)
    echo "$J round $r: $(python3 -c "print(f'{1024/($t1-$t0):.0f}')") MiB/s"
    $J umount $V/mnt >/dev/null; rm -rf $V
  done
done
