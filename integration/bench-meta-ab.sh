#!/usr/bin/env bash
# Two builds' metadata steps on one Redis, in turn (BENCHMARKS.md, "Round trips on Redis"):
# per file, create + 16 KiB write, open + read (cold), stat, rm -rf; 3 rounds of N files.
# Needs root (drop_caches) and the test services' environment:
#   bash integration/services.sh up /tmp/svc && source /tmp/svc/env
#   bash integration/bench-meta-ab.sh BASE/jfs NEW/jfs [N=3000]
set -euo pipefail
cd "$(dirname "$0")/.."
A=${1:?usage: bench-meta-ab.sh BASE_JFS NEW_JFS [N]}; B=${2:?usage: bench-meta-ab.sh BASE_JFS NEW_JFS [N]}
N=${3:-3000}
R=${JFS_TEST_REDIS:?source the services env first}; R=${R%/*}
W=$(mktemp -d /tmp/jfs-bench-meta-ab.XXXXXX)
trap '"$A" umount "$W/a" >/dev/null 2>&1 || true; "$B" umount "$W/b" >/dev/null 2>&1 || true; rm -rf "$W"' EXIT
i=3
for s in a b; do
  J=$A; [ $s = b ] && J=$B
  mkdir -p "$W/$s"
  redis-cli -u "$R/$i" -a "$JFS_META_PASSWORD" --no-auth-warning flushdb >/dev/null
  "$J" format "$R/$i" v --storage "file://$W/blocks-$s" >/dev/null 2>&1
  "$J" mount "$R/$i" "$W/$s" -d --cache-dir "$W/cache-$s" --log "$W/$s.log" >/dev/null 2>&1
  i=$((i+1))
done
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
for r in 1 2 3; do
  for s in a b; do
    mkdir "$W/$s/s$r"
    w=$(python3 integration/smallfiles.py "$W/$s/s$r" "$N" write); drop
    rd=$(python3 integration/smallfiles.py "$W/$s/s$r" "$N" read); drop
    st=$(python3 integration/smallfiles.py "$W/$s/s$r" "$N" stat); drop
    t0=$(date +%s.%N); rm -rf "$W/$s/s$r"; t1=$(date +%s.%N)
    python3 -c "n=$N; print(f'$s round $r: create {$w*1000/n:.3f} ms, open+read {$rd*1000/n:.3f} ms, stat {$st*1000/n:.3f} ms, rm {($t1-$t0)*1000/n:.3f} ms')"
  done
done
