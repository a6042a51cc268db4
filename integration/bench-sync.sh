#!/usr/bin/env bash
# jfs-sync against rclone, rsync (and cp) on the same data in the same run; prints Markdown
# for BENCHMARKS.md. Run on demand, as root (section e drops the page cache):
#   bash integration/bench-sync.sh [SMALL=20000] [NOCHANGE=100000] [RSS=1000000]
set -euo pipefail
cd "$(dirname "$0")/.."
SMALL=${1:-20000}; NOCHANGE=${2:-100000}; RSSN=${3:-1000000}
ONLY=${ONLY:-a,b,c,d,e}   # which sections to run, e.g. ONLY=a,c
want() { [[ ",$ONLY," == *",$1,"* ]]; }
bash integration/install-deps.sh test
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/jfs-target}
cargo build --release --locked -p sync-cli >/dev/null
SYNC=$CARGO_TARGET_DIR/release/jfs-sync
W=$(mktemp -d /tmp/jfs-bench-sync.XXXXXX); chmod 755 "$W"; SVC=$W/svc
cleanup() { bash integration/services.sh down "$SVC" || true; rm -rf "$W"; }
trap cleanup EXIT
bash integration/services.sh up "$SVC" >/dev/null
# shellcheck disable=SC1091
source "$SVC/env"
export XDG_CACHE_HOME=$W/cache
# rclone's S3 backend, configured from the environment (it fails with AWS_CA_BUNDLE set).
export RCLONE_CONFIG_CEPH_TYPE=s3 RCLONE_CONFIG_CEPH_PROVIDER=Ceph RCLONE_CONFIG_CEPH_ENDPOINT=$JFS_TEST_S3_ENDPOINT \
  RCLONE_CONFIG_CEPH_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID RCLONE_CONFIG_CEPH_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY
rcl() { env -u AWS_CA_BUNDLE rclone "$@"; }
secs() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null 2>"$W/last.err" || { cat "$W/last.err" >&2; return 1; }; t1=$(date +%s.%N); echo "$t1 - $t0" | bc; }
ratio() { python3 -c "import sys; print(f'{float(sys.argv[1])/float(sys.argv[2]):.2f}')" "$1" "$2"; }
mk_small() { python3 integration/trees.py small "$1" "$2"; } # mk_small DIR N

if want a; then
echo "### (a) $SMALL files of 16 KiB, directory -> S3 (Ceph RGW on loopback)"
echo
mk_small "$W/small" "$SMALL"
bucket_put() { curl -s -o /dev/null --aws-sigv4 "aws:amz:us-east-1:s3" --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' -X PUT "$JFS_TEST_S3_ENDPOINT/$1"; }
bucket_put bench-a; bucket_put bench-r; bucket_put bench-r8
j=$(secs "$SYNC" "$W/small" "s3://bench-a/x?endpoint=$JFS_TEST_S3_ENDPOINT" --threads 64)
r8=$(secs rcl copy "$W/small" ceph:bench-r8/x --transfers 8 --checkers 16)
r=$(secs rcl copy "$W/small" ceph:bench-r/x --transfers 32 --checkers 32)
echo "| tool | seconds | objects/s |"
echo "|---|---|---|"
echo "| jfs-sync --threads 64 | $j | $(python3 -c "print(round($SMALL/$j))") |"
echo "| rclone copy --transfers 8 --checkers 16 | $r8 | $(python3 -c "print(round($SMALL/$r8))") |"
echo "| rclone copy --transfers 32 --checkers 32 | $r | $(python3 -c "print(round($SMALL/$r))") |"
echo
echo "jfs-sync / rclone objects/s: **$(ratio "$r8" "$j")x** against rclone at 8 transfers, **$(ratio "$r" "$j")x** against rclone at 32 (target >= 2x)"
echo
j2=$(secs "$SYNC" "$W/small" "s3://bench-a/x?endpoint=$JFS_TEST_S3_ENDPOINT" --threads 64)
r2=$(secs rcl copy "$W/small" ceph:bench-r/x --transfers 32 --checkers 32)
echo "No-change re-run of the same $SMALL objects to S3: jfs-sync ${j2}s, rclone ${r2}s: jfs-sync takes **$(ratio "$j2" "$r2")x** rclone's time."
echo
rm -rf "$W/small"
fi

if want b; then
echo "### (b) 4 files of 1 GiB, directory -> directory"
echo
mkdir -p "$W/big"
for i in 1 2 3 4; do head -c $((1 << 30)) /dev/urandom > "$W/big/f$i"; done
sync
t_cp=$(secs sh -c "cp -r '$W/big' '$W/big-cp' && sync"); rm -rf "$W/big-cp"
t_j=$(secs sh -c "'$SYNC' '$W/big' '$W/big-j' && sync"); rm -rf "$W/big-j"
t_r=$(secs sh -c "rclone copy '$W/big' '$W/big-r' --transfers 4 && sync"); rm -rf "$W/big-r"
echo "| tool | seconds (incl. sync) | MiB/s |"
echo "|---|---|---|"
for row in "cp -r:$t_cp" "jfs-sync:$t_j" "rclone copy --transfers 4:$t_r"; do
  n=${row%%:*}; s=${row#*:}; echo "| $n | $s | $(python3 -c "print(round(4096/$s))") |"
done
echo
echo "jfs-sync throughput vs cp -r: **$(ratio "$t_cp" "$t_j")x** (target >= 0.9x); vs rclone: **$(ratio "$t_r" "$t_j")x** (target >= 1x)"
echo
rm -rf "$W/big"
fi

if want c; then
echo "### (c) no-change re-run over $NOCHANGE objects, directory -> directory"
echo
mk_small "$W/nc" "$NOCHANGE"
"$SYNC" "$W/nc" "$W/nc-j" >/dev/null 2>&1
rclone copy "$W/nc" "$W/nc-r" --transfers 16 >/dev/null 2>&1
j=$(secs "$SYNC" "$W/nc" "$W/nc-j")
r=$(secs rclone copy "$W/nc" "$W/nc-r" --transfers 16 --checkers 16)
echo "| tool | seconds |"
echo "|---|---|"
echo "| jfs-sync | $j |"
echo "| rclone copy --checkers 16 | $r |"
echo
echo "jfs-sync takes **$(ratio "$j" "$r")x** rclone's time (target <= 0.5x)"
echo
rm -rf "$W/nc" "$W/nc-j" "$W/nc-r"
fi

if want d; then
echo "### (d) peak RSS syncing $RSSN small objects, directory -> directory"
echo
python3 - "$W/m" "$RSSN" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, f"d{i // 10000:04d}")
    if i % 10000 == 0: os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i:07d}"), "wb") as f: f.write(b"x" * (i % 100))
