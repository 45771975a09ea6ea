"""What a person would see of a report page, asked of a real browser: headless Chromium (the
Debian package ``chromium``; .ci/run installs it through install.sh).

``look(page)`` opens a copy of the page, with a small script added that waits for the page to be
loaded and then writes down, as JSON, what it sees: the script errors, every image and whether it
decoded, the width of the document against the window's, the elements that stick out of the
window or scroll sideways, and the answer cells of each table. ``screenshot(page, png)`` takes the
picture a person would see in a window 1280 px wide. Nothing is fetched: the page must stand
alone, and Chromium runs with its own throw-away profile.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

#: the window a person reads the page in
WIDTH = 1280

#: added to the copy of the page: records errors from the start, measures once loaded
_PROBE = """<script>
window.__errors = [];
window.addEventListener('error', e => window.__errors.push(String(e.message || e)));
window.addEventListener('load', () => {
  const W = window.innerWidth;
  const imgs = [...document.images];
  const wide = [];
  for (const e of document.querySelectorAll('body *')) {
    const r = e.getBoundingClientRect();
    const ox = getComputedStyle(e).overflowX;
    if (r.right > W + 0.5 || (ox !== 'visible' && e.scrollWidth > e.clientWidth + 1))
      wide.push(e.tagName + (e.className ? '.' + e.className : '') + ' ' + \
Math.round(r.width) + 'px');
  }
  const kinds = {};
  for (const td of document.querySelectorAll('td[class]'))
    for (const c of td.classList) kinds[c] = (kinds[c] || 0) + 1;
  const out = {errors: window.__errors, window: W,
               scroll_width: document.documentElement.scrollWidth,
               images: imgs.map(i => ({alt: i.alt, complete: i.complete, width: i.naturalWidth})),
               wide: wide, cell_kinds: kinds,
               tables: [...document.querySelectorAll('table')].map(t => t.rows.length),
               links: [...document.querySelectorAll('a[href^="#"]')].map(a => \
a.getAttribute('href')),
               anchors: [...document.querySelectorAll('[id]')].map(e => e.id)};
  const pre = document.createElement('pre');
  pre.id = 'harmony-look';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _run(args: list[str], height: int = 900, timeout: float = 120) -> str:
    """Chromium with ``args``, headless, as root too, in a new session killed whole on timeout."""
    with tempfile.TemporaryDirectory(prefix="harmony-chromium-") as profile:
        cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--no-first-run", "--disable-extensions", "--disable-background-networking",
               f"--user-data-dir={profile}", f"--window-size={WIDTH},{height}", *args]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, env=os.environ | {"HOME": profile})
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    if proc.returncode != 0:
        raise RuntimeError(f"chromium exited {proc.returncode}: {err[-2000:]}")
    return out


def look(page: Path) -> dict:
    """What Chromium sees of ``page`` once loaded (see the module docstring)."""
    text = Path(page).read_text()
    with tempfile.TemporaryDirectory(prefix="harmony-look-") as tmp:
        copy = Path(tmp) / "page.html"
        copy.write_text(re.sub(r"<head>", "<head>" + _PROBE, text, count=1))
        dom = _run(["--virtual-time-budget=20000", "--dump-dom", copy.as_uri()])
    m = re.search(r'<pre id="harmony-look">(.*?)</pre>', dom, re.S)
    if not m:
        raise RuntimeError("the page never finished loading in Chromium")
    return json.loads(m.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))


def screenshot(page: Path, png: Path, height: int = 2400) -> Path:
    """The page as a person sees it in a window 1280 px wide, its first ``height`` px."""
    _run([f"--screenshot={png}", Path(page).absolute().as_uri()], height)
    return png
