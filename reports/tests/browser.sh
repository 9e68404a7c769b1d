#!/usr/bin/env bash
# Opens a Strata HTML report in Debian's headless Chromium and checks it as a reader would:
# the page loads with no console errors, and a screenshot of it is not blank.
#
#   reports/tests/browser.sh REPORT.html [SCREENSHOT.png]
#
# Needs /usr/bin/chromium (apt-get install -y chromium) and python3. Exits non-zero with a
# message on any failure. CI: `apt-get install -y --no-install-recommends chromium` first.
set -euo pipefail

html=$(realpath "${1:?usage: browser.sh REPORT.html [SCREENSHOT.png]}")
shot=${2:-$(mktemp --suffix=.png)}
chromium=${CHROMIUM:-/usr/bin/chromium}
[ -x "$chromium" ] || { echo "browser.sh: $chromium not found; apt-get install -y chromium" >&2; exit 2; }

profile=$(mktemp -d)
log=$(mktemp)
trap 'rm -rf "$profile" "$log"' EXIT
flags=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run
  --disable-background-networking --disable-component-update --disable-sync
  --user-data-dir="$profile" --enable-logging=stderr --v=0 --hide-scrollbars)

# 1. Load the page, dump the DOM after scripts (there are none) and layout; keep the log.
timeout 120 "$chromium" "${flags[@]}" --dump-dom "file://$html" >"$profile/dom.html" 2>"$log" || {
  echo "browser.sh: chromium failed to load $html" >&2; tail -20 "$log" >&2; exit 1; }
grep -q '<svg' "$profile/dom.html" || { echo "browser.sh: no <svg> in the rendered DOM" >&2; exit 1; }
grep -q '</html>' "$profile/dom.html" || { echo "browser.sh: the DOM dump is truncated" >&2; exit 1; }
# Chromium logs every console message as an `INFO:CONSOLE` line whatever its level, so, the
# report having no script at all, any console line is an error.
if grep -E ':CONSOLE|Uncaught|Failed to load resource|net::ERR_' "$log"; then
  echo "browser.sh: console messages while loading $html" >&2; exit 1
fi
# A self-contained page loads nothing: no src= attribute and no remote URL.
if grep -oE '(src|href)="(https?:)?//[^"]*"|src="[^"#][^"]*"' "$profile/dom.html" | head -5 | grep .; then
  echo "browser.sh: the page loads external resources" >&2; exit 1
fi

# 2. Screenshot.
timeout 120 "$chromium" "${flags[@]}" --window-size=1280,2000 --screenshot="$shot" "file://$html" \
  >/dev/null 2>>"$log" || { echo "browser.sh: screenshot failed" >&2; tail -20 "$log" >&2; exit 1; }

# 3. Non-blank: many distinct colours, and a fair share of non-white pixels.
python3 - "$shot" <<'PY'
import struct, sys, zlib
path = sys.argv[1]
data = open(path, 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n', 'not a PNG'
pos, idat, w = 8, b'', 0
while pos < len(data):
    n, kind = struct.unpack('>I4s', data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b'IHDR':
        w, h, depth, ctype = struct.unpack('>IIBB', body[:10])
        assert depth == 8 and ctype in (2, 6), f'unexpected PNG format {depth} {ctype}'
        bpp = 3 if ctype == 2 else 4
    elif kind == b'IDAT':
        idat += body
    pos += 12 + n
raw = zlib.decompress(idat)
stride = w * bpp
prev = bytearray(stride)
colours, ink = set(), 0
for y in range(h):
    f = raw[y * (stride + 1)]
    line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    prev = line
    if y % 4 == 0:
        for x in range(0, w, 4):
            px = tuple(line[x * bpp:x * bpp + 3])
            colours.add(px)
            ink += px != (255, 255, 255)
samples = (h // 4 + 1) * (w // 4 + 1)
share = ink / samples
print(f'browser.sh: screenshot {w}x{h}, {len(colours)} colours, {share:.1%} non-white')
assert w == 1280 and h == 2000, f'screenshot is {w}x{h}'
assert len(colours) >= 50 and share >= 0.05, 'the screenshot looks blank'
PY
echo "browser.sh: ok ($shot)"
