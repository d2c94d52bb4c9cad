#!/usr/bin/env bash
# Set up the environments and run the tests: the whole suite under transformers 5.x and 4.57.x, then
# the vLLM engine's tests in .venv-vllm (vLLM's CPU build; every other test module skips or is not run
# there). Extra arguments go to pytest (e.g. bash scripts/test.sh -k inputs).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tf4 || exit 1
bash scripts/setup_vllm.sh || exit 1
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_LOGGING_LEVEL=WARNING  # nothing may reach a model hub
status=0
for venv in .venv .venv-tf4; do
  echo "== tests with $($venv/bin/python -c 'import transformers; print("transformers", transformers.__version__)')" >&2
  # two workers: most tests wait on subprocesses, and CI machines have 2 cores
  PATH="$PWD/$venv/bin:$PATH" "$venv/bin/python" -m pytest -q -p no:cacheprovider -n 2 "$@" || status=$?
done
echo "== vLLM engine tests with $(.venv-vllm/bin/python -c 'import vllm; print("vLLM", vllm.__version__)' 2>/dev/null)" >&2
# one worker: each module starts its own vLLM, which takes a core for itself
PATH="$PWD/.venv-vllm/bin:$PATH" .venv-vllm/bin/python -m pytest -q -p no:cacheprovider tests/engines/vllm_backend "$@" \
  || status=$?
exit $status
