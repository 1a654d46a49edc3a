"""Headless Chromium for the report tests, and a PNG reader (stdlib: zlib + struct).

:func:`screenshot` and :func:`measure` run the installed ``chromium`` (Debian's package);
:func:`measure` opens a copy of the page with a script appended that writes what the
browser laid out (each chart's rendered box, each marker label's box from
``getBoundingClientRect``) into a ``<pre>``, read back with ``--dump-dom``. The report
itself carries no script. :func:`png_rows` decodes the screenshot: non-interlaced 8-bit
RGB/RGBA, the five filter types of the PNG spec (W3C PNG 2nd ed., 9.2).
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

import pytest

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)

_MEASURE = """<script>
(function () {
  function box(e) { var r = e.getBoundingClientRect();
    return [r.left, r.top, r.right, r.bottom]; }
  var charts = Array.prototype.map.call(document.querySelectorAll('svg.chart'), function (svg) {
    return {box: box(svg),
            markers: Array.prototype.map.call(svg.querySelectorAll('text.marker'), box),
            yticks: Array.prototype.map.call(svg.querySelectorAll('text.ytick'), box)};
  });
  var pre = document.createElement('pre');
  pre.id = 'measured';
  pre.textContent = JSON.stringify({inner: window.innerWidth, body: document.body.clientWidth,
                                    charts: charts});
  document.body.appendChild(pre);
})();
</script>"""


def browser() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("chromium not installed (apt-get install chromium)")
    return found


def _run(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [browser(), *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def screenshot(page: Path, png: Path, width: int, height: int, profile: Path) -> bytes:
    """A ``width`` x ``height`` screenshot of ``page``: the PNG's bytes."""
    res = _run(
        [f"--screenshot={png}", f"--window-size={width},{height}", page.resolve().as_uri()], profile
    )
    assert png.exists(), f"chromium wrote no screenshot: {res.stderr[-2000:]}"
    return png.read_bytes()


def measure(page: Path, width: int, profile: Path) -> dict[str, Any]:
    """What Chromium laid out for ``page`` at ``width`` CSS px: ``inner`` (viewport width),
    ``body`` (its content width) and per chart ``box``, ``markers``, ``yticks`` (each a
    [left, top, right, bottom] in CSS px)."""
    probe = page.with_name(page.stem + ".measure.html")
    text = page.read_text()
    probe.write_text(text.replace("</body>", _MEASURE + "</body>"))
    res = _run(["--dump-dom", f"--window-size={width},900", probe.resolve().as_uri()], profile)
    start = res.stdout.find('<pre id="measured">')
    assert start >= 0, f"no measurement in the dumped DOM: {res.stderr[-2000:]}"
    body = res.stdout[start + len('<pre id="measured">') : res.stdout.index("</pre>", start)]
    return json.loads(body.replace("&quot;", '"').replace("&amp;", "&"))  # type: ignore[no-any-return]


def png_rows(data: bytes) -> tuple[int, int, int, list[bytearray]]:
    """(width, height, bytes per pixel, the unfiltered rows) of a PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height, ctype = 8, b"", 0, 0, 2
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body[:13])
            assert depth == 8 and ctype in (2, 6) and interlace == 0, (depth, ctype, interlace)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    prev = bytearray(stride)
    rows = []
    for row in range(height):
        start = row * (stride + 1)
        filt, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if filt == 1:
                line[i] = (line[i] + a) & 255
            elif filt == 2:
                line[i] = (line[i] + b) & 255
            elif filt == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif filt == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return width, height, bpp, rows


def colors(data: bytes) -> int:
    """How many distinct pixel values a PNG holds (every 10th row, every 5th pixel)."""
    width, _, bpp, rows = png_rows(data)
    seen = {bytes(r[i : i + bpp]) for r in rows[::10] for i in range(0, width * bpp, bpp * 5)}
    return len(seen)


def widest_run(data: bytes, rgb: tuple[int, int, int]) -> tuple[int, int]:
    """The leftmost and rightmost pixel columns of colour ``rgb`` in any one row of the PNG,
    taken in the row where they lie farthest apart ((0, -1) when the colour is absent)."""
    width, _, bpp, rows = png_rows(data)
    want = bytes(rgb)
    best = (0, -1)
    for r in rows[::4]:
        xs = [x for x in range(width) if r[x * bpp : x * bpp + 3] == want]
        if xs and xs[-1] - xs[0] > best[1] - best[0]:
            best = (xs[0], xs[-1])
    return best
