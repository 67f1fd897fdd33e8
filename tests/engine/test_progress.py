"""Start-up is visible: INFO lines for each phase, bars on a terminal (never in a pipe), one summary.

``LLM(...)`` runs in a child process, under a pseudo-terminal or with its output piped, as a user
runs it; ``LLMP_LOG_LEVEL=warning`` quiets it all.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmp.testing import child_environment, save_tiny_llama

pytestmark = pytest.mark.slow

SCRIPT = """
import sys
from llmp import LLM, SamplingParams
llm = LLM(sys.argv[1] if len(sys.argv) > 1 else None, dtype=sys.argv[2] if len(sys.argv) > 2 else "auto",
          max_model_len=256, block_size=4, num_kv_blocks=300)
outputs = llm.generate(["one two", "three four"], SamplingParams(max_tokens=3, ignore_eos=True))
print("GENERATED", len(outputs), flush=True)
"""
ESCAPE = "\x1b["


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama-progress")
    save_tiny_llama(path, vocab_size=400)
    return path


def _env(**extra: str) -> dict[str, str]:
    env = child_environment()
    return {**env, "COLUMNS": "100", **extra}


def run_in_pty(args: list[str], env: dict[str, str], timeout: float = 600) -> str:
    """What a terminal shows of ``args`` (stdout and stderr both on the pseudo-terminal)."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child: exec at once
        os.execve(args[0], args, env)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1)
            if ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
    finally:
        os.close(fd)
        _, status = os.waitpid(pid, 0)
    output = b"".join(chunks).decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, output
    return output


def _lines(terminal: str) -> str:
    """The terminal's text without colour codes, each redrawn line as finally shown."""
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal)
    return "\n".join(line.rsplit("\r", 1)[-1] for line in plain.replace("\r\n", "\n").split("\n"))


def _assert_summary(text: str, model: str, dtype: str) -> None:
    [summary] = [line for line in text.splitlines() if "engine ready in" in line]
    assert f"model {model}, dtype {dtype}, kernels " in summary
    assert re.search(r"kernels [\w-]+ \((AVX|SSE|DEFAULT|NEON|SVE|VSX|ZVECTOR)", summary), summary  # the ISA path
    assert "max model len 256" in summary and "KV cache 300 blocks × 4 = 1200 tokens" in summary


def test_a_terminal_sees_the_gguf_conversion_and_weights_bars_then_the_summary(tmp_path):
    """The default model on a first run: its GGUF config and tokenizer read (a bar), the weights loaded from the
    file (a bar), summarised."""
    env = _env(LLMP_CACHE_DIR=str(tmp_path / "cache"))
    terminal = run_in_pty([sys.executable, "-c", SCRIPT], env)
    text = _lines(terminal)
    assert ESCAPE in terminal  # bars are drawn on a terminal
    assert re.search(r"INFO llmp.model_files: reading the config and tokenizer of \S+\.gguf, once", text)
    assert re.search(r"Reading GGUF: tokenizer .* 3/3 steps", text), text
    assert re.search(r"INFO llmp.model_files: read the config and tokenizer of \S+\.gguf in [\d.]+ s", text)
    assert re.search(r"INFO llmp.engine: loading weights from \S+\.gguf \(1 file\(s\), \d+ MiB\)", text)
    assert re.search(r"Loading weights .* 272/272 tensors", text), text
    assert re.search(r"INFO llmp.engine: weights loaded in [\d.]+ s", text)
    assert "INFO llmp.engine: building the KV cache: 300 blocks of 4 tokens" in text
    [summary] = [line for line in text.splitlines() if "engine ready in" in line]
    assert "(GGUF Q4_1), dtype float32" in summary  # a small GGUF file computes in float32, as llama.cpp does
    assert "matmul" not in summary  # whether the CPU multiplies bf16 itself is said only for bf16/fp16
    assert re.search(r"Processed prompts .* 2/2", text)  # LLM.generate's bar, on stderr
    assert "GENERATED 2" in text


def test_a_terminal_sees_the_phases_and_the_summary_in_order(model_dir):
    text = _lines(run_in_pty([sys.executable, "-c", SCRIPT, str(model_dir), "float32"], _env()))
    phases = ["loading weights from", "Loading weights", "weights loaded in", "building the KV cache", "engine ready"]
    positions = [text.find(phase) for phase in phases]
    assert -1 not in positions and positions == sorted(positions), text
    _assert_summary(text, str(model_dir), "float32")


def test_a_pipe_gets_the_info_lines_and_summary_but_no_bar(model_dir):
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(model_dir), "float32"], capture_output=True, text=True, env=_env()
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "GENERATED 2\n"  # stdout is the program's: no bar, no log line
    assert ESCAPE not in result.stderr and "━" not in result.stderr
    assert "INFO llmp.engine: loading weights from" in result.stderr
    assert "INFO llmp.engine: building the KV cache" in result.stderr
    _assert_summary(result.stderr, str(model_dir), "float32")


def test_a_pipe_gets_the_bars_when_asked(model_dir):
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(model_dir), "float32"],
        capture_output=True,
        text=True,
        env=_env(LLMP_PROGRESS="1"),
    )
    assert result.returncode == 0, result.stderr
    assert re.search(r"Loading weights .* 21/21 tensors", _lines(result.stderr))
    assert result.stdout == "GENERATED 2\n"


def test_log_level_warning_quiets_start_up_even_on_a_terminal(model_dir):
    terminal = run_in_pty([sys.executable, "-c", SCRIPT, str(model_dir), "float32"], _env(LLMP_LOG_LEVEL="warning"))
    assert _lines(terminal).strip() == "GENERATED 2"
    assert ESCAPE not in terminal
