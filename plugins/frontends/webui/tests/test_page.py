"""The chat page in a real headless browser against a live server: streamed Markdown replies,
stop, the model picker, conversations kept across a reload, the API-key prompt, errors, a
phone-sized screen, and the renderer never letting model text become markup."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from webui_frontend_support import API_KEY, MODEL_NAMES, Page, default_model_installed, wait_for

from llmp.testing import LiveServer

SCREENSHOT = Path(__file__).resolve().parents[4] / "docs" / "images" / "webui.png"


@pytest.fixture
def page(browser: Any, server: LiveServer) -> Page:
    browser.set_window_size(1200, 820)
    return Page(browser, server.url).open(fresh=True)


def running_requests(server: LiveServer) -> float:
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    return float(re.search(r"^llmp_num_requests_running\{[^}]*\} (\S+)$", metrics, re.M)[1])


def test_a_reply_streams_in_token_by_token_as_markdown(page: Page) -> None:
    page.settings(max_tokens=120, temperature=0)
    page.send("Write a short Python function that reverses a string, in a code block.")
    assert wait_for(page.streaming, "the Stop button while the reply streams")
    reply = page.wait_reply_done()
    lengths = page.js("return window.__lengths")
    assert len([n for n in lengths if n > 0]) >= 3, f"the reply did not grow token by token: {lengths}"
    assert page.reply_text().strip(), "empty reply"
    assert not reply.find_element("css selector", ".error").is_displayed()
    assert reply.get_attribute("aria-busy") == "false"
    assert page.el("#messages").get_attribute("aria-live") == "polite"
    meta = reply.find_element("css selector", ".meta").text
    assert meta.startswith(MODEL_NAMES[0]) and "tokens" in meta, meta
    (request,) = page.requests("v1/chat/completions")
    body = json.loads(request["body"])
    assert body["stream"] is True and body["max_tokens"] == 120 and body["temperature"] == 0
    assert body["messages"][-1]["role"] == "user"
    if default_model_installed():  # the picture in docs/webui.md shows a real model's answer
        page.js("document.activeElement.blur()")
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.driver.save_screenshot(str(SCREENSHOT))


def test_stop_ends_a_long_reply_and_the_server_drops_the_request(page: Page, server: LiveServer) -> None:
    from selenium.webdriver.common.keys import Keys

    page.settings(max_tokens=3000, temperature=1)
    for stop_with in ("button", "escape"):
        page.send("Tell me a very long story about a dragon and a lighthouse keeper, chapter by chapter.")
        wait_for(lambda: len(page.reply_text()) > 40, "the long reply to start")
        if stop_with == "button":
            page.el("#stop").click()
        else:
            page.el("#prompt").send_keys(Keys.ESCAPE)  # Esc stops
        reply = page.wait_reply_done(timeout=10)
        assert "stopped" in reply.find_element("css selector", ".meta").text
        kept = page.reply_text()
        time.sleep(0.6)
        assert page.reply_text() == kept, "the reply went on growing after Stop"
        # the fetch was aborted, the server saw the disconnect and aborted the engine's request
        wait_for(lambda: running_requests(server) == 0, "the engine to drop the request", timeout=15)
    page.settings(max_tokens=5, temperature=0)
    page.send("Thanks!")
    reply = page.wait_reply_done()
    assert page.reply_text() and "stopped" not in reply.find_element("css selector", ".meta").text


def test_the_model_picker_lists_the_served_names_and_sends_the_chosen_one(page: Page) -> None:
    from selenium.webdriver.support.ui import Select

    picker = Select(page.el("#model"))
    assert [option.text for option in picker.options] == list(MODEL_NAMES)  # from /v1/models
    assert picker.first_selected_option.text == MODEL_NAMES[0]
    picker.select_by_visible_text(MODEL_NAMES[1])
    page.settings(max_tokens=6)
    page.send("Hello")
    reply = page.wait_reply_done()
    assert not reply.find_element("css selector", ".error").is_displayed()  # the server took the name
    assert json.loads(page.requests("v1/chat/completions")[0]["body"])["model"] == MODEL_NAMES[1]
    assert reply.find_element("css selector", ".meta").text.startswith(MODEL_NAMES[1])
    page.open()
    assert Select(page.el("#model")).first_selected_option.text == MODEL_NAMES[1]  # the choice is kept


def test_conversations_are_kept_across_a_reload(page: Page) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    page.settings(max_tokens=8, temperature=0, system="Answer in one short sentence.")
    prompt = page.el("#prompt")
    prompt.send_keys("first line")
    ActionChains(page.driver).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()  # a new line
    prompt.send_keys("second line")
    assert not page.all(".message"), "Shift+Enter sent the message"
    prompt.send_keys(Keys.ENTER)
    page.wait_reply_done()
    user = page.el(".message.user .content").text
    assert user == "first line\nsecond line"
    answer = page.reply_text()
    body = json.loads(page.requests("v1/chat/completions")[0]["body"])
    assert body["messages"][0] == {"role": "system", "content": "Answer in one short sentence."}

    page.open()  # reload
    assert page.el(".message.user .content").text == user
    assert page.reply_text() == answer
    assert [b.text for b in page.all(".conversation-open")] == ["first line"]
    assert page.el("#system-prompt").get_attribute("value") == "Answer in one short sentence."

    page.el("#new-chat").click()
    assert not page.all(".message")
    page.send("Another question")
    page.wait_reply_done()
    titles = [b.text for b in page.all(".conversation-open")]
    assert titles == ["Another question", "first line"]
    page.all(".conversation-open")[1].click()
    assert page.el(".message.user .content").text == user  # back to the first conversation
    page.all(".conversation-delete")[1].click()
    page.open()
    assert [b.text for b in page.all(".conversation-open")] == ["Another question"]


def test_the_page_asks_for_the_api_key_and_keeps_it(browser: Any, key_server: LiveServer) -> None:
    browser.set_window_size(1200, 820)
    page = Page(browser, f"{key_server.url}/llm").open(fresh=True, wait_ready=False)
    dialog = page.el("#key-dialog")
    wait_for(dialog.is_displayed, "the API-key prompt after /v1/models answered 401")
    assert "needs an API key" in page.el("#key-reason").text
    page.el("#api-key").send_keys("wrong-key")
    page.el("#key-save").click()
    wait_for(lambda: "refused" in page.el("#key-reason").text, "the prompt to say the key was refused")
    page.el("#api-key").send_keys(API_KEY)
    page.el("#key-save").click()
    wait_for(lambda: page.js("return document.body.dataset.ready === 'true'"), "the page to load its models")
    assert not dialog.is_displayed()
    assert page.all("#model option"), "no models listed after the key was given"

    page.settings(max_tokens=4)
    page.send("hello")
    reply = page.wait_reply_done()
    assert not reply.find_element("css selector", ".error").is_displayed()
    (request,) = page.requests("v1/chat/completions")
    assert request["auth"] == f"Bearer {API_KEY}"
    assert request["url"].endswith("/llm/v1/chat/completions")  # relative URLs under --root-path

    page.open()  # the key is kept: no prompt after a reload
    assert not page.el("#key-dialog").is_displayed()
    assert page.all("#model option")


def test_server_errors_are_shown_in_the_conversation(browser: Any, key_server: LiveServer) -> None:
    page = Page(browser, f"{key_server.url}/llm").open(fresh=True, wait_ready=False)
    page.js(f"localStorage.setItem('llmp.webui.apiKey', JSON.stringify('{API_KEY}'))")
    page.open()
    page.settings(max_tokens=100000)  # beyond the context of the model (512)
    page.send("hello")
    reply = page.wait_reply_done()
    error = reply.find_element("css selector", ".error")
    assert error.is_displayed() and error.get_attribute("role") == "alert"
    assert error.text.startswith("400"), error.text
    assert not page.streaming() and page.el("#send").is_displayed()


def test_the_page_is_usable_on_a_phone_sized_screen(browser: Any, server: LiveServer) -> None:
    browser.set_window_size(375, 740)
    try:
        page = Page(browser, server.url).open(fresh=True)
        width = page.js("return document.documentElement.clientWidth")
        assert page.js("return document.documentElement.scrollWidth") <= width, "the page scrolls sideways"
        for selector in ("#prompt", "#send", "#model", "#open-sidebar", "#toggle-settings"):
            box = page.js("return arguments[0].getBoundingClientRect().toJSON()", page.el(selector))
            assert page.el(selector).is_displayed() and 0 <= box["left"] and box["right"] <= width, (selector, box)
        assert not page.el("#new-chat").is_displayed()  # the conversation list folds away
        page.el("#open-sidebar").click()
        wait_for(page.el("#new-chat").is_displayed, "the conversation list to open")
        assert page.el("#open-sidebar").get_attribute("aria-expanded") == "true"
    finally:
        browser.set_window_size(1200, 820)


MARKDOWN = """# Title