PY
/usr/bin/time -f "%M %e" -o "$W/rss-j" "$SYNC" "$W/m" "$W/m-j" >/dev/null 2>&1
read -r kb_j s_j < "$W/rss-j"
rm -rf "$W/m-j"
/usr/bin/time -f "%M %e" -o "$W/rss-r" rclone copy "$W/m" "$W/m-r" --transfers 16 >/dev/null 2>&1
read -r kb_r s_r < "$W/rss-r"
echo "| tool | peak RSS | seconds |"
echo "|---|---|---|"
echo "| jfs-sync | $((kb_j / 1024)) MiB | $s_j |"
echo "| rclone copy | $((kb_r / 1024)) MiB | $s_r |"
echo
echo "jfs-sync peak RSS $((kb_j / 1024)) MiB (target <= 200 MiB)"
fi

if want e; then
echo "### (e) small files directory -> directory, durable (cold page cache, median of 5)"
echo
echo "jfs-sync makes every copy durable (files and directory entries, one syncfs per checkpoint)"
echo "before recording it; rclone and rsync do not sync at all. The page cache is dropped"
echo "before each run, so every tool reads its source from disk, and the previous run's output"
echo "is deleted 8 s before (ext4 is slow to create files right after deleting many)."
echo
echo "| files | jfs-sync | rclone copy | rclone copy --transfers 16 | rsync -a | cp -a | jfs-sync vs rclone | vs rsync |"
echo "|---|---|---|---|---|---|---|---|"
# Before each run: the previous output is gone and settled (ext4's inode allocator skips
# inodes freed in the last seconds, which makes creating thousands of files right after
# deleting thousands slow for whichever tool runs then), and the page cache is dropped.
cold() { sync; sleep 8; sync; echo 3 > /proc/sys/vm/drop_caches; secs "$@"; }
median() { printf '%s\n' "$@" | sort -g | sed -n 3p; }
for n in 5000 20000; do
  rm -rf "$W/e"; mk_small "$W/e/src" "$n"; sync
  J=(); R=(); R16=(); S=(); C=()
  for _ in 1 2 3 4 5; do
    rm -rf "$W/e/j" "$W/cache"; J+=("$(cold "$SYNC" "$W/e/src" "$W/e/j")")
    rm -rf "$W/e/r"; R+=("$(cold rclone copy "$W/e/src" "$W/e/r")")
    rm -rf "$W/e/r16"; R16+=("$(cold rclone copy "$W/e/src" "$W/e/r16" --transfers 16 --checkers 16)")
    rm -rf "$W/e/s"; S+=("$(cold rsync -a "$W/e/src/" "$W/e/s/")")
    rm -rf "$W/e/c"; C+=("$(cold cp -a "$W/e/src" "$W/e/c")")
  done
  j=$(median "${J[@]}"); r=$(median "${R[@]}"); r16=$(median "${R16[@]}"); s=$(median "${S[@]}"); c=$(median "${C[@]}")
  echo "| $n x 16 KiB | ${j}s | ${r}s | ${r16}s | ${s}s | ${c}s | **$(ratio "$r" "$j")x** | **$(ratio "$s" "$j")x** |"
  echo "jfs-sync runs: ${J[*]}; rclone: ${R[*]}; rsync: ${S[*]}" >&2
done
echo
echo "Ratios are speed (the other tool's time / jfs-sync's); targets: >= 1.5x rclone, >= 1x rsync."
rm -rf "$W/e"
fi
