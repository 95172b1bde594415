"""The chat page at / in a real headless browser (Debian's chromium through
its chromedriver, driven by selenium): tokens stream into the page, a second
turn goes out with the first in its history, and a screenshot is saved."""

from __future__ import annotations

import shutil

import pytest

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1000,700"]


@pytest.fixture
def browser(tmp_path):
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("chromium and chromium-driver are not installed (.ci/run installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]:
        options.add_argument(flag)
    b = webdriver.Chrome(service=Service(driver), options=options)
    b.set_page_load_timeout(30)
    yield b
    b.quit()


def test_chat_page_streams_a_reply(serve, tiny_model, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    tiny_model.forget()
    server = serve(tiny_model)
    browser.get(server.url + "/")
    wait = WebDriverWait(browser, 60)
    wait.until(lambda b: b.find_element(By.ID, "model").text.startswith("tiny-chat"))
    browser.find_element(By.ID, "max").clear()
    browser.find_element(By.ID, "max").send_keys("40")
    browser.execute_script("document.getElementById('temp').value = '0'")
    # watch the reply's text change while it streams (recorded in the page, read afterwards)
    browser.execute_script("""
        window.seen = [];
        new MutationObserver(() => {
          const r = document.querySelector('.assistant');
          if (r) window.seen.push(r.textContent.length);
        }).observe(document.getElementById('log'), {childList: true, subtree: true, characterData: true});""")
    for turn, text in enumerate(["hello the world", "and the cat?"]):
        browser.find_element(By.ID, "input").send_keys(text)
        browser.find_element(By.ID, "send").click()
        wait.until(lambda b: len(b.find_elements(By.CSS_SELECTOR, ".meta")) == turn + 1)
    replies = [e.get_property("textContent") for e in browser.find_elements(By.CSS_SELECTOR, ".assistant")]
    states = [e.get_attribute("data-state") for e in browser.find_elements(By.CSS_SELECTOR, ".assistant")]
    metas = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".meta")]
    shot = tmp_path / "chat-page.png"
    browser.save_screenshot(str(shot))
    print(f"\nscreenshot: {shot}")
    assert states == ["done", "done"] and not browser.find_elements(By.CSS_SELECTOR, ".error")
    first = tiny_model.chat([{"role": "user", "content": "hello the world"}], max_tokens=40, temperature=0)
    assert replies[0] == first.text
    seen = browser.execute_script("return window.seen")
    assert len(set(seen)) > 3  # the first reply grew piece by piece, not all at once
    assert metas[0].startswith(f"{first.completion_tokens} tokens · prompt {first.prompt_tokens} (0 cached)")
    cached = int(metas[1].split("(")[1].split()[0])
    assert cached >= first.prompt_tokens  # the page sent the history; the server reused its KV
    assert shot.stat().st_size > 10_000
