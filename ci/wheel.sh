#!/usr/bin/env bash
# The prebuilt path, for real: builds drill's wheel from the checkout with maturin (`bin`
# bindings, pyproject.toml), installs it into a fresh virtual environment with no index (only
# the wheel), and drills with the binary pip put on PATH:
#   - the quickstart passes (exit 0);
#   - this wheel is built WITHOUT the power-cut filesystem (--no-default-features), as a build
#     for a platform without FUSE would be, so a power-cut drill must end with exit 3 and one
#     line saying what is missing and which build has it.
# Prints the wheel's size, the install time and the time from nothing to the quickstart's
# verdict. The debug profile: the suite has built drill's dependencies in it already. The
# release workflow (ci/github/release.yml) builds the release wheels with default features.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v maturin >/dev/null 2>&1; then
  echo "ci/wheel.sh: installing maturin (PyPI)"
  python3 -m pip install -q 'maturin>=1.9,<2'
  hash -r
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
now() { date +%s.%N; }
secs() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$2"; }

t0=$(now)
maturin build --profile dev --locked --no-default-features --compatibility linux \
  --out "$tmp/wheels" --quiet
t1=$(now)
wheel="$(ls "$tmp"/wheels/*.whl)"
echo "ci/wheel.sh: built $(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB in $(secs "$t0" "$t1") s"

python3 -m venv "$tmp/venv"
t2=$(now)
"$tmp/venv/bin/pip" install --quiet --no-index "$wheel"
t3=$(now)
drill="$tmp/venv/bin/drill"
echo "ci/wheel.sh: pip install: $(secs "$t2" "$t3") s; $("$drill" --version)"
case "$("$drill" --version)" in
  *powercut*) echo "ci/wheel.sh: FAIL: the wheel was to be built without powercut" >&2; exit 1 ;;
esac

"$drill" run scenarios/quickstart.yaml --out "$tmp/reports" >"$tmp/quickstart.log" 2>&1 || {
  echo "ci/wheel.sh: FAIL: the quickstart with the wheel's drill exited $?" >&2
  cat "$tmp/quickstart.log" >&2
  exit 1
}
t4=$(now)
grep -q '^quickstart: PASS' "$tmp/quickstart.log" || {
  echo "ci/wheel.sh: FAIL: no PASS verdict line" >&2; cat "$tmp/quickstart.log" >&2; exit 1
}
echo "ci/wheel.sh: quickstart PASS with the wheel's drill: $(secs "$t3" "$t4") s; from nothing to the verdict (install + drill): $(secs "$t2" "$t4") s"

set +e
"$drill" run scenarios/mqtt-power-cut.yaml --out "$tmp/reports" >"$tmp/power.out" 2>"$tmp/power.err"
code=$?
set -e
lines=$(grep -c . "$tmp/power.err" || true)
if [ "$code" -ne 3 ] || [ "$lines" -ne 1 ] || ! grep -q 'built without the power-cut filesystem' "$tmp/power.err"; then
  echo "ci/wheel.sh: FAIL: a power cut with a build without powercut: exit $code, $lines stderr lines (want exit 3, one line)" >&2
  cat "$tmp/power.out" "$tmp/power.err" >&2
  exit 1
fi
echo "ci/wheel.sh: a power cut with this build: exit 3, one line: $(cat "$tmp/power.err")"
