# Shared by the bench scripts: build once, find the binary, make temp dirs.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FERRITE="$ROOT/target/release/ferrite"
OUT="$ROOT/bench/results"
mkdir -p "$OUT"
(cd "$ROOT" && cargo build --release -q -p ferrite)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# fail MESSAGE: print it and stop the bench.
fail() { echo "bench: $*" >&2; exit 1; }
# need COMMAND PACKAGE: install PACKAGE (apt) if COMMAND is missing; fail if it is still missing.
need() {
  command -v "$1" >/dev/null && return
  echo "bench: $1 missing, installing package $2" >&2
  apt-get install -y -qq "$2" >/dev/null 2>&1 || true
  command -v "$1" >/dev/null || fail "$1 (package $2) is missing and could not be installed"
}
# cpu_ticks PID: utime+stime (fields 14, 15 of /proc/PID/stat) of all its threads, in clock ticks.
cpu_ticks() {
  local s f
  s=$(<"/proc/$1/stat"); s=${s##*) }
  read -r -a f <<<"$s"
  echo $((f[11] + f[12]))
}
# json_get FILE EXPR: evaluate a Python expression on the parsed JSON document `d`.
json_get() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }
