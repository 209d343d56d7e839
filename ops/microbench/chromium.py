"""A headless Chromium driven by selenium: Debian's `chromium` and `chromium-driver` (ops/setup.sh
tries to install both as root). Used by the live view's benchmark (live_view.py) and its browser test;
`missing()` says what is absent, for a skip or an error that names it.
"""

from __future__ import annotations

import importlib.util
import shutil
from typing import Any

CHROMIUM = ("chromium", "chromium-browser")
DRIVER = "chromedriver"


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
