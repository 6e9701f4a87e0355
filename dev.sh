#!/usr/bin/env bash
# Developer entry point; works on a fresh clone of a fresh machine (Python >= 3.10 with pip).
#
#   ./dev.sh dashboard [PORT]   set up .venv, write the demo tree, serve the dashboard (5006)
#   ./dev.sh test [PYTEST ARGS] set up .venv (+ Debian chromium), run ruff check, the import
#                               contracts, mypy and pytest (without ARGS: on
#                               CKPTVIEW_TEST_WORKERS xdist workers, default 2 with 2+ cores;
#                               1: one test after another)
#   ./dev.sh setup [EXTRAS]     only create/refresh .venv with ckptview[EXTRAS] (default: test)
#   ./dev.sh help               this text
#
# .venv is reinstalled only when pyproject.toml or .ci/constraints.txt change (the constraints
# pin known-good versions so pip resolves in seconds). $PYTHON picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")"
VENV=.venv
PY="$VENV/bin/python"

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

setup() {  # setup EXTRAS: a venv holding ckptview[EXTRAS] in editable mode
  local extras="$1" stamp want
  if [ ! -x "$PY" ]; then
    log "creating $VENV with ${PYTHON:-python3} ($(${PYTHON:-python3} --version 2>&1))"
    "${PYTHON:-python3}" -m venv "$VENV"
  fi
  want="$(cat pyproject.toml .ci/constraints.txt | sha256sum | cut -c1-16)"
  for stamp in "$VENV/.ckptview-$extras" "$VENV/.ckptview-test"; do
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return 0; fi
  done
  log "installing ckptview[$extras] into $VENV (a few minutes the first time)"
  "$PY" -m pip install -q --disable-pip-version-check --upgrade pip
  "$PY" -m pip install -q --disable-pip-version-check -c .ci/constraints.txt -e ".[$extras]"
  echo "$want" > "$VENV/.ckptview-$extras"
}

need_chromium() {  # Debian's Chromium for the browser tests (never a Playwright download)
  [ -x /usr/bin/chromium ] && return 0
  local sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  log "installing Debian chromium (apt-get)"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
  [ -x /usr/bin/chromium ] || { echo "chromium did not install at /usr/bin/chromium" >&2; exit 1; }
}

cmd_test() {
  setup test
  need_chromium
  log "ruff check"
  "$VENV/bin/ruff" check .
  log "import contracts (lint-imports)"
  "$VENV/bin/lint-imports" --no-cache
  log "mypy (formats, engine, changes)"
  "$VENV/bin/mypy" ckptview/formats ckptview/engine ckptview/changes
  local workers="${CKPTVIEW_TEST_WORKERS:-$("$PY" -c 'import os; print(min(2, os.cpu_count() or 1))')}"
  if [ "$#" -eq 0 ] && [ "$workers" -gt 1 ]; then
    set -- -n "$workers"  # tests/conftest.py: ChromiumApart
  fi
  log "pytest $*"
  local rc=0
  "$VENV/bin/pytest" "$@" || rc=$?
  if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests (exit 5): nothing matched the arguments given" >&2
  fi
  return "$rc"
}

cmd_dashboard() {
  local port="${1:-${PORT:-5006}}" demo="${CKPTVIEW_DEMO_DIR:-demo_tree}"
  setup ui
  if [ ! -d "$demo" ]; then
    log "writing the demo tree into $demo"
    "$VENV/bin/ckptview" demo "$demo"
  fi
  log "dashboard: http://localhost:$port/ckptview_app  (Ctrl-C stops)"
  exec "$VENV/bin/ckptview" serve "$demo" --port "$port"
}

usage() {  # the comment block at the top of this file, whole, however long it grows
  awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
}

case "${1:-}" in
  test) shift; cmd_test "$@" ;;
  dashboard) shift; cmd_dashboard "$@" ;;
  setup) setup "${2:-test}" ;;
  help|-h|--help) usage ;;
  *) usage >&2; exit 2 ;;
esac
