#!/bin/sh
# A short libFuzzer run, as a test (tests/fuzz/meson.build):
#   run-fuzz.sh TARGET SEEDS SECONDS CRASHDIR
#   run-fuzz.sh --skip REASON
# Runs every seed, then fuzzes for SECONDS (FULL_SECONDS in the full tier,
# MLOOP_TEST_TIER=full: scripts/run-tests --full).  New inputs go to a temporary
# directory, never to SEEDS (the tree).  Fails on any crash, leak, timeout
# or sanitizer report, keeping the reproducer in CRASHDIR, and when the
# target ran too few inputs to have tested anything.
set -u
if [ "${1:-}" = --skip ]; then
    echo "SKIP: $2"
    exit 77
fi
target=$1 seeds=$2 seconds=$3 crashes=$4
FULL_SECONDS=120
[ "${MLOOP_TEST_TIER:-}" != full ] || seconds=$FULL_SECONDS
work=$(mktemp -d "${TMPDIR:-/tmp}/mloop-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 1' INT TERM
mkdir "$work/corpus"

# Sanitizers stop at the first report (the asan test setup may have set
# its own options, which come last and win).
export ASAN_OPTIONS="detect_leaks=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}"

# libFuzzer's default error exit code is 77, which meson takes for a skip.
"$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 \
    -artifact_prefix="$work/" "$work/corpus" "$seeds" 2>"$work/log"
rc=$?
cat "$work/log" >&2

found=$(find "$work" -maxdepth 1 -type f \
        \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
           -o -name 'oom-*' -o -name 'slow-unit-*' \) | sort)
if [ -n "$found" ]; then
    mkdir -p "$crashes"
    for f in $found; do
        cp "$f" "$crashes/"
        echo "reproducer: $crashes/$(basename "$f")" >&2
        echo "replay:     $target $crashes/$(basename "$f")" >&2
    done
    exit 1
fi
if [ "$rc" -ne 0 ]; then
    echo "FAIL: $target exited with $rc" >&2
    exit 1
fi
# A target that returns at once would pass without testing anything.
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")
if [ -z "$runs" ] || [ "$runs" -lt 1000 ]; then
    echo "FAIL: only ${runs:-no} inputs ran in $seconds s" >&2
    exit 1
fi
echo "ok: $runs inputs in $seconds s, $(ls "$work/corpus" | wc -l) new corpus entries, no finding"