Some **bold**, *italic*, `code` and a [link](https://example.com/a?b=1&c=2).

- one
- two
  1. nested

| a | b |
|---|--:|
| 1 | 2 |

```python
def add(a, b):
    return a + b  # sum
```
"""

ATTACKS = [
    "<script>window.__pwned = 1</script>",
    '<img src=x onerror="window.__pwned = 1">',
    "[click](javascript:window.__pwned=1)",
    '[x](https://e.com" onmouseover="window.__pwned=1)',
    "```html\n<img src=x onerror=window.__pwned=1>\n```",
    "**<svg onload=window.__pwned=1>**",
    "`<iframe src=javascript:window.__pwned=1>`",
    "| <b onclick=x>a</b> |\n|---|\n| <i>b</i> |",
    "> <style>body{display:none}</style>",
    "&lt;script&gt; &amp;",
]

RENDER = """
const holder = document.createElement("div");
holder.innerHTML = LlmpMarkdown.render(arguments[0]);
document.body.append(holder);
const result = {
  tags: [...new Set([...holder.querySelectorAll("*")].map((e) => e.tagName.toLowerCase()))],
  events: [...holder.querySelectorAll("*")].flatMap((e) => [...e.attributes].map((a) => a.name))
    .filter((name) => name.startsWith("on")),
  hrefs: [...holder.querySelectorAll("a")].map((a) => a.getAttribute("href")),
  text: holder.textContent,
  html: holder.innerHTML,
};
holder.remove();
return result;
"""

SAFE_TAGS = {
    *"p br strong em del code pre a div span button ul ol li table thead tbody tr th td blockquote hr".split(),
    *(f"h{n}" for n in range(1, 7)),
}


def test_model_text_renders_as_markdown_and_never_as_markup(page: Page) -> None:
    result = page.js(RENDER, MARKDOWN)
    html = result["html"]
    assert "<h1>Title</h1>" in html and "<strong>bold</strong>" in html and "<em>italic</em>" in html
    assert result["hrefs"] == ["https://example.com/a?b=1&c=2"]
    assert re.search(r"<ul><li>one</li><li>two<ol><li>nested</li></ol></li></ul>", html), html
    assert '<td class="align-right">2</td>' in html
    assert '<span class="tk-k">def</span> <span class="tk-f">add</span>' in html
    assert '<span class="tk-c"># sum</span>' in html
    streaming = page.js(RENDER, "Here:\n```js\nconst x = 'a")  # a fence still arriving renders as code
    assert '<span class="tk-k">const</span>' in streaming["html"] and "pre" in streaming["tags"]

    for attack in ATTACKS:
        result = page.js(RENDER, attack)
        assert set(result["tags"]) <= SAFE_TAGS, (attack, result["html"])
        assert not result["events"], (attack, result["html"])
        assert all(href.startswith("https://") for href in result["hrefs"]), (attack, result["hrefs"])
    assert page.js("return window.__pwned") is None
    # what was typed is what is seen: markup arrives as text
    assert page.js(RENDER, "<b>x</b> &amp;")["text"] == "<b>x</b> &amp;"
