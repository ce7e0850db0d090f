"""The chat page at `/`, in a real headless browser (Chromium and its driver from the system's
packages, driven through selenium): it loads with the model's name, sends a typed message,
streams the answer into the page and ends it with a finish reason and speed figures; a second
message continues the conversation. With a template that opens the thinking (test_reasoning.py's),
the thinking shows in its own block, apart from the answer. The screenshot taken at the end is checked: a PNG of the
window's size that is not blank (and is kept under target/ to look at).
"""
import shutil
import struct
import zlib

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from helpers import MODEL, ROOT, start_axle, stop
from test_reasoning import SWITCH, retemplated

KEY = "page-key"
WIDTH, HEIGHT = 1000, 700


def chromium():
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    raise AssertionError("Chromium is missing: run scripts/setup-tests.sh (it installs chromium and chromium-driver)")


@pytest.fixture(scope="module")
def server():
    assert MODEL.is_file(), f"{MODEL} is missing: run scripts/fetch-models.sh"
    proc, base = start_axle("--model", MODEL, "--threads", 2, "--api-key", KEY, "--model-alias", "smollm2",
                            "--context-len", 1024, "--kv-slots", 4096)
    yield base
    stop(proc)


@pytest.fixture(scope="module")
def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={WIDTH},{HEIGHT}"):
        opts.add_argument(arg)
    driver = shutil.which("chromedriver")
    assert driver, "chromedriver is missing: run scripts/setup-tests.sh"
    b = webdriver.Chrome(options=opts, service=Service(executable_path=driver))
    yield b
    b.quit()


