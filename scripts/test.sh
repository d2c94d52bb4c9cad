#!/usr/bin/env bash
# Set up the environments and run the tests: the whole suite under transformers 5.x and 4.57.x, and the vLLM
# engine's tests in .venv-vllm (vLLM's CPU build; every other test module skips or is not run there). Extra
# arguments go to pytest (e.g. bash scripts/test.sh -k inputs).
#
# Two lanes run side by side, because neither fills a 2-core machine alone for long: pip's installs use one
# core each, and the vLLM tests (one engine at a time) keep about one core busy. Lane one sets up .venv and
# .venv-tf4 and runs the two transformers suites here; lane two sets up .venv-vllm and runs the vLLM tests,
# its output kept in a log that is printed after the transformers suites. The exit code is 0 only if every
# suite passed.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/need_disk.sh
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_LOGGING_LEVEL=WARNING  # nothing may reach a model hub

# Each setup script checks the disk for its own environment; side by side they need the sum at once.
if [ ! -f .venv/.vlmfast-stamp ] && [ ! -f .venv-vllm/.vlmfast-stamp ]; then
  need_disk 14 ".venv, .venv-tf4 and .venv-vllm together"
fi

lane_dir=$(mktemp -d "${TMPDIR:-/tmp}/vlmfast-test.XXXXXX")
vllm_log="$lane_dir/vllm-tests.log"
if ! command -v flock >/dev/null; then  # the setups' editable installs could not take turns (scripts/tree_lock.sh)
  bash scripts/setup.sh --tf4 || exit 1  # so .venv and .venv-tf4 first, then .venv-vllm beside the suites
fi
vllm_lane() {
  trap '' INT  # Ctrl-C reaches every process of the terminal's group: this lane is stopped by stop_vllm_lane below, whole
  bash scripts/setup_vllm.sh || return 1
  echo "== vLLM engine tests with $(.venv-vllm/bin/python -c 'import vllm; print("vLLM", vllm.__version__)' 2>/dev/null)"
  # one worker: each module starts its own vLLM; its own TMPDIR keeps its temporary files apart from the other lane's
  mkdir -p "$lane_dir/tmp"
  TMPDIR="$lane_dir/tmp" PATH="$PWD/.venv-vllm/bin:$PATH" \
    .venv-vllm/bin/python -m pytest -q -p no:cacheprovider --durations 8 tests/engines/vllm_backend "$@"
}

# The vLLM lane is stopped, with every process under it, whenever this script stops early. The transformers
# suites run in the foreground: Ctrl-C reaches them as it does any command (tests check how vlmfast takes a
# Ctrl-C, and a background job would start with it ignored); a TERM to this script alone is acted on once the
# suite running then has ended.
kill_tree() {  # a process and everything under it, the children first
  local child
  for child in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$child"; done
  kill -TERM "$1" 2>/dev/null
}
stop_vllm_lane() {  # on the way out early: its processes stopped, its temporary files gone, its log kept
  trap - EXIT INT TERM
  kill -0 "$vllm_pid" 2>/dev/null && kill_tree "$vllm_pid" && echo "[test] stopped the vLLM lane; its log so far: $vllm_log" >&2
  rm -rf "$lane_dir/tmp"
}
vllm_lane "$@" > "$vllm_log" 2>&1 &
vllm_pid=$!
trap 'stop_vllm_lane; exit 130' INT
trap 'stop_vllm_lane; exit 143' TERM
trap stop_vllm_lane EXIT
echo "[test] .venv-vllm and the vLLM engine tests run beside the transformers suites; their output follows those (live: $vllm_log)" >&2

bash scripts/setup.sh --tf4 || exit 1
status=0
for venv in .venv .venv-tf4; do
  echo "== tests with $($venv/bin/python -c 'import transformers; print("transformers", transformers.__version__)')" >&2
  # two workers: most tests wait on subprocesses, and CI machines have 2 cores; a worker that runs out of tests
  # takes half of what the other has still queued (worksteal), where the default left a core idle at the end
  PATH="$PWD/$venv/bin:$PATH" "$venv/bin/python" -m pytest -q -p no:cacheprovider -n 2 --dist worksteal --durations 12 "$@" || status=$?
done

kill -0 "$vllm_pid" 2>/dev/null && echo "[test] waiting for the vLLM tests to finish (live: $vllm_log)" >&2
wait "$vllm_pid"
vllm_status=$?
trap - EXIT INT TERM
cat "$vllm_log" >&2
[ "$vllm_status" -eq 0 ] || status=$vllm_status
rm -rf "$lane_dir"
exit $status
