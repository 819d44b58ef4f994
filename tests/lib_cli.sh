# Shared by the command-line suites tests/cli_*.sh (sourced, not run). Sets TD (test data, or ""),
# TMP (removed at exit), the pass/fail counters, and the checks below.
# EXPECT_MAX_LINES: most stderr lines an expected failure may print (default 2: one clear line).
TD="${HEADSCOPE_TESTDATA:-}"
for c in shared/testdata ../shared/testdata; do [ -z "$TD" ] && [ -d "$c" ] && TD="$c"; done
TMP=$(mktemp -d); trap 'chmod -R u+w "$TMP" 2>/dev/null; rm -rf "$TMP"' EXIT
pass=0; fail=0

# expect NAME CODE PATTERN -- command...: exit code CODE, a short stderr matching PATTERN, no trace.
expect() {
  local name="$1" code="$2" pat="$3"; shift 4
  "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
  local lines; lines=$(wc -l <"$TMP/err")
  if [ "$rc" -eq "$code" ] && grep -qE -- "$pat" "$TMP/err" && [ "$lines" -le "${EXPECT_MAX_LINES:-2}" ] \
     && ! grep -q "frame #" "$TMP/err"; then
    pass=$((pass+1))
  else
    fail=$((fail+1)); echo "FAIL $name: rc=$rc (want $code), stderr:"; head -5 "$TMP/err"
  fi
}
ok() {  # ok NAME -- command...: exit 0
  local name="$1"; shift 2
  if "$@" >"$TMP/out" 2>"$TMP/err"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL $name:"; head -5 "$TMP/err"; fi
}
check() {  # check NAME -- test-command...
  local name="$1"; shift 2
  if "$@"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL $name"; fi
}
no_file() { if [ -e "$1" ] || ls "$1".tmp-* >/dev/null 2>&1; then fail=$((fail+1)); echo "FAIL: $1 left behind"; else pass=$((pass+1)); fi; }

# ci_toy TASK: the folder of the CI toy model for TASK (induction|recall), trained once per build
# tree by tests/ci_toy.sh and reused (needs HS, the headscope binary).
ci_toy() { bash "$(dirname "${BASH_SOURCE[0]}")/ci_toy.sh" "$1" "$HS"; }
