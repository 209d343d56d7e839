"""The live view as a person uses it, against one real deployment under load: the web page in a
real headless Chromium, and `pagedserve top` in a real terminal (tmux).

In the browser: open the scheduler's `/view` with the admin token, watch the pool's cells, the
totals and the workers while requests run and finish, then see a leak made on purpose (a ghost
owner that allocates and goes silent) turn red, and the cells come back free once the lease is
reaped. `PAGEDSERVE_VIEW_SCREENSHOTS=docs/images` keeps the screenshots for the docs. In tmux: the
same story read off the screen with `tmux capture-pane`, then Ctrl-C.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest
from browser import CELL_COLOUR, CELL_OFFSET, COUNT_CELL_COLOURS, headless_chromium, missing
from harness.deployment import start, wait_for
from harness.ghost_owner import ghost_allocate

needs_browser = pytest.mark.skipif(missing() is not None, reason=f"no headless browser: {missing()}")
needs_tmux = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)"
)

TOKEN = "view-test-token"
NUM_BLOCKS = 512
TTL = 2.0
WAIT_S = 90


@pytest.fixture(scope="module")
def deployment(tiny_model, tmp_path_factory):
    # The reaper's timer is off (an hour) so the leak stays red until the test reaps it through
    # /admin/reap, which calls the same reap the timer does: the red window is not left to chance.
    sup = start(
        tiny_model("llama"),
        workers=2,
        log_dir=tmp_path_factory.mktemp("view-logs"),
        num_blocks=NUM_BLOCKS,
        admin_token=TOKEN,
        lease_ttl_s=TTL,
        lease_renew_interval_s=0.4,
        reap_interval_s=3600.0,
        # Steps of 20 ms: the page polls about once a second, and the tiny model's real steps
        # (under 1 ms on a fast CPU) finished the whole load between two polls. The view shows
        # blocks and requests, which the simulated worker moves exactly as a real one.
        simulate_step_ms=20.0,
    )
    yield sup
    sup.stop()


@pytest.fixture(scope="module")
def browser(deployment):
    from selenium.webdriver.support.ui import WebDriverWait

    driver = headless_chromium()
    try:
        driver.get(f"{deployment.scheduler_ops_url}/view?token={TOKEN}")
        WebDriverWait(driver, WAIT_S).until(
            lambda d: d.execute_script("return window.pagedserveView.updates") >= 2
        )
        yield driver
    finally:
        driver.quit()


def shots_dir(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("PAGEDSERVE_VIEW_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# The page redraws its tables every update, so the DOM is read in one script call, never through
# element handles that the next update makes stale.
def text(driver, element_id: str) -> str:
    return driver.execute_script("return document.getElementById(arguments[0]).textContent", element_id)


def legend_count(driver, state: str) -> int:
    return int(
        driver.execute_script(f"return document.querySelector('[data-state=\"{state}\"] b').textContent")
    )


def worker_cells(driver) -> dict[str, list[str]]:
    return driver.execute_script(
        "const out = {}; for (const r of document.querySelectorAll('#workers tr[data-worker]'))"
        " out[r.dataset.worker] = [...r.querySelectorAll('td')].map(td => td.textContent); return out;"
    )


def request_rows(driver) -> int:
    return driver.execute_script("return document.querySelectorAll('#requests tr[data-request]').length")


def non_free_cells(driver) -> int:
    colours = driver.execute_script("return COLORS")
    free = {colours["free"], colours["free_cached"]}
    counts = driver.execute_script(COUNT_CELL_COLOURS)
    return sum(n for pool in counts.values() for hex_, n in pool.items() if hex_ not in free)


def load(endpoint: str, n: int, max_tokens: int) -> threading.Thread:
    from pagedserve import AsyncClient

    async def run() -> None:
        async with AsyncClient(endpoint, timeout_s=180) as client:
            await asyncio.gather(
                *(
                    client.generate(
                        prompt_token_ids=[3 + (i * 7 + j) % 250 for j in range(50 + 9 * i)],
                        max_tokens=max_tokens,
                        temperature=0.0,
                        ignore_eos=True,
                    )
                    for i in range(n)
                )
            )

    thread = threading.Thread(target=lambda: asyncio.run(run()), daemon=True)
    thread.start()
    return thread


def test_view_needs_the_admin_token_and_trades_it_for_a_cookie(deployment):
    url = f"{deployment.scheduler_ops_url}/view"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(urllib.error.HTTPError) as refused:
        opener.open(url, timeout=10)
    assert refused.value.code == 403
    bearer = urllib.request.Request(f"{deployment.block_manager_ops_url}/view/pool")
    bearer.add_header("Authorization", f"Bearer {TOKEN}")
    assert opener.open(bearer, timeout=10).status == 200

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):  # noqa: ANN002, ANN003
            return None

    raw = urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect)
    with pytest.raises(urllib.error.HTTPError) as redirected:
        raw.open(f"{url}?token={TOKEN}", timeout=10)
    assert redirected.value.code == 303 and redirected.value.headers["Location"] == "/view"
    cookie = redirected.value.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    with_cookie = urllib.request.Request(url, headers={"Cookie": cookie.split(";")[0]})
    assert b"pagedserve: live view" in opener.open(with_cookie, timeout=10).read()


@needs_browser
def test_cells_totals_and_workers_change_as_requests_run_and_finish(deployment, browser, tmp_path):
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.2)
    assert text(browser, "t-total") == str(2 * NUM_BLOCKS)
    assert text(browser, "verdict") == "✓ ok"
    assert set(worker_cells(browser)) == {"worker-0", "worker-1"}
    assert all(cells[1] == "active" for cells in worker_cells(browser).values())
    steps_before = sum(int(cells[4]) for cells in worker_cells(browser).values())
    assert non_free_cells(browser) == 0

    thread = load(deployment.front_endpoint, n=8, max_tokens=160)
    wait.until(lambda d: int(text(d, "t-running")) > 0 and int(text(d, "t-used")) > 0)
    wait.until(lambda d: non_free_cells(d) > 0)
    used = int(text(browser, "t-used"))
    assert request_rows(browser) > 0
    assert non_free_cells(browser) == legend_count(browser, "held") + legend_count(browser, "cached") + sum(
        legend_count(browser, s) for s in ("shared", "pending", "expiring", "leaked", "broken")
    )
    # While they decode the cells keep changing: tables grow block by block.
    wait.until(lambda d: int(text(d, "t-used")) != used)
    browser.save_screenshot(str(shots_dir(tmp_path) / "live-view.png"))

    thread.join(timeout=WAIT_S * 2)
    assert not thread.is_alive(), "the load did not finish"
    wait.until(lambda d: text(d, "t-used") == "0" and text(d, "t-running") == "0")
    wait.until(lambda d: non_free_cells(d) == 0)
    steps_after = sum(int(cells[4]) for cells in worker_cells(browser).values())
    assert steps_after > steps_before
    assert float(text(browser, "t-tps")) >= 0.0
    assert text(browser, "verdict") == "✓ ok"


@needs_browser
def test_a_ghost_owners_blocks_show_red_until_reaped_then_free(deployment, browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.2)
    colours = browser.execute_script("return COLORS")
    prompts = [[200 + i] * 40 for i in range(3)]  # 3 blocks each, two of them full
    tables = ghost_allocate(deployment.config.block_manager_endpoint, "worker-0", prompts, "ghost")
    ghost_blocks = [b for table in tables for b in table]
    assert len(ghost_blocks) == 9

    wait.until(lambda d: legend_count(d, "leaked") == len(ghost_blocks))
    assert {browser.execute_script(CELL_COLOUR, "worker-0", b) for b in ghost_blocks} == {colours["leaked"]}
    assert "bad" in browser.find_element("id", "t-leaked").get_attribute("class")
    canvas = browser.find_element("css selector", 'canvas.pool[data-pool="worker-0"]')
    dx, dy = browser.execute_script(CELL_OFFSET, "worker-0", ghost_blocks[0])
    ActionChains(browser).move_to_element_with_offset(canvas, int(dx), int(dy)).perform()
    wait.until(lambda d: "leaked" in text(d, "tip") and "ghost-0" in text(d, "detail"))
    assert f"block {ghost_blocks[0]} of worker-0" in text(browser, "detail")
    browser.save_screenshot(str(shots_dir(tmp_path) / "live-view-leak.png"))

    reap = urllib.request.Request(
        f"{deployment.block_manager_ops_url}/admin/reap",
        method="POST",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    assert b'"reclaimed": 3' in opener.open(reap, timeout=10).read()
    wait.until(lambda d: legend_count(d, "leaked") == 0)
    assert {browser.execute_script(CELL_COLOUR, "worker-0", b) for b in ghost_blocks} <= {
        colours["free"],
        colours["free_cached"],
    }
    assert text(browser, "t-leaked") == "0" and text(browser, "verdict") == "✓ ok"


@needs_browser
def test_the_block_managers_own_view_shows_the_pool_alone(deployment, browser):
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{deployment.block_manager_ops_url}/view?token={TOKEN}")
    WebDriverWait(browser, WAIT_S).until(
        lambda d: d.execute_script("return window.pagedserveView.updates") >= 1
    )
    assert text(browser, "role") == "served by the block-manager"
    assert text(browser, "t-total") == str(2 * NUM_BLOCKS) and text(browser, "verdict") == "✓ ok"
    assert text(browser, "status").startswith("live")
    assert text(browser, "t-running") == "–"  # the scheduler's part is not served here
    assert not browser.find_element("id", "workers").is_displayed()


def screen(session: str) -> str:
    out = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True)
    return out.stdout


def number_after(label: str, text: str) -> int | None:
    found = re.search(rf"{label} (\d+)", text)
    return None if found is None else int(found.group(1))


@needs_tmux
def test_top_follows_requests_and_shows_a_leak_until_reaped(deployment):
    sup = deployment
    session = f"top-{uuid.uuid4().hex[:8]}"
    command = (
        f"{sys.executable} -m pagedserve.ops.cli top --scheduler-url {sup.scheduler_ops_url} "
        f"--block-manager-url {sup.block_manager_ops_url} --token {TOKEN} --interval 0.5"
    )
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "60", command], check=True)
    try:
        shown = wait_for(lambda: "worker-0" in (s := screen(session)) and "active" in s and s, 60)
        assert shown, screen(session)
        assert "invariants ✓ ok" in shown and f"pool 0/{2 * NUM_BLOCKS} used" in shown

        from pagedserve import Client

        with Client(sup.front_endpoint, timeout_s=120) as client:
            stream = client.stream(prompt_token_ids=list(range(3, 80)), max_tokens=200, ignore_eos=True)
            running = wait_for(lambda: (number_after("running", screen(session)) or 0) > 0, 60)
            assert running, screen(session)
            for _ in stream:
                pass
        idle = f"pool 0/{2 * NUM_BLOCKS} used"
        assert wait_for(lambda: idle in (s := screen(session)) and "running 0" in s, 60), screen(session)

        tables = ghost_allocate(sup.config.block_manager_endpoint, "worker-0", [[250] * 40], "ghost-top")
        assert wait_for(lambda: number_after("leaked", screen(session)) == len(tables[0]), 30), screen(
            session
        )
        reap = urllib.request.Request(
            f"{sup.block_manager_ops_url}/admin/reap",
            method="POST",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(reap, timeout=10)
        assert wait_for(lambda: number_after("leaked", screen(session)) == 0, 30), screen(session)

        subprocess.run(["tmux", "send-keys", "-t", session, "C-c"], check=True)
        gone = wait_for(
            lambda: (
                subprocess.run(["tmux", "has-session", "-t", session], capture_output=True).returncode != 0
            ),
            10,
        )
        assert gone, "top did not exit on Ctrl-C"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