def png_pixels(png):
    """(width, height, set of distinct RGB(A) rows sampled) of an 8-bit PNG, decoded by hand."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, chunks, ihdr = 8, [], None
    while pos < len(png):
        (n,), kind = struct.unpack(">I", png[pos:pos + 4]), png[pos + 4:pos + 8]
        data = png[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", data)
        elif kind == b"IDAT":
            chunks.append(data)
        pos += 12 + n
    w, h, depth, color = ihdr[0], ihdr[1], ihdr[2], ihdr[3]
    assert depth == 8 and color in (2, 6), ihdr
    raw = zlib.decompress(b"".join(chunks))
    return w, h, len(set(raw[i:i + 64] for i in range(0, len(raw), 997)))


def test_a_message_streams_into_the_page_and_ends_with_speed_figures(server, browser):
    b = browser
    b.get(server + "/")
    assert b.title == "Axle chat"
    b.find_element(By.ID, "key").send_keys(KEY)
    b.execute_script("document.getElementById('key').dispatchEvent(new Event('change'))")
    WebDriverWait(b, 30).until(lambda d: d.find_element(By.ID, "model").text == "smollm2")
    b.execute_script("document.getElementById('temperature').value = '0';"
                     "document.getElementById('max-tokens').value = '24';")
    # Seen while it streams: the answer grows before the reply ends.
    b.execute_script("""
        window.seen = [];
        new MutationObserver(() => {
          const a = document.querySelector('.assistant:last-child .text');
          if (a) window.seen.push(a.textContent.length);
        }).observe(document.getElementById('log'), {subtree: true, childList: true, characterData: true});""")
    box = b.find_element(By.ID, "input")
    box.send_keys("Name three colours.")
    b.find_element(By.ID, "send").click()
    WebDriverWait(b, 120).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, ".assistant[data-finish]"))
    turn = b.find_element(By.CSS_SELECTOR, ".assistant[data-finish]")
    assert turn.get_attribute("data-finish") in ("stop", "length"), turn.text
    answer = turn.find_element(By.CSS_SELECTOR, ".text").text
    assert answer.strip(), "no answer text"
    stats = turn.find_element(By.CSS_SELECTOR, ".stats").text
    assert "tokens/s" in stats and "first token" in stats and "finish:" in stats, stats
    seen = b.execute_script("return window.seen")
    assert len(set(seen)) > 2, f"the answer did not arrive piece by piece: {seen}"
    assert not b.find_elements(By.CSS_SELECTOR, ".error")

    # A second message carries the conversation on.
    box.send_keys("And one more?")
    b.find_element(By.ID, "send").click()
    WebDriverWait(b, 120).until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, ".assistant[data-finish]")) == 2)
    assert len(b.find_elements(By.CSS_SELECTOR, ".user")) == 2

    png = b.get_screenshot_as_png()
    out = ROOT / "target" / "chat-page.png"
    out.parent.mkdir(exist_ok=True)
    out.write_bytes(png)
    w, h, distinct = png_pixels(png)
    assert (w, h) == (WIDTH, HEIGHT) or (w > 0.9 * WIDTH and h > 0.5 * HEIGHT), (w, h)
    assert distinct > 10, f"the screenshot looks blank ({distinct} distinct samples)"


def test_a_wrong_key_shows_an_error_in_the_page(server, browser):
    b = browser
    b.get(server + "/")
    b.find_element(By.ID, "key").clear()
    b.find_element(By.ID, "key").send_keys("wrong")
    b.execute_script("document.getElementById('key').dispatchEvent(new Event('change'))")
    b.find_element(By.ID, "input").send_keys("Hi")
    b.find_element(By.ID, "send").click()
    WebDriverWait(b, 30).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".error"))
    assert b.find_element(By.CSS_SELECTOR, ".assistant").get_attribute("data-finish") == "error"


def test_thinking_shows_apart_from_the_answer(browser, tmp_path_factory):
    """SmolLM2 does not close a thinking the prompt opened within 16 tokens: all of them land in
    the thinking block and none in the answer."""
    proc, base = start_axle("--model", retemplated(tmp_path_factory, SWITCH), "--threads", 2,
                            "--model-alias", "thinker", "--context-len", 512, "--kv-slots", 2048)
    try:
        b = browser
        b.get(base + "/")
        b.find_element(By.ID, "key").clear()
        b.execute_script("document.getElementById('key').dispatchEvent(new Event('change'));"
                         "document.getElementById('temperature').value = '0';"
                         "document.getElementById('max-tokens').value = '16';")
        b.find_element(By.ID, "input").send_keys("Why is the sky blue?")
        b.find_element(By.ID, "send").click()
        WebDriverWait(b, 120).until(lambda d: d.find_elements(By.CSS_SELECTOR, ".assistant[data-finish]"))
        turn = b.find_element(By.CSS_SELECTOR, ".assistant")
        thought = turn.find_element(By.CSS_SELECTOR, "details.thinking pre").get_attribute("textContent")
        assert thought.strip(), "no thinking shown"
        assert turn.find_element(By.CSS_SELECTOR, ".text").text == ""
        assert "16 tokens" in turn.find_element(By.CSS_SELECTOR, ".stats").text
    finally:
        stop(proc)


def test_answers_render_markdown_as_elements_never_as_html(server, browser):
    """The page's Markdown (fenced code, headings, lists, inline code, bold, italics, links) builds
    elements; text that looks like HTML stays text."""
    b = browser
    b.get(server + "/")
    text = ("# Title\n\nSome **bold**, *it*, `x = 1` and [a link](https://example.com).\n\n"
            "```python\nprint('<b>hi</b>')\n```\n- one\n- two\n\n1. first\n\n"
            "<img src=x onerror=\"window.pwned=1\"> and [bad](javascript:alert(1))")
    html = b.execute_script(
        "const d = document.createElement('div'); markdown(d, arguments[0]); return d.innerHTML;", text)
    assert "<h3>Title</h3>" in html, html
    assert "<strong>bold</strong>" in html and "<em>it</em>" in html and "<code>x = 1</code>" in html, html
    assert '<a href="https://example.com" rel="noopener noreferrer" target="_blank">a link</a>' in html, html
    assert "<pre><code data-lang=\"python\">print('&lt;b&gt;hi&lt;/b&gt;')</code></pre>" in html, html
    assert "<ul><li>one</li><li>two</li></ul>" in html and "<ol><li>first</li></ol>" in html, html
    assert "<img" not in html and "&lt;img" in html and "href=\"javascript" not in html, html
    assert not b.execute_script("return window.pwned")
