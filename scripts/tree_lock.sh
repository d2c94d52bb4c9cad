# Sourced by the setup scripts. An editable install of vlmfast writes src/vlmfast.egg-info in this tree, and
# scripts/test.sh runs the setup scripts side by side: two installs at once could read each other's
# half-written metadata. They take turns on a lock held on pyproject.toml (flock; where flock is missing,
# scripts/test.sh runs them one after another instead).
#   one_at_a_time CMD ARGS...   runs CMD (a function too) while holding the lock
one_at_a_time() {
  ( if command -v flock >/dev/null; then flock 9; fi; "$@" ) 9<pyproject.toml
}
