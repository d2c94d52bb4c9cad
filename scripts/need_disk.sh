# Sourced by the setup scripts: refuse to start an install that cannot fit, instead of failing halfway
# through a multi-GB pip install with "No space left on device" and a broken environment.
#   need_disk GB WHAT     exit 1, saying where and how much, unless GB GiB are free for WHAT both where the
#                         environment goes (this clone) and where pip unpacks and caches (TMPDIR, its cache)
need_disk() {
  local want=$1 what=$2 dir free_kb
  for dir in "$PWD" "${TMPDIR:-/tmp}" "$(pip_cache_dir)"; do
    [ -d "$dir" ] || continue
    free_kb=$(df -Pk "$dir" | awk 'NR==2 {print $4}')
    if [ -n "$free_kb" ] && [ "$free_kb" -lt $((want * 1024 * 1024)) ]; then
      echo "[setup] $what needs ~$want GiB free; $(df -Ph "$dir" | awk 'NR==2 {print $4}') is free on $(df -P "$dir" | awk 'NR==2 {print $6}') (holding $dir)." >&2
      echo "[setup] Free space there (old clones and their .venv*, 'pip cache purge'), or put a CPU build of torch into .venv first (README, 'Set up'), then rerun." >&2
      exit 1
    fi
  done
}

pip_cache_dir() {
  # pip's download cache; a folder that does not exist yet is skipped by need_disk
  if [ -n "${PIP_CACHE_DIR:-}" ]; then echo "$PIP_CACHE_DIR"; else echo "${XDG_CACHE_HOME:-${HOME:-/nonexistent}/.cache}/pip"; fi
}
