# Shared by the bench scripts: build once, find the binary, make temp dirs.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FERRITE="$ROOT/target/release/ferrite"
OUT="$ROOT/bench/results"
mkdir -p "$OUT"
(cd "$ROOT" && cargo build --release -q -p ferrite)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# json_get FILE EXPR: evaluate a Python expression on the parsed JSON document `d`.
json_get() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }
