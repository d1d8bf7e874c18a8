#!/usr/bin/env bash
# Container entrypoint for a sharded nightly replay (Kubernetes Indexed Job, Slurm array, CI matrix).
#
#   entrypoint.sh run     run this process's shard: bmoe reads its index from JOB_COMPLETION_INDEX
#                         (Kubernetes) or SLURM_ARRAY_TASK_ID (Slurm), or REPLAY_SHARD=K/N
#   entrypoint.sh merge   merge every shard's CSV into all.csv, then compare with REPLAY_BASELINE
#
# Settings (environment; REPLAY_*, not BMOE_*: BMOE_* are bmoe's own configuration layer):
#   REPLAY_JOB       job file                                  (required)
#   REPLAY_PROFILE   device profile; default: the job's own
#   REPLAY_SHARDS    number of shards N                        (required for `run` without REPLAY_SHARD)
#   REPLAY_SHARD     K/N, overrides the scheduler's index (CI matrices set this)
#   REPLAY_RUN_ID    run id shared by every shard; default: <job file stem>-<UTC date>
#   REPLAY_OUT       output folder on shared storage           (default: runs)
#   REPLAY_BASELINE  CSV to compare the merged run with (merge only; optional)
#   REPLAY_BIN       the bmoe binary                           (default: bmoe)
#   REPLAY_REQUEUE   Slurm only: a task stopped by a signal requeues itself, at most this many
#                    times (default 0; deploy/slurm/nightly-replay.sbatch sets 3)
#
# Exit status: bmoe's (0 ok, 1 items refused / runs differ, 2 usage, configuration or I/O error,
# 130 stopped by SIGTERM: the row in flight was finished, and a restart resumes the shard).
set -euo pipefail

mode="${1:-run}"
bin="${REPLAY_BIN:-bmoe}"
job="${REPLAY_JOB:?REPLAY_JOB: the job file to replay}"
out="${REPLAY_OUT:-runs}"
stem="$(basename "$job" .toml)"
run_id="${REPLAY_RUN_ID:-$stem-$(date -u +%Y%m%d)}"
dir="$out/$run_id"
mkdir -p "$dir"

case "$mode" in
run)
    shard="${REPLAY_SHARD:-${REPLAY_SHARDS:?REPLAY_SHARDS: the number of shards, or REPLAY_SHARD=K/N}}"
    # --allow-empty: a shard may draw no item; it then writes a header-only CSV and exits 0.
    args=(run "$job" --shard "$shard" --run-id "$run_id" --csv "$dir/shard-{shard}.csv" --resume --allow-empty --format json)
    if [[ -n "${REPLAY_PROFILE:-}" ]]; then
        args+=(--profile "$REPLAY_PROFILE")
    fi
    summary="$dir/.summary.$$"
    # bmoe runs as a child so this shell can mark the shard done afterwards; SIGTERM (Kubernetes
    # eviction, Slurm time limit) is passed on, and bmoe finishes the row in flight before it stops.
    # --resume with a fixed run id: a restarted pod or requeued task continues where it stopped.
    "$bin" "${args[@]}" >"$summary" &
    child=$!
    trap 'kill -TERM "$child" 2>/dev/null || true' TERM INT
    set +e
    wait "$child"
    rc=$?
    # A trapped signal interrupts `wait`; wait again for bmoe's own exit status.
    if kill -0 "$child" 2>/dev/null; then
        wait "$child"
        rc=$?
    fi
    set -e
    cat "$summary"
    if [[ $rc -eq 0 ]]; then
        # The JSON summary names the shard bmoe ran ("shard": "K/N"); kept as shard-K.json, it is
        # the marker the merge step waits for.
        k="$(sed -n 's/^ *"shard": "\([0-9]*\)\/[0-9]*".*/\1/p' "$summary")"
        mv "$summary" "$dir/shard-${k:?no shard in the summary}.json"
    else
        rm -f "$summary"
    fi
    restarts="${SLURM_RESTART_COUNT:-0}"
    if [[ $rc -eq 130 && -n "${SLURM_JOB_ID:-}" && "${REPLAY_REQUEUE:-0}" -gt "$restarts" ]]; then
        # Slurm: a task that ends FAILED fails the merge's afterok dependency for good (a later
        # `scontrol requeue` does not undo that); requeued while it still runs, it goes back to
        # pending, the merge keeps waiting, and the rerun resumes the shard.
        echo "entrypoint: stopped by a signal; requeueing Slurm job $SLURM_JOB_ID (restart $((restarts + 1)) of at most $REPLAY_REQUEUE)" >&2
        scontrol requeue "$SLURM_JOB_ID"
    fi
    exit "$rc"
    ;;
merge)
    shopt -s nullglob
    parts=("$dir"/shard-*.csv)
    if [[ ${#parts[@]} -eq 0 ]]; then
        echo "entrypoint: no shard CSVs in $dir" >&2
        exit 2
    fi
    "$bin" merge "${parts[@]}" -o "$dir/all.csv" --force
    if [[ -n "${REPLAY_BASELINE:-}" ]]; then
        # 1 = the runs differ (a regression to look at), 2 = trouble reading them.
        "$bin" compare "$REPLAY_BASELINE" "$dir/all.csv"
    fi
    ;;
*)
    echo "entrypoint: unknown mode $mode (run or merge)" >&2
    exit 2
    ;;
esac
