"""torchherd show's page at scale in a real browser: 64 nodes and a day of samples open at
once (the page of a real failed launch is opened in test_driver.py, on cluster3)."""

from __future__ import annotations

from selenium.webdriver.common.by import By

from driver import show
from tests.integration.browser import chromium, open_page, severe
from tests.unit.show_run import failed_run


def test_a_page_of_64_nodes_and_a_day_of_samples_opens_in_about_a_second(tmp_path):
    run_dir = failed_run(tmp_path, nodes=64, hours=24, every=300, gpus=8)
    page, _info = show.write(run_dir.name, runs_dir=tmp_path)
    with chromium() as browser:
        took = open_page(browser, page)
        assert severe(browser) == []
        # About a second: with room for a test machine busy with the rest of the suite.
        assert took < 2.0, took
        assert len(browser.find_elements(By.CSS_SELECTOR, "svg.spark")) == 64 * 4
        assert len(browser.find_elements(By.CSS_SELECTOR, "#logs details")) == 64
        browser.save_screenshot(str(tmp_path / "show-64.png"))
