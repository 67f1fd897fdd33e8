"""Constants and helpers shared by the OpenAI front-end tests (conftest puts this folder on sys.path)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx

from llmp.testing import assert_openai_error as assert_error  # noqa: F401  (the tests import it from here)

API_KEY = "Secret-Key-42"  # mixed case, so its lower- and upper-cased forms are wrong keys
ALIAS = "alias"
BODY_LIMIT = 64 * 1024
MAX_N = 4
SHORT_CONTEXT = 64
OK_ORIGIN = "https://ok.example"
ROOT_PATH = "/llm"


class TinyLlama:
    def __init__(self, path: Path, model: Any) -> None:
        self.path, self.model, self.name = path, model, str(path)
        self._tokenizer: Any = None

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.path)
        return self._tokenizer

    def chat_ids(self, messages: list[dict]) -> list[int]:
        """Transformers' chat template applied (with the generation prompt), then tokenized without specials."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tokenizer.encode(text, add_special_tokens=False)


GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}


def extra(obj: Any, name: str) -> Any:
    """A vendor field of an SDK object (``token_ids``, ``stop_reason`` ...)."""
    data = obj if isinstance(obj, dict) else obj.model_dump()
    return data.get(name)


def sse_events(response: httpx.Response) -> list[dict]:
    """The JSON payloads of an SSE response; it must end with ``[DONE]``."""
    data = [line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")]
    assert data and data[-1] == "[DONE]", response.text[-500:]
    return [json.loads(d) for d in data[:-1]]


def metrics(http_client: httpx.Client, path: str = "/metrics") -> dict[str, float]:
    """``/metrics`` as {'name{labels}': value} (see ``metric`` to look one up)."""
    text = http_client.get(path).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, _, value = line.rpartition(" ")
        out[key] = float(value)
    return out


def metric(values: dict[str, float], name: str, **labels: str) -> float:
    """The sum of ``name`` over every label set that includes ``labels``."""
    total = 0.0
    for key, value in values.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if all(found.get(k) == v for k, v in labels.items()):
            total += value
    return total


def wait_idle(http_client: httpx.Client, timeout: float = 10.0, path: str = "/metrics") -> float:
    """Poll until no request runs or waits; the seconds it took."""
    start = time.monotonic()
    while True:
        values = metrics(http_client, path)
        if metric(values, "llmp_num_requests_running") == 0 and metric(values, "llmp_num_requests_waiting") == 0:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(
                f"requests still running after {timeout} s: "
                f"{metric(values, 'llmp_num_requests_running')} running, "
                f"{metric(values, 'llmp_num_requests_waiting')} waiting"
            )
        time.sleep(0.02)
