"""Scripts the live view's browser test runs in the page: the canvas read back as a person sees it.
(The browser itself: pagedserve.ops.microbench.chromium.)"""

from __future__ import annotations

from pagedserve.ops.microbench.chromium import headless_chromium, missing

__all__ = ["CELL_COLOUR", "CELL_OFFSET", "COUNT_CELL_COLOURS", "headless_chromium", "missing"]

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
