"""`llmp chat` as a person uses it: on a pseudo-terminal (its controlling terminal, so Ctrl-C
typed there is a SIGINT), against a real `llmp serve` of a tiny model, or with the model run
in-process (`llmp chat MODEL`).

What the server saw is read from its /metrics: an aborted request is counted with
``finished_reason="abort"``, and every request, finished or not, in ``llmp_request_success_total``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmp.testing import LiveServer, SlowSteps, run_llmp, save_tiny_llama, serving

LONG = "400"  # max_tokens of a reply long enough to interrupt (the tiny model has 512 positions)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[=>]|\r")  # readline's and rich's control sequences, and CR


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_llama(path)
    return path


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> SlowSteps:
    return SlowSteps(tmp_path_factory.mktemp("slow-site"))


@pytest.fixture(scope="module")
def server(model_dir: Path, slow: SlowSteps) -> Iterator[LiveServer]:
    # a long reply lasts long whatever the machine while slowed (400 tokens: 20 s at least), so an
    # interrupt typed after its first words finds it running however late the terminal gets it
    with serving(model_dir, "--executor", "slow-steps", env=slow.env) as live:
        yield live


class Terminal:
    """``llmp ARGS`` on a pseudo-terminal: keys typed into it, and its screen output as plain text."""

    def __init__(self, *args: str) -> None:
        import fcntl
        import pty
        import termios

        self.master, slave = pty.openpty()
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLMP_")}
        env |= {"TERM": "xterm", "OPENAI_API_KEY": "", "COLUMNS": "100", "LINES": "40"}

        def controlling_terminal() -> None:  # after setsid: the pty becomes the session's terminal
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.process = subprocess.Popen(
            [sys.executable, "-m", "llmp", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            start_new_session=True,
            preexec_fn=controlling_terminal,
        )
        os.close(slave)
        self.raw = b""
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 4096)
            except OSError:  # the child closed the terminal (EIO)
                return
            if not data:
                return
            with self.lock:
                self.raw += data

    @property
    def screen(self) -> str:
        with self.lock:
            return ANSI.sub("", self.raw.decode(errors="replace"))

    def mark(self) -> int:
        """Where the output is now: ``expect(..., since=mark)`` looks only at what comes after."""
        return len(self.screen)

    def type(self, keys: str) -> int:
        mark = self.mark()
        os.write(self.master, keys.encode())
        return mark

    def expect(self, text: str, since: int = 0, timeout: float = 60) -> str:
        """The output after ``since`` once it holds ``text``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = self.screen[since:]
            if text in seen:
                return seen
            if self.process.poll() is not None:
                time.sleep(0.2)  # the last bytes may still be on their way
                if text in self.screen[since:]:
                    return self.screen[since:]
                break
            time.sleep(0.02)
        raise AssertionError(f"{text!r} not seen; the terminal shows:\n{self.screen[since:]}")

    def send(self, line: str) -> str:
        """Type a message and wait for the reply and the next prompt; the output in between."""
        mark = self.type(line + "\r")
        seen = self.expect("\n> ", since=mark + len(line))
        return seen

    def start_reply(self, line: str, timeout: float = 60) -> int:
        """Type a message and return once the first words of the reply show; where the reply starts."""
        mark = self.type(line + "\r")
        start = mark + len(self.expect(line + "\n", since=mark))
        deadline = time.monotonic() + timeout
        while len(self.screen) == start:
            assert time.monotonic() < deadline, f"no reply to {line!r}:\n{self.screen}"
            time.sleep(0.005)
        return start

    def wait(self, timeout: float = 60) -> int:
        return self.process.wait(timeout)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        os.close(self.master)


@pytest.fixture
def terminals() -> Iterator[Any]:
    opened: list[Terminal] = []

    def start(*args: str) -> Terminal:
        terminal = Terminal(*args)
        opened.append(terminal)
        return terminal

    yield start
    for terminal in opened:
        terminal.close()


def requests_seen(server: LiveServer) -> dict[str, float]:
    """The server's finished requests by finish reason (abort included), from /metrics."""
    import httpx

    counts: dict[str, float] = {}
    for line in httpx.get(f"{server.url}/metrics", timeout=10).text.splitlines():
        if line.startswith("llmp_request_success_total{"):
            reason = re.search(r'finished_reason="([^"]*)"', line)
            counts[reason.group(1) if reason else ""] = float(line.rsplit(" ", 1)[1])
    return counts


def wait_for_requests(server: LiveServer, expected: dict[str, float], timeout: float = 20) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while (seen := requests_seen(server)) != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return seen


