"""The chat page at / in a real headless browser (Debian's chromium through
its chromedriver, driven by selenium): tokens stream into the page, a second
turn goes out with the first in its history, and a screenshot is saved; with
an API key, the page asks for it and chats with it."""

from __future__ import annotations

import random
import shutil
import string

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


def test_chat_page_asks_for_the_key(serve, tiny_model, browser, tmp_path):
    """A server with a key: the page asks for it, says so when it is refused, keeps it in the tab's session
    storage (a reload does not ask again) and sends it with the chat."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    key = "page-" + "".join(random.Random(36).choices(string.ascii_letters + string.digits, k=32))
    tiny_model.forget()
    server = serve(tiny_model, api_keys=[key])
    browser.get(server.url + "/")
    wait = WebDriverWait(browser, 60)
    keybar, field = browser.find_element(By.ID, "keybar"), browser.find_element(By.ID, "key")
    wait.until(lambda b: keybar.is_displayed() and b.find_element(By.ID, "model").text == "API key needed")
    field.send_keys(key[:-1] + "!")  # a wrong key first
    browser.find_element(By.ID, "usekey").click()
    wait.until(lambda b: "refused" in b.find_element(By.ID, "keynote").text)
    shot = tmp_path / "chat-page-key.png"
    browser.save_screenshot(str(shot))
    print(f"\nscreenshot: {shot}")
    assert keybar.is_displayed() and browser.execute_script("return sessionStorage.getItem('rkc-api-key')") is None
    field.send_keys(key)
    browser.find_element(By.ID, "usekey").click()
    wait.until(lambda b: b.find_element(By.ID, "model").text.startswith("tiny-chat"))
    assert not keybar.is_displayed() and field.get_property("value") == ""
    assert browser.execute_script("return sessionStorage.getItem('rkc-api-key')") == key
    assert key not in browser.page_source
    browser.refresh()  # the same tab: the key is still there, nothing asked
    wait.until(lambda b: b.find_element(By.ID, "model").text.startswith("tiny-chat"))
    assert not browser.find_element(By.ID, "keybar").is_displayed()
    browser.find_element(By.ID, "max").clear()
    browser.find_element(By.ID, "max").send_keys("12")
    browser.execute_script("document.getElementById('temp').value = '0'")
    browser.find_element(By.ID, "input").send_keys("hello the world")
    browser.find_element(By.ID, "send").click()
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, ".meta") or b.find_elements(By.CSS_SELECTOR, ".error"))
    assert not browser.find_elements(By.CSS_SELECTOR, ".error")
    reply = browser.find_element(By.CSS_SELECTOR, ".assistant").get_property("textContent")
    assert reply == tiny_model.chat([{"role": "user", "content": "hello the world"}], max_tokens=12,
                                    temperature=0).text
