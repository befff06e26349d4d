#!/usr/bin/env bash
# A CI gate on training performance: `diag check` with limits and a baseline run.
#
# Usage:
#   examples/ci_gate.sh [RUN_DIR [BASELINE_DIR]]
#
# Without RUN_DIR it first records a short reference run (`diag run dp`, 2 ranks, 6 steps) in
# runs/ci-gate. With BASELINE_DIR (or $DIAG_BASELINE) the run's step time and throughput must be
# within $TOLERANCE (relative) of the baseline's. Limits are upper bounds on shares of the step:
#   MAX_COMM_SHARE          communication share of the step     (default 0.6)
#   MAX_EXPOSED_COMM_SHARE  communication nothing overlaps      (default 0.5)
#   MAX_BUBBLE              measured pipeline bubble (pp runs)  (default 0.5)
#   TOLERANCE               allowed slowdown against baseline   (default 0.15)
# Limits can also live in a TOML file, `diag check RUN --config gate.toml`, as a [check] table
# (max_comm_share = 0.3, ...) beside [rules.CODE] thresholds.
#
# Exit codes (those of `diag check`): 0 every limit holds; 1 a limit is violated or a metric
# regressed (one line each on stdout); 2 unusable input. In CI, keep a baseline run as an
# artifact of the main branch and pass it as BASELINE_DIR on pull requests, e.g.:
#   - run: examples/ci_gate.sh "" baseline-run/
set -euo pipefail

RUN="${1:-}"
BASELINE="${2:-${DIAG_BASELINE:-}}"

if [[ -z "$RUN" ]]; then
    RUN="runs/ci-gate"
    rm -rf "$RUN"
    diag run dp --nproc 2 --steps 6 --out "$RUN" >/dev/null
fi

args=(
    --max-comm-share "${MAX_COMM_SHARE:-0.6}"
    --max-exposed-comm-share "${MAX_EXPOSED_COMM_SHARE:-0.5}"
    --max-bubble "${MAX_BUBBLE:-0.5}"
)
if [[ -n "$BASELINE" ]]; then
    args+=(--baseline "$BASELINE" --tolerance "${TOLERANCE:-0.15}")
fi

diag analyze "$RUN" | head -n 5 || true   # the headline and the first findings, for the CI log
exec diag check "$RUN" "${args[@]}"