def unstreamed_chat(server: LiveServer, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    import httpx

    model = httpx.get(f"{server.api_url}/models").json()["data"][0]["id"]
    response = httpx.post(
        f"{server.api_url}/chat/completions",
        timeout=120,
        json={"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0},
    )
    response.raise_for_status()
    return response.json()["choices"][0]


def started(terminal: Terminal) -> None:
    """Wait for the banner and the first prompt."""
    banner = terminal.expect("> ", timeout=180)
    assert "Ctrl-C stops a reply" in banner and "Ctrl-D or /exit quits" in banner and "/help" in banner


def test_ctrl_c_stops_the_reply_aborts_the_request_and_returns_to_the_prompt(
    server: LiveServer, slow: SlowSteps, terminals: Any
) -> None:
    # the reply would run to its 400 tokens: the interrupt is what ends it
    story = [{"role": "user", "content": "Tell me a long story"}]
    assert unstreamed_chat(server, story, int(LONG))["finish_reason"] == "length"
    chat = terminals("chat", "--url", server.url, "--max-tokens", LONG, "--temperature", "0")
    started(chat)
    assert f"at {server.url}/v1" in chat.screen  # the banner names the server and the model
    before = requests_seen(server)
    with slow.slowed():  # 20 s at least: the interrupt finds the reply running, however late it comes
        reply_start = chat.start_reply("Tell me a long story")
        chat.type("\x03")
        chat.expect("\n> ", since=reply_start)
        assert chat.process.poll() is None
        after = wait_for_requests(server, {**before, "abort": before.get("abort", 0) + 1})
    assert after == {**before, "abort": before.get("abort", 0) + 1}  # aborted, not run to its length
    # back at the prompt: commands work, and the stopped turn is in the history as far as it got
    # the next prompt before Ctrl-D: typed while the terminal is still in cooked mode (before
    # readline takes it), the EOF becomes a NUL that readline reads as C-@ and the REPL never quits
    assert "/save FILE" in chat.send("/help")
    chat.type("\x04")
    assert chat.wait() == 0


def test_text_typed_during_a_reply_is_neither_shown_nor_sent(
    server: LiveServer, terminals: Any, tmp_path: Path
) -> None:
    chat = terminals("chat", "--url", server.url, "--max-tokens", "200", "--temperature", "0")
    started(chat)
    before = requests_seen(server)
    reply_start = chat.start_reply("Count")
    chat.type("typed meanwhile\r")
    chat.expect("\n> ", since=reply_start)
    assert "what was typed during the reply was dropped" in chat.screen  # said, not silently lost
    time.sleep(0.5)  # were the typed line kept, it would be sent now
    saved = tmp_path / "conversation.json"
    mark = chat.type(f"/save {saved}\r")
    chat.expect("Saved 2 messages", since=mark)
    assert "typed meanwhile" not in chat.screen
    messages = json.loads(saved.read_text())["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"] and messages[0]["content"] == "Count"
    assert "typed meanwhile" not in messages[1]["content"]
    chat.type("/exit\r")
    assert chat.wait() == 0
    assert sum(requests_seen(server).values()) == sum(before.values()) + 1


def test_a_fenced_message_of_several_lines_is_sent_whole(server: LiveServer, terminals: Any, tmp_path: Path) -> None:
    # Ollama's """ block: a pasted text of several lines is one message, not one message a line
    chat = terminals("chat", "--url", server.url, "--max-tokens", "4", "--temperature", "0")
    started(chat)
    chat.type('"""Translate to French:\r')
    chat.type("The cat sleeps.\r")
    mark = chat.type('The dog runs."""\r')
    chat.expect("\n> ", since=mark)
    saved = tmp_path / "fenced.json"
    mark = chat.type(f"/save {saved}\r")
    chat.expect("Saved 2 messages", since=mark)
    messages = json.loads(saved.read_text())["messages"]
    assert messages[0] == {"role": "user", "content": "Translate to French:\nThe cat sleeps.\nThe dog runs."}
    chat.type("/exit\r")
    assert chat.wait() == 0


def test_slash_commands_are_never_sent_to_the_model(server: LiveServer, terminals: Any, tmp_path: Path) -> None:
    chat = terminals("chat", "--url", server.url, "--max-tokens", "4", "--temperature", "0", "--system-prompt", "Hi.")
    started(chat)
    before = sum(requests_seen(server).values())
    seen = chat.send("/help")
    for command in ("/exit", "/clear", "/system TEXT", "/save FILE", "Ctrl-C"):
        assert command in seen
    assert "Unknown command /nosuch" in chat.send("/nosuch")
    assert chat.send("   ").strip() == ">"  # an empty line: the prompt again, nothing sent
    first = chat.send("Hello")
    saved = tmp_path / "first.json"
    assert "Saved 3 messages" in chat.send(f"/save {saved}")
    record = json.loads(saved.read_text())
    expected = [{"role": "system", "content": "Hi."}, {"role": "user", "content": "Hello"}]
    reply = unstreamed_chat(server, expected, 4)["message"]["content"]
    assert record["messages"] == [*expected, {"role": "assistant", "content": reply}] and record["model"]
    assert reply in first
    # /system and /clear change what the next request carries
    assert "System prompt set" in chat.send("/system Answer as a pirate.")
    assert "cleared" in chat.send("/clear")
    chat.send("Hello")
    assert "Saved 3 messages" in chat.send(f"/save {saved}")
    expected = [{"role": "system", "content": "Answer as a pirate."}, {"role": "user", "content": "Hello"}]
    reply = unstreamed_chat(server, expected, 4)["message"]["content"]
    assert json.loads(saved.read_text())["messages"] == [*expected, {"role": "assistant", "content": reply}]
    assert "System prompt removed" in chat.send("/system")
    chat.type("/exit\r")
    assert chat.wait() == 0
    # two chat turns and two reference requests: no command reached the model
    assert sum(requests_seen(server).values()) == before + 4


def test_ctrl_c_at_the_prompt_hints_and_ctrl_d_leaves_a_clean_line(server: LiveServer, terminals: Any) -> None:
    chat = terminals("chat", "--url", f"{server.url}/v1/", "--max-tokens", "4")
    started(chat)
    mark = chat.type("half a line\x03")
    chat.expect("Use Ctrl-D or /exit to quit.\n> ", since=mark)
    assert chat.process.poll() is None
    chat.type("\x04")
    assert chat.wait() == 0
    time.sleep(0.2)
    assert chat.screen.endswith("> \n")  # the shell's prompt will start a line of its own


def test_llmp_chat_model_runs_the_model_in_this_process(model_dir: Path, server: LiveServer, terminals: Any) -> None:
    chat = terminals("chat", str(model_dir), "--max-tokens", "6", "--temperature", "0")
    started(chat)
    assert f"{model_dir} in this process" in chat.screen
    reply = unstreamed_chat(server, [{"role": "user", "content": "Hello"}], 6)["message"]["content"]
    assert reply in chat.send("Hello")  # the same template and sampling as the server's
    chat.type("/quit\r")
    assert chat.wait() == 0
    # -q and complete too, with the server's answers
    quick = run_llmp("complete", str(model_dir), "--max-tokens", "6", "--temperature", "0", "-q", "The KV cache")
    import httpx

    model = httpx.get(f"{server.api_url}/models").json()["data"][0]["id"]
    expected = httpx.post(
        f"{server.api_url}/completions",
        timeout=60,
        json={"model": model, "prompt": "The KV cache", "max_tokens": 6, "temperature": 0.0},
    ).json()["choices"][0]["text"]
    assert quick.stdout == expected + "\n"


def test_a_local_model_loads_quietly_like_ollama_run(model_dir: Path, terminals: Any) -> None:
    chat = terminals("chat", str(model_dir), "--max-tokens", "4", "--temperature", "0")
    started(chat)
    before_prompt = chat.screen.rpartition("> ")[0]
    assert f"loading {model_dir}" in before_prompt  # one transient status while the engine starts
    for noise in ("INFO", "llmp.engine", "weights", "KV cache", "starting an engine"):
        assert noise not in before_prompt, before_prompt
    banner = [line for line in before_prompt.splitlines() if line.strip() and "loading" not in line]
    assert len(banner) == 1 and banner[0].startswith("llmp chat: "), before_prompt
    chat.type("\x04")
    assert chat.wait() == 0
    # -q off a terminal: the reply alone; LLMP_LOG_LEVEL set by the user still shows the start-up
    quick = run_llmp("chat", str(model_dir), "--max-tokens", "4", "-q", "Hello")
    assert quick.stdout.strip() and quick.stderr == ""
    told = run_llmp("chat", str(model_dir), "--max-tokens", "4", "-q", "Hello", env={"LLMP_LOG_LEVEL": "info"})
    assert "INFO llmp.engine: engine ready in " in told.stderr and told.stdout == quick.stdout


def test_ctrl_c_stops_a_local_reply_too(model_dir: Path, terminals: Any) -> None:
    chat = terminals("chat", str(model_dir), "--max-tokens", LONG, "--temperature", "0")
    started(chat)
    reply_start = chat.start_reply("Tell me a long story")
    chat.type("\x03")
    chat.expect("\n> ", since=reply_start)
    chat.send("Hello")  # the engine still answers after the abort
    chat.type("\x04")
    assert chat.wait() == 0
