#!/usr/bin/env bash
# Set up both environments and run the test suite under transformers 5.x and 4.57.x.
# Extra arguments go to pytest (e.g. bash scripts/test.sh -k inputs).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --tf4 || exit 1
status=0
for venv in .venv .venv-tf4; do
  echo "== tests with $($venv/bin/python -c 'import transformers; print("transformers", transformers.__version__)')" >&2
  # two workers: most tests wait on subprocesses, and CI machines have 2 cores
  PATH="$PWD/$venv/bin:$PATH" "$venv/bin/python" -m pytest -q -p no:cacheprovider -n 2 "$@" || status=$?
done
exit $status
