#!/usr/bin/env bash
# Every decoder harness ("bad bytes at every door": fs-core, sync, mirror-agent, mount,
# volume, objstore, cli-common), on demand: CASES cases each (default
# 1,000,000; the suite runs 10,000), built in release (PROFILE=debug for the suite's build),
# one harness per process so that each has its own peak RSS. Prints cases/s and peak RSS per
# harness; exits 1 if any harness fails or goes over MAX_RSS_MB (default 1024) of memory.
#
#   bash integration/fuzz.sh                    # 1,000,000 cases each, release
#   CASES=100000 SEED=7 bash integration/fuzz.sh
#   ONLY=journal bash integration/fuzz.sh       # harnesses whose name holds "journal"
#
# A failure prints the shrunk input and the seed; rerun one harness with the same
# JFS_FUZZ_SEED and JFS_FUZZ_CASES to reproduce it.
set -euo pipefail

CASES=${CASES:-1000000}
PROFILE=${PROFILE:-release}
MAX_RSS_MB=${MAX_RSS_MB:-1024}
ONLY=${ONLY:-}
SEED=${SEED:-}
case "$CASES" in '' | *[!0-9]*) echo "fuzz.sh: CASES=$CASES is not a whole number of cases" >&2; exit 2 ;; esac
case "$MAX_RSS_MB" in '' | *[!0-9]*) echo "fuzz.sh: MAX_RSS_MB=$MAX_RSS_MB is not a whole number of MiB" >&2; exit 2 ;; esac
case "$PROFILE" in release) flag=--release ;; debug) flag= ;; *) echo "fuzz.sh: PROFILE=$PROFILE: use release or debug" >&2; exit 2 ;; esac
case "$SEED" in *[!0-9]*) echo "fuzz.sh: SEED=$SEED is not a number" >&2; exit 2 ;; esac
[ -x /usr/bin/time ] || { echo "fuzz.sh: /usr/bin/time is needed for the peak RSS (apt-get install time)" >&2; exit 2; }

cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/jfs-target}

# The test binary of each crate that holds harnesses (their tests named fuzz_*).
binaries=()
for pkg in fs-core sync mirror-agent mount volume objstore cli-common; do
    echo "== building the $pkg harnesses ($PROFILE)" >&2
    bin=$(cargo test $flag -p "$pkg" --lib --no-run --message-format=json 2>/dev/null |
        jq -r 'select(.reason == "compiler-artifact" and .profile.test == true and .target.kind == ["lib"]) | .executable' |
        grep -v '^null$' | tail -n 1)
    [ -n "$bin" ] || { echo "fuzz.sh: building the $pkg tests failed: run cargo test $flag -p $pkg --lib --no-run" >&2; exit 2; }
    binaries+=("$bin")
done

log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
failed=0
printf '%-36s %10s %12s %10s  %s\n' harness cases cases/s 'peak RSS' result
for bin in "${binaries[@]}"; do
    # Harnesses sit in a `fuzz_tests` module, at the crate's top or beside their decoder
    # (`state::fuzz_tests`, `cache::fuzz_tests`).
    for t in $("$bin" --list 2>/dev/null | sed -n 's/^\(\([a-z_0-9]*::\)*fuzz_tests::fuzz_[a-z_0-9]*\): test$/\1/p'); do
        [ -z "$ONLY" ] || [[ "$t" == *"$ONLY"* ]] || continue
        name=${t##*fuzz_tests::}
        out="$log/$name"
        if JFS_FUZZ_CASES=$CASES JFS_FUZZ_REPORT=1 ${SEED:+JFS_FUZZ_SEED=$SEED} \
            /usr/bin/time -v -o "$out.time" "$bin" --exact "$t" --test-threads=1 --nocapture >"$out" 2>&1; then
            result=ok
        else
            result=FAILED
            failed=1
        fi
        rate=$(sed -n 's/.*fuzz [a-z_]*: [0-9]* cases in .*, \([0-9]*\) cases\/s$/\1/p' "$out" | tail -n 1)
        rss=$(sed -n 's/.*Maximum resident set size (kbytes): \([0-9]*\)/\1/p' "$out.time")
        rss_mb=$(( ${rss:-0} / 1024 ))
        if [ "$result" = ok ] && [ "$rss_mb" -gt "$MAX_RSS_MB" ]; then
            result="FAILED (over MAX_RSS_MB=$MAX_RSS_MB)"
            failed=1
        fi
        printf '%-36s %10s %12s %7s MiB  %s\n' "$name" "$CASES" "${rate:-?}" "$rss_mb" "$result"
        if [ "$result" != ok ]; then
            grep -E 'fuzz harness|minimal failing|^    |^\)|panicked' "$out" | head -n 40 >&2 || true
        fi
    done
done
exit $failed
