#!/usr/bin/env bash
# Gate a trained checkpoint in CI with vlmfast bench. Usage:
#   scripts/ci_check.sh CKPT BASE
# Exit codes (vlmfast's): 0 ok · 3 ckpt slower than base ÷ FAIL_IF_SLOWER · 4 ckpt saved with the KV cache off
#                         · 2 bad input/checkpoint · 1 unexpected failure.
# Environment knobs: FAIL_IF_SLOWER (default 1.5), SYNTHETIC (images, default 4), SYNTHETIC_SIZE (px, default 448),
# MAX_NEW_TOKENS (default 32), REPEATS (timed runs, default 3), REPORT_DIR (default ./vlmfast-ci-report: report.md, report.json, plot.png), VLMFAST (the command to run).
set -uo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 CKPT BASE" >&2
  exit 2
fi
ckpt=$1
base=$2
report=${REPORT_DIR:-vlmfast-ci-report}
${VLMFAST:-vlmfast} bench --ckpt "$ckpt" --compare-base "$base" \
  --synthetic "${SYNTHETIC:-4}" --synthetic-size "${SYNTHETIC_SIZE:-448}" --repeats "${REPEATS:-3}" --max-new-tokens "${MAX_NEW_TOKENS:-32}" --ignore-eos --no-as-saved \
  --fail-if-slower "${FAIL_IF_SLOWER:-1.5}" --fail-on-cache-off --report "$report" >/dev/null
code=$?
case $code in
  0) echo "vlmfast gate: OK ($ckpt vs $base; figures in $report/report.md)" ;;
  3) echo "vlmfast gate: FAIL — $ckpt is more than ${FAIL_IF_SLOWER:-1.5}x slower than $base (see $report/report.md)" ;;
  4) echo "vlmfast gate: FAIL — $ckpt was saved with use_cache false; set it true in config.json (top level and text_config) and generation_config.json" ;;
  *) echo "vlmfast gate: ERROR — vlmfast bench exited $code" ;;
esac
exit $code
