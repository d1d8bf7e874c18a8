#!/usr/bin/env bash
# Submits a nightly replay: N array tasks, then the merge once all of them succeeded.
#   deploy/slurm/submit.sh [N [SBATCH_OPTION...]]   (from the checkout's root; N defaults to 4)
# Options after N go to both sbatch calls and override the scripts' #SBATCH lines: a partition, an
# account, or smaller resources (`deploy/slurm/submit.sh 4 --cpus-per-task=1 --mem=2G`).
set -euo pipefail
n="${1:-4}"
shift || true
deploy="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export REPLAY_DEPLOY="$deploy"
# One run id for the array and the merge, fixed now (a run crossing midnight keeps it).
export REPLAY_RUN_ID="${REPLAY_RUN_ID:-$(basename "${REPLAY_JOB:-jobs/agent-replay.toml}" .toml)-$(date -u +%Y%m%d)}"
array=$(sbatch --parsable --export=ALL --array=0-$((n - 1)) "$@" "$deploy/slurm/nightly-replay.sbatch")
array="${array%%;*}"
merge=$(sbatch --parsable --export=ALL --dependency=afterok:"$array" "$@" "$deploy/slurm/merge.sbatch")
merge="${merge%%;*}"
echo "submitted array $array ($n shards) and its merge $merge; run id $REPLAY_RUN_ID"
