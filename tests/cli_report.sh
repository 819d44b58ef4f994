#!/usr/bin/env bash
# headscope report: the page of a file with every kind of group renders in headless Chromium with one
# heatmap cell per head carrying the file's value, references nothing outside itself, and yields a
# screenshot; several files give difference heatmaps; bad input gets one line, an exit code, no file.
# Needs /usr/bin/python3 with h5py (fixture and DOM check) and Debian's chromium
# (scripts/install_deps.sh). HEADSCOPE_SKIP_CHROMIUM=1 skips the browser checks on a machine without
# it (they are counted as failures otherwise, so CI cannot pass without rendering the page).
# Usage: cli_report.sh path/to/headscope
set -u
HS="$1"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$(dirname "$0")/lib_cli.sh"
PY=/usr/bin/python3

"$HS" report --help | grep -q "Example:" && pass=$((pass+1)) || { fail=$((fail+1)); echo "FAIL report --help has no example"; }

ok "fixture" -- "$PY" "$ROOT/tests/make_report_fixture.py" "$TMP"
A="$TMP/all.h5"; B="$TMP/all_b.h5"; R="$TMP/report.html"

ok "report of every kind of group" -- "$HS" report "$A" --out "$R"
check "stderr names the page" -- grep -q "wrote $R" "$TMP/err"
check "page values equal the file's (HTML source)" -- "$PY" "$ROOT/tests/check_report_dom.py" "$R" "$A"
# Self-contained: no URL scheme, no protocol-relative reference, no url() other than #fragment,
# no script; the CSP meta forbids every remote load in case a future section slips one in.
check "no remote reference" -- bash -c "! grep -qiE 'https?:|//|<script|url\\([^#]' '$R'"
check "CSP default-src none" -- grep -q "default-src 'none'" "$R"
for sec in "Provenance" "Score: induction" "Score: locos" "Score: dla" "Score: copy-suppression" "MAPS" \
           "Ablation: single" "Ablation: cumulative" "Ablation: prune" "Retrieval trials" "Retrieval: query ablation"; do
  check "section $sec" -- grep -q "<h2>$sec</h2>" "$R"
done
size=$(stat -c %s "$R")
check "small page ($size bytes)" -- test "$size" -lt 400000

ok "two files side by side" -- "$HS" report "$A" "$B" --out "$TMP/two.html"
check "difference heatmaps equal B - A" -- "$PY" "$ROOT/tests/check_report_dom.py" "$TMP/two.html" "$A" "$B"

# Bad input: one clear line, documented exit code (README "Exit codes"), nothing written.
printf 'not hdf5\n' >"$TMP/text.h5"
expect "not HDF5" 6 "text.h5" -- "$HS" report "$TMP/text.h5" --out "$TMP/bad.html"
no_file "$TMP/bad.html"
"$PY" -c "import h5py,sys; f=h5py.File(sys.argv[1],'w'); f.create_group('meta').attrs['tool']='headscope'; f['logits']=[1.0]" "$TMP/meta.h5"
expect "no known group" 5 "meta.h5: no group the report knows" -- "$HS" report "$TMP/meta.h5" --out "$TMP/bad.html"
no_file "$TMP/bad.html"
expect "missing file" 6 "nope.h5: no such file" -- "$HS" report "$TMP/nope.h5" --out "$TMP/bad.html"
no_file "$TMP/bad.html"
mkdir "$TMP/ro"; chmod a-w "$TMP/ro"
if [ "$(id -u)" != 0 ]; then
  expect "unwritable output" 6 "ro/r.html: cannot write" -- "$HS" report "$A" --out "$TMP/ro/r.html"
  no_file "$TMP/ro/r.html"
fi
expect "output folder missing" 6 "nodir/r.html: cannot write" -- "$HS" report "$A" --out "$TMP/nodir/r.html"
expect "exists without --force" 6 "exists" -- "$HS" report "$A" --out "$R"
ok "--force replaces" -- "$HS" report "$A" --out "$R" --force
expect "output = input" 2 "would replace an input" -- "$HS" report "$A" --out "$A" --force

# scripts/plot_scores.py draws the same plots for papers (PNG and PDF).
ok "plot_scores.py png" -- "$PY" "$ROOT/scripts/plot_scores.py" "$A" --out-dir "$TMP/plots" --format png
ok "plot_scores.py pdf" -- "$PY" "$ROOT/scripts/plot_scores.py" "$A" --out-dir "$TMP/plots" --format pdf
for f in induction.png dla.png ablation-single-single.png ablation-cumulative-cumulative.png ablation-prune-prune.png \
         needle-grid.png needle-grid.pdf ablation-cumulative-cumulative.pdf; do
  check "plot $f" -- test -s "$TMP/plots/$f"
done

# A real run: detect on the CI toy model, then its report.
M=$(ci_toy induction)
ok "detect on the toy model" -- "$HS" detect "$M" --probe induction,previous-token --out "$TMP/toy.h5"
# (no --seq-len: the default 50 would need 101 positions; detect fits it to the toy model's 64 and says so)
check "detect adapts --seq-len to the context" -- grep -q "default 50 makes 101 tokens, more than the model's context of 64; using 31" "$TMP/err"
check "seq_len 31 recorded" -- "$PY" -c "import h5py,sys; sys.exit(0 if h5py.File(sys.argv[1])['scores/induction'].attrs['seq_len'] == 31 else 1)" "$TMP/toy.h5"
expect "explicit --seq-len is not adapted" 5 "context of 64" -- "$HS" detect "$M" --seq-len 50 --out "$TMP/toy2.h5"
no_file "$TMP/toy2.h5"
ok "report of the toy run" -- "$HS" report "$TMP/toy.h5" --out "$TMP/toy.html"
check "toy page values" -- "$PY" "$ROOT/tests/check_report_dom.py" "$TMP/toy.html" "$TMP/toy.h5"

# Headless Chromium: the DOM it builds has the cells with the file's values; a screenshot is written.
CHROME=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROME" ] && [ "${HEADSCOPE_SKIP_CHROMIUM:-0}" = 1 ]; then
  echo "skipped the Chromium checks (HEADSCOPE_SKIP_CHROMIUM=1, no chromium)"
elif [ -z "$CHROME" ]; then
  fail=$((fail+1)); echo "FAIL chromium not found (scripts/install_deps.sh installs it; HEADSCOPE_SKIP_CHROMIUM=1 skips)"
else
  chrome() { timeout 120 "$CHROME" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run \
             --user-data-dir="$TMP/chrome" "$@" 2>>"$TMP/chrome.log"; }
  chrome --dump-dom "file://$TMP/two.html" >"$TMP/dom.html"
  check "Chromium DOM: one cell per head, values equal the files'" -- "$PY" "$ROOT/tests/check_report_dom.py" "$TMP/dom.html" "$A" "$B"
  chrome --dump-dom "file://$TMP/toy.html" >"$TMP/toydom.html"
  check "Chromium DOM of the toy run" -- "$PY" "$ROOT/tests/check_report_dom.py" "$TMP/toydom.html" "$TMP/toy.h5"
  chrome --screenshot="$TMP/shot.png" --window-size=1280,1600 "file://$R" >/dev/null
  check "screenshot written (PNG)" -- bash -c "head -c 8 '$TMP/shot.png' | od -An -c | grep -q 'P   N   G'"
fi

echo "cli-report: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
