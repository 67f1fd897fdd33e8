"""Driving the chat page in headless Debian chromium (conftest puts this folder on sys.path)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

API_KEY = "Secret-Key-42"
MODEL_NAMES = ("smollm2", "assistant-2")  # the served names of the main test server
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 60

# a page-side record of what the page sent (its fetch calls) and how the streaming reply grew
RECORDERS = """
window.__requests = [];
const originalFetch = window.fetch;
window.fetch = function (url, init) {
  window.__requests.push({
    url: new URL(String(url), document.baseURI).href,
    body: init && init.body ? String(init.body) : null,
    auth: init && init.headers ? init.headers.Authorization || null : null,
  });
  return originalFetch.apply(this, arguments);
};
window.__lengths = [];
const box = document.getElementById("messages");
new MutationObserver(() => {
  const reply = [...box.querySelectorAll(".message.assistant .content")].pop();
  if (!reply) return;
  const n = reply.textContent.length;
  if (window.__lengths[window.__lengths.length - 1] !== n) window.__lengths.push(n);
}).observe(box, {subtree: true, childList: true, characterData: true});
// what screen readers are told: the announcer's texts, and changes in any other live region
window.__announced = [];
const announcer = document.getElementById("announcer");
new MutationObserver(() => announcer.textContent && window.__announced.push(announcer.textContent))
  .observe(announcer, {subtree: true, childList: true, characterData: true});
window.__liveChurn = 0;
const live = '[aria-live]:not([aria-live="off"]), [role=log]:not([aria-live="off"]), [role=status], [role=alert]';
for (const region of document.querySelectorAll(live)) {
  if (region === announcer) continue;
  new MutationObserver(() => window.__liveChurn++)
    .observe(region, {subtree: true, childList: true, characterData: true});
}
window.__busySeen = false;
new MutationObserver(() => {
  if (box.querySelector(".message.assistant[aria-busy='true']")) window.__busySeen = true;
}).observe(box, {subtree: true, childList: true, attributes: true, attributeFilter: ["aria-busy"]});
"""


# what the reasoning model writes, whatever it is asked: reasoning, the end marker, the answer
REASONING = "Hmm, let me think."
ANSWER = "The answer is 42."
_REASONING_TOKENS = ("Hmm,", " let", " me", " think.")
_ANSWER_TOKENS = ("The", " answer", " is", " 42.")


def save_reasoning_llama(path: Path) -> None:
    """A tiny Llama that always writes ``REASONING</think>ANSWER`` then its end token, greedy or sampled.

    A random model never writes ``</think>`` on cue, so its weights are set: the layers add
    nothing (``o_proj`` and ``down_proj`` are zero), so each next token depends on the last token
    alone, and the embedding and LM head make that a chain: any token not in the chain is followed
    by the first one, each chain token by the next, the last by ``</s>``; logit margins of about 70
    leave nothing to chance at any temperature. The words are added tokens of the tokenizer.
    """
    import torch
    from transformers import AutoTokenizer

    from llmp.testing import save_tiny_llama

    model = save_tiny_llama(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.add_tokens(["</think>", *_REASONING_TOKENS, *_ANSWER_TOKENS])
    tokenizer.save_pretrained(path)
    chain = [tokenizer.convert_tokens_to_ids(token) for token in (*_REASONING_TOKENS, "</think>", *_ANSWER_TOKENS)]
    assert len(set(chain)) == len(chain) and max(chain) < model.config.vocab_size, chain
    assert tokenizer.decode(chain) == f"{REASONING}</think>{ANSWER}", tokenizer.decode(chain)
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param.zero_()
        embed.zero_()
        embed[:, 0] = 1  # every token: one shared direction
        head.zero_()
        head[chain[0], 0] = 10  # which makes any other token lead into the chain
        for k, token in enumerate(chain):
            embed[token, k + 1] = 10  # each chain token: a direction of its own
            head[chain[k + 1] if k + 1 < len(chain) else model.config.eos_token_id, k + 1] = 10
    model.save_pretrained(path)


def default_model_installed() -> bool:
    from llmp.frontend import installed_packaged_models
    from llmp.options import DEFAULT_MODEL

    return any(model.hub_id == DEFAULT_MODEL for model in installed_packaged_models())


def missing_browser() -> str | None:
    """Why the browser tests cannot run here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            return f"{path} is not installed (Debian: apt-get install chromium chromium-driver; ./dev test does it)"
    return None


def start_browser() -> Any:
    """Headless chromium through the system chromedriver: Selenium Manager never downloads anything."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,820"):
        options.add_argument(flag)
    options.add_argument("--force-prefers-reduced-motion")
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def wait_for(condition: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Page:
    """The chat page of one server, in one browser."""

    def __init__(self, driver: Any, url: str) -> None:
        self.driver = driver
        self.url = url.rstrip("/") + "/"

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def open(self, fresh: bool = False, wait_ready: bool = True) -> Page:
        """Load the page (``fresh``: with nothing stored) and record what it does from then on."""
        self.driver.get(self.url)
        if fresh:
            self.js("localStorage.clear()")
            self.driver.get(self.url)
        if wait_ready:
            wait_for(lambda: self.js("return document.body.dataset.ready === 'true'"), "the page to load")
        self.js(RECORDERS)
        return self

    def el(self, selector: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, selector)

    def all(self, selector: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, selector)

    def settings(self, *, max_tokens: int | str = "", temperature: float | str = "", system: str = "") -> None:
        if not self.el("#settings").is_displayed():
            self.el("#toggle-settings").click()
        for selector, value in (("#max-tokens", max_tokens), ("#temperature", temperature), ("#system-prompt", system)):
            field = self.el(selector)
            field.clear()
            if value != "":
                field.send_keys(str(value))
        self.el("#toggle-settings").click()

    def send(self, text: str) -> None:
        from selenium.webdriver.common.keys import Keys

        prompt = self.el("#prompt")
        prompt.send_keys(text)
        asked = len(self.requests("v1/chat/completions"))
        prompt.send_keys(Keys.ENTER)  # Enter sends
        wait_for(lambda: len(self.requests("v1/chat/completions")) > asked, "the page to send the message")

    def streaming(self) -> bool:
        return self.el("#stop").is_displayed()

    def wait_reply_done(self, timeout: float = WAIT_S) -> Any:
        wait_for(
            lambda: not self.streaming() and self.all(".message.assistant[aria-busy='false']"),
            "the reply to end",
            timeout,
        )
        return self.all(".message.assistant")[-1]

    def reply_text(self) -> str:
        return self.js(
            "const r = [...document.querySelectorAll('.message.assistant .content')].pop(); "
            "return r ? r.textContent : ''"
        )

    def requests(self, path: str) -> list[dict]:
        return [r for r in self.js("return window.__requests") if r["url"].endswith(path)]

    def sent_messages(self) -> list[dict]:
        """The messages of the last chat request the page sent."""
        return json.loads(self.requests("v1/chat/completions")[-1]["body"])["messages"]

    def titles(self) -> list[str]:
        # read in one script: the list re-renders after each change, so element handles can go stale
        return self.js("return [...document.querySelectorAll('.conversation-open')].map(b => b.innerText.trim())")
