"""A headless Chromium driven by selenium, for the live view's tests: what a person's browser does.

Debian's `chromium` and `chromium-driver` (ops/setup.sh tries to install both); `missing()` says
what is absent, for a skip that names it.
"""

from __future__ import annotations

import importlib.util
import shutil
from typing import Any

CHROMIUM = ("chromium", "chromium-browser")
DRIVER = "chromedriver"

# Every canvas of the page, read back as a person sees it: pixels counted by colour (a hex string),
# sampled at each cell's centre so that the grid lines between big cells do not count.
COUNT_CELL_COLOURS = """
const out = {};
for (const canvas of document.querySelectorAll('canvas.pool')) {
  const L = canvas.layout, ctx = canvas.getContext('2d'), counts = {};
  const img = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
  for (let b = 0; b < L.n; b++) {
    const x = (b % L.cols) * L.cell + (L.cell >> 1), y = Math.floor(b / L.cols) * L.cell + (L.cell >> 1);
    const o = 4 * (y * canvas.width + x);
    const hex = '#' + [img[o], img[o + 1], img[o + 2]].map(v => v.toString(16).padStart(2, '0')).join('');
    counts[hex] = (counts[hex] || 0) + 1;
  }
  out[canvas.dataset.pool] = counts;
}
return out;
"""

CELL_COLOUR = """
const [pool, id] = arguments;
const canvas = document.querySelector(`canvas.pool[data-pool="${pool}"]`), L = canvas.layout;
const x = (id % L.cols) * L.cell + (L.cell >> 1), y = Math.floor(id / L.cols) * L.cell + (L.cell >> 1);
const p = canvas.getContext('2d').getImageData(x, y, 1, 1).data;
return '#' + [p[0], p[1], p[2]].map(v => v.toString(16).padStart(2, '0')).join('');
"""

CELL_OFFSET = """
const [pool, id] = arguments;
const canvas = document.querySelector(`canvas.pool[data-pool="${pool}"]`), L = canvas.layout;
return [(id % L.cols) * L.cell + (L.cell >> 1) - canvas.width / 2,
        Math.floor(id / L.cols) * L.cell + (L.cell >> 1) - canvas.height / 2];
"""


def missing() -> str | None:
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install selenium; it is in the dev extra)"
    if not any(shutil.which(c) for c in CHROMIUM):
        return "chromium is not installed (apt-get install -y chromium chromium-driver; ops/setup.sh tries it as root)"
    if not shutil.which(DRIVER):
        return "chromedriver is not installed (apt-get install -y chromium-driver)"
    return None


def headless_chromium(width: int = 1400, height: int = 1100) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = next(shutil.which(c) for c in CHROMIUM if shutil.which(c))
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
        "--no-proxy-server",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(shutil.which(DRIVER)), options=options)
