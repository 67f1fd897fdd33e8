"""Every fenced block of README.md and docs/*.md, read and run as a reader would (tests/test_docs*.py).

The rules, which the docs' authors follow:

- ```` ```python ```` blocks run in one process per page, in order, each in a fresh namespace
  (so a block that forgets an import fails); ``setup`` makes a block's namespace the start of
  every later block of the page, ``continues`` runs a block in the previous one's namespace.
  A block's ``test_*`` functions that take no argument are then called, as pytest would.
- ```` ```bash ````, ```` ```sh ```` and ```` ```console ```` blocks run command by command in bash
  (a console block's commands are its ``$ `` lines), with ``.venv/bin`` first on ``PATH``, no
  ``LLMP_*`` variables (but the test run's ``LLMP_OMP_SPIN``, 0 unless set, as ``./dev test`` has
  it), ``COLUMNS=80`` and stdin empty, in a scratch directory that links to every top-level entry
  of the checkout. A console command's shown output (the lines up to the next ``$``) must each be
  a whole line of what it prints, whitespace aside: ``...`` matches anything, a duration
  (``4.6 s``) any duration, ``/path/to/`` any path; lines starting ``> `` are typed input, given on
  stdin. A command exits 0, unless its shown output has an ``error:`` line; then it must fail.
- Servers: ``llmp serve`` (``.venv/bin/llmp serve``, ``./dev serve``) runs until it prints its
  ready line (so ``--port 0`` works), its output is compared, and it must exit 0 on SIGTERM; one
  ending in ``&`` keeps running until the block ends and serves the block's later commands. One
  server of the default model with default options is shared by the test module: it is what a
  plain ``llmp serve`` (or ``./dev serve``, or one ending in ``&``) stands for, started by the
  first, and what blocks that only talk to a server talk to (checked for exit 0 when the module
  ends). A foreground server command already run and passed in the module (README and
  docs/cli.md share some) is checked against that run's output. ``127.0.0.1:8000``,
  ``localhost:8000`` and ``gpu-box:8000`` stand for the block's server, whose port is also in
  ``LLMP_PORT`` and whose URL is in ``LLMP_URL`` (for commands that talk to a server; not for
  ``llmp chat MODEL``, which runs its own engine).
- Placeholders are real files in the scratch directory, made when a block first names them:
  ``path/to/hf-dir`` a tiny Llama, ``MODEL`` a tiny Qwen3, ``path/to/minilm`` the packaged
  all-MiniLM-L6-v2, ``path/to/cross-encoder`` a tiny one-label BERT cross-encoder,
  ``path/to/classifier`` a tiny BERT classifier (labels negative, neutral, positive),
  ``path/to/qwen3-reranker`` a tiny Qwen3 causal LM with "no" and "yes" tokens,
  ``path/to/reward-model`` a tiny one-label Llama classifier, ``prompts.txt`` two prompts;
  ``$KEY`` is set. A block's annotations name placeholders too (``server path/to/classifier``).
- The blocks of docs/*.md that start engines or talk to a server are the tests of
  tests/test_docs_engines.py, the others (README's included) of tests/test_docs.py
  (``in_engines_module``), so two pytest-xdist workers share them; each module has its own
  scratch directory and shared server.
- Any other block, and any exception to the above, is an HTML comment right above the fence::

      <!-- docs-test: ACTION [ARGUMENT][: REASON] -->

  ``skip: REASON`` (not run), ``checked-by TEST: REASON`` (another test of tests/test_docs.py runs
  it), ``help-only [PREFIX]: REASON`` (commands starting with PREFIX, or all, run with ``--help``,
  which must list every flag they use), ``with-plugin PROJECT: REASON`` (PROJECT is installed in a
  throwaway ``--target`` on ``PYTHONPATH`` instead of the block's ``pip install``), ``server ARGS``
  (the block's server is ``llmp serve ARGS``; for a python block, on any free port, started
  before the page's blocks run and stopped after), ``setup``, ``continues``, ``pytest PROJECT`` (the
  block is a test module run with pytest in a copy of PROJECT), ``file PATH`` (the block is PATH
  verbatim), ``excerpt PATH`` (every line of the block is a line of PATH), ``synopsis`` (a usage
  line: its command's ``--help`` lists every flag it shows), ``tree`` (every path it shows exists),
  ``output-of COMMAND`` (a JSON example: COMMAND prints JSON with the same keys and these values).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN_LANGUAGES = {"python", "bash", "sh", "console"}
ACTIONS_NEEDING_REASON = {"skip", "checked-by", "help-only", "with-plugin"}
ACTIONS = ACTIONS_NEEDING_REASON | {"server", "setup", "continues", "pytest", "file", "excerpt", "synopsis", "tree"}
ACTIONS |= {"output-of"}
ANNOTATION = re.compile(r"^<!--\s*docs-test:\s*(?P<action>[\w-]+)\s*(?P<rest>.*?)\s*-->\s*$")
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\s*$")
STAND_INS = re.compile(r"\b(?:127\.0\.0\.1|localhost|gpu-box):8000\b")
SERVER_COMMAND = re.compile(r"^(?:\S+=\S*\s+)*(?:\.venv/bin/llmp|llmp|\./dev|python -m llmp)\s+serve\b")
CLIENT_COMMAND = re.compile(r"\bllmp\s+(?:chat|complete|bench serve)\b|\bcurl\b|:8000\b")
COMMAND_TIMEOUT = 180


@dataclass(frozen=True)
class Annotation:
    action: str
    argument: str
    reason: str


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    annotations: tuple[Annotation, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    def annotation(self, action: str) -> Annotation | None:
        return next((a for a in self.annotations if a.action == action), None)


def parse_annotation(line: str) -> Annotation | None:
    match = ANNOTATION.match(line.strip())
    if not match:
        return None
    rest = match["rest"]
    argument, _, reason = rest.partition(": ") if ": " in rest else (rest.removesuffix(":"), "", "")
    return Annotation(match["action"], argument.strip(), reason.strip())


def page_blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    blocks, index = [], 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        annotations, above = [], index - 1
        while above >= 0 and (annotation := parse_annotation(lines[above])):
            annotations.insert(0, annotation)
            above -= 1
        text = "\n".join(lines[index + 1 : end]) + "\n"
        blocks.append(Block(page, index + 1, fence["lang"], text, tuple(annotations)))
        index = end + 1
    return blocks


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in page_blocks(page)]


def annotation_problems(block: Block) -> list[str]:
    problems = [f"unknown action {a.action!r}" for a in block.annotations if a.action not in ACTIONS]
    problems += [
        f"{a.action} needs a reason" for a in block.annotations if a.action in ACTIONS_NEEDING_REASON and not a.reason
    ]
    handled = block.lang in RUN_LANGUAGES or any(
        a.action in ACTIONS - {"setup", "continues"} for a in block.annotations
    )
    if not handled:
        problems.append(f"a ```{block.lang} block that is neither run nor annotated")
    return problems


# -- output comparison --------------------------------------------------------------------------


def normalise(text: str) -> str:
    return "\n".join(" ".join(line.split()) for line in text.splitlines())


def expected_line_pattern(line: str) -> re.Pattern[str]:
    """A shown output line as a pattern: `...`, durations and `/path/to/` match anything."""
    pattern = ""
    for piece in re.split(r"(\.\.\.|/path/to/(?:repo/)?|\d+(?:\.\d+)? (?:s|ms)\b)", " ".join(line.split())):
        if piece == "...":
            pattern += r"[^\n]*"
        elif piece.startswith("/path/to/"):
            pattern += r"\S*/"
        elif re.fullmatch(r"\d+(?:\.\d+)? (?:s|ms)", piece):
            pattern += r"\d+(?:\.\d+)? " + piece.split()[1]
        else:
            pattern += re.escape(piece)
    return re.compile(pattern)


def missing_lines(shown: list[str], printed: str) -> list[str]:
    """The shown lines that are no whole line of what was printed."""
    printed_lines = normalise(printed).splitlines()
    return [
        line
        for line in shown
        if line.strip() not in ("", "...")
        and not any(expected_line_pattern(line).fullmatch(actual) for actual in printed_lines)
    ]


def expects_failure(shown: list[str]) -> bool:
    return any(re.match(r"\s*(?:\S+: )?error:", line) for line in shown)


# -- the scratch directory and its servers ------------------------------------------------------

READY = re.compile(r"^llmp: ready in .*? at https?://[^\s:/]+:(?P<port>\d+)", re.MULTILINE)


def free_port() -> int:
    from llmp.testing import free_port as pick

    return pick()


@dataclass
class Process:
    """A command started in a session of its own, so everything it leaves running can be stopped."""

    popen: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = COMMAND_TIMEOUT) -> int:
        """The port of the ``llmp serve`` this command started, once its ready line is printed
        (after its warm-up request: it then serves), so ``--port 0`` works as a reader sees it."""
        deadline = time.monotonic() + timeout
        while not (match := READY.search(self.output())):
            if self.popen.poll() is not None and not self.background_alive():
                raise AssertionError(f"the server exited with {self.popen.returncode}:\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no ready line in {timeout:.0f} s:\n{self.output()}")
            time.sleep(0.1)
        return int(match["port"])

    def background_alive(self) -> bool:
        try:
            os.killpg(self.popen.pid, 0)
            return True
        except ProcessLookupError:
            return False

    def terminate(self, timeout: float = 60) -> int | None:
        """SIGTERM to the command itself (the server drains its engine), then anything left in its session."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(1)
        return self.popen.wait(10) if self.popen.poll() is None else self.popen.returncode


def _tiny_llama(path: Path) -> None:
    from llmp.testing import save_tiny_llama

    save_tiny_llama(path)


def _tiny_qwen3(path: Path) -> None:
    from llmp.testing import save_tiny_model

    save_tiny_model(path, "Qwen3ForCausalLM")


def _minilm(path: Path) -> None:
    from llmp.testing import minilm_dir

    path.symlink_to(minilm_dir())


def _cross_encoder(path: Path) -> None:
    from llmp.testing import save_tiny_cross_encoder

    save_tiny_cross_encoder(path)  # BertForSequenceClassification, one label


SENTIMENT = {0: "negative", 1: "neutral", 2: "positive"}


def _classifier(path: Path) -> None:
    from llmp.testing import save_tiny_cross_encoder

    save_tiny_cross_encoder(path, id2label=SENTIMENT, label2id={v: k for k, v in SENTIMENT.items()})


def _qwen3_reranker(path: Path) -> None:
    """A tiny Qwen3ForCausalLM whose tokenizer has the "no" and "yes" tokens Qwen3-Reranker scores with."""
    from llmp.testing import save_tiny_model, tiny_tokenizer

    save_tiny_model(path, "Qwen3ForCausalLM")
    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens(["no", "yes"])
    tokenizer.save_pretrained(path)


def _reward_model(path: Path) -> None:
    from llmp.testing import save_tiny_model

    save_tiny_model(path, "LlamaForSequenceClassification", num_labels=1)


# placeholder -> how to make it; each is made the first time a block names it
PLACEHOLDERS = {
    "path/to/hf-dir": _tiny_llama,
    "MODEL": _tiny_qwen3,
    "path/to/minilm": _minilm,
    "path/to/cross-encoder": _cross_encoder,
    "path/to/classifier": _classifier,
    "path/to/qwen3-reranker": _qwen3_reranker,
    "path/to/reward-model": _reward_model,
    "prompts.txt": lambda path: path.write_text("The capital of France is\nOnce upon a time\n"),
}


@dataclass
class Scratch:
    """The directory blocks run in: links to the checkout, the placeholders, the shared server."""

    root: Path
    shared: Process | None = None
    shared_port: int | None = None
    started: list[Process] = field(default_factory=list)
    served: dict[tuple[str, ...], tuple[str, int]] = field(default_factory=dict)  # foreground servers that passed

    @classmethod
    def create(cls, root: Path) -> Scratch:
        for entry in REPO.iterdir():
            if entry.name not in (".git",):
                (root / entry.name).symlink_to(entry)
        return cls(root)

    def provide(self, text: str) -> None:
        """Make the placeholders ``text`` names (models are built only for the blocks that use them)."""
        for name, make in PLACEHOLDERS.items():
            path = self.root / name
            if re.search(rf"(?<![\w/.-]){re.escape(name)}(?![\w/-])", text) and not os.path.lexists(path):
                path.parent.mkdir(parents=True, exist_ok=True)
                make(path)

    def env(
        self, server_port: int | None = None, client_port: int | None = None, extra: dict[str, str] | None = None
    ) -> dict[str, str]:
        # the test run's own process setting passes (./dev test sets LLMP_OMP_SPIN=0); no option does
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLMP_") or k == "LLMP_OMP_SPIN"}
        # several engines share the cores here, as in ./dev test: no spinning OpenMP threads
        env.setdefault("LLMP_OMP_SPIN", "0")
        env.update(PATH=f"{self.root / '.venv' / 'bin'}:{env['PATH']}", COLUMNS="80", KEY="secret")
        env.pop("VIRTUAL_ENV", None)
        if server_port is not None:
            env["LLMP_PORT"] = str(server_port)
        if client_port is not None:
            env["LLMP_URL"] = f"http://127.0.0.1:{client_port}/v1"
        env.update(extra or {})
        return env

    def start(self, command: str, env: dict[str, str], log_name: str) -> Process:
        log = self.root / f".{log_name}.log"
        with open(log, "wb") as sink:
            popen = subprocess.Popen(
                ["bash", "-c", command],
                cwd=self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        process = Process(popen, log)
        self.started.append(process)
        return process

    def shared_server(self, command: str = "llmp serve") -> int:
        """The port of the one ``llmp serve`` of the default model with default options, started
        on first use, by the first such command a block runs (``./dev serve``, ``llmp serve &``
        ...) or for the first block that only talks to a server."""
        if self.shared is None:
            port = free_port()
            text = BACKGROUND.sub("", command.split(" #", 1)[0]).strip()
            self.shared = self.start(exec_text(text), self.env(port), "shared-server")
            self.shared_port = self.shared.wait_ready()
        return self.shared_port

    def close(self) -> list[str]:
        """Stop everything; what went wrong on the way (the shared server must exit 0 on SIGTERM)."""
        problems = []
        if self.shared is not None and (status := self.shared.terminate(timeout=30)) != 0:
            problems.append(f"the shared server exited {status} on SIGTERM:\n{self.shared.output()[-4000:]}")
        for process in self.started:
            process.terminate(timeout=30)
        return problems


# -- shell blocks -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    text: str
    shown: list[str]  # output lines the doc shows
    typed: list[str]  # input lines (`> ` lines)


def block_commands(block: Block) -> list[Command]:
    if block.lang != "console":
        joined = block.text.replace("\\\n", " ")
        return [
            Command(line, [], []) for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
        ]
    commands: list[Command] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            commands.append(Command(line[2:], [], []))
        elif commands and line.startswith("> "):
            commands[-1].typed.append(line[2:])
        elif commands:
            commands[-1].shown.append(line)
    return commands


def command_words(command: str) -> list[str]:
    return shlex.split(command, comments=True)


def flags_of(words: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for w in words if re.fullmatch(r"--?[a-zA-Z][\w-]*(=.*)?", w)]


def missing_flags(flags: list[str], help_text: str) -> list[str]:
    help_text = re.sub(r"--\[no-\]([\w-]+)", r"--\1 --no-\1", help_text)  # a boolean pair, written once
    return [flag for flag in flags if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text)]


_HELP: dict[tuple[str, ...], str] = {}


def help_of(words: list[str], scratch: Scratch) -> str:
    """``--help`` of the command the words start (up to the first option), once per command."""
    command = tuple(itertools.takewhile(lambda word: not word.startswith("-"), words))
    if command not in _HELP:
        result = subprocess.run(
            shlex.join([*command, "--help"]),
            shell=True,
            executable="/bin/bash",
            cwd=scratch.root,
            env=scratch.env(extra={"COLUMNS": "300"}),
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
        )
        assert result.returncode == 0, f"{shlex.join(command)} --help exited {result.returncode}:\n{result.stderr}"
        _HELP[command] = result.stdout + result.stderr
    return _HELP[command]


def check_help_only(command: Command, scratch: Scratch) -> None:
    words = command_words(command.text)
    missing = missing_flags(flags_of(words), help_of(words, scratch))
    assert not missing, f"{command.text}: --help lists none of {missing}"


BACKGROUND = re.compile(r"(?<!&)&(?!&)")
DEFAULT_SERVER = re.compile(r"^(?:\.venv/bin/llmp|llmp|\./dev|python -m llmp)\s+serve\s*&?\s*(?:#.*)?$")
LOCAL_CLIENT = re.compile(r"\bllmp\s+(?:chat|complete)\s+[\w./~]")  # `llmp chat MODEL`: an engine of its own


def is_server_command(command: Command) -> bool:
    """A command that starts a server; not ``llmp serve --help``, nor one the doc shows refused."""
    if "--help" in command_words(command.text) or expects_failure(command.shown):
        return False
    return bool(SERVER_COMMAND.match(command.text) or BACKGROUND.search(command.text))


def is_default_server(command: Command) -> bool:
    """``llmp serve`` of the default model with default options: the shared server serves it."""
    return bool(DEFAULT_SERVER.match(command.text.strip()))


def is_client(command: Command) -> bool:
    """A command that talks to the block's server (or the shared one)."""
    return bool(CLIENT_COMMAND.search(command.text)) and not LOCAL_CLIENT.search(command.text)


def help_only_command(command: Command, help_only: Annotation | None) -> bool:
    return bool(help_only) and shlex.join(command_words(command.text)).startswith(help_only.argument)


def rewrite(text: str, port: int | None) -> str:
    return STAND_INS.sub(f"127.0.0.1:{port}", text) if port is not None else text


def run_shell_block(block: Block, scratch: Scratch) -> None:
    commands = block_commands(block)
    assert commands, "no command in the block"
    help_only = block.annotation("help-only")
    scratch.provide(block.text + "".join(f" {a.argument}\n" for a in block.annotations))
    extra: dict[str, str] = {}
    if plugin := block.annotation("with-plugin"):
        from llmp.testing import pip_install_target

        target = scratch.root / f".site-{block.line}"
        pip_install_target(target, REPO / plugin.argument)
        extra["PYTHONPATH"] = str(target)
    run = [c for c in commands if not help_only_command(c, help_only)]
    own = block.annotation("server") or any(is_server_command(c) and not is_default_server(c) for c in run)
    server_port = free_port() if own else None  # the block's own servers listen here (LLMP_PORT)
    client_port = None  # the server the block's clients talk to, once known
    mine: list[Process] = []
    try:
        if server := block.annotation("server"):
            mine.append(
                scratch.start(f"exec llmp serve {server.argument}", scratch.env(server_port), f"server-{block.line}")
            )
            client_port = mine[-1].wait_ready()
        for index, command in enumerate(commands):
            if help_only_command(command, help_only):
                check_help_only(command, scratch)
            elif plugin and "pip install" in command.text:
                continue
            elif is_default_server(command):
                port = scratch.shared_server(command.text)
                check_shown(command, scratch.shared.output(), port)
                client_port = port if BACKGROUND.search(command.text) else client_port
            elif is_server_command(command):
                env = scratch.env(server_port, client_port, extra)
                process, port = run_server_command(block, index, command, scratch, env)
                mine += [process] if process else []
                client_port = port if BACKGROUND.search(command.text) else client_port
            else:
                port = client_port
                if port is None and is_client(command):
                    port = scratch.shared_server()  # as a reader's server, running in another terminal
                run_command(
                    command, scratch, scratch.env(server_port, port if is_client(command) else None, extra), port
                )
    finally:
        for process in mine:
            process.terminate(timeout=30)


def exec_text(command: str) -> str:
    """``command`` run by bash's ``exec``, so that SIGTERM reaches it (``exec env`` for ``VAR=value cmd``)."""
    return f"exec env {command}" if re.match(r"\w+=", command) else f"exec {command}"


def check_shown(command: Command, printed: str, port: int | None) -> None:
    missing = missing_lines([rewrite(line, port) for line in command.shown], printed)
    assert not missing, f"{command.text}: printed no line like {missing}:\n{printed}"


def run_server_command(
    block: Block, index: int, command: Command, scratch: Scratch, env: dict[str, str]
) -> tuple[Process | None, int]:
    """Start a server command and check what it shows; one in the foreground is then stopped and
    must exit 0. The same foreground command seen before (README and docs/cli.md share some)
    is checked against that run's output instead of being run again."""
    text = rewrite(command.text, int(env["LLMP_PORT"]))
    background = bool(BACKGROUND.search(text))
    key = tuple(os.path.expandvars(word) for word in command_words(command.text.replace(".venv/bin/llmp", "llmp")))
    if not background and key in scratch.served:
        output, port = scratch.served[key]
        check_shown(command, output, port)
        return None, port
    process = scratch.start(text if background else exec_text(text), env, f"block-{block.line}-{index}")
    if background:
        process.popen.wait(COMMAND_TIMEOUT)
    port = process.wait_ready()
    check_shown(command, process.output(), port)
    if not background:
        status = process.terminate()
        assert status == 0, f"{command.text}: exited {status} on SIGTERM:\n{process.output()}"
        scratch.served[key] = (process.output(), port)
    return process, port


# a `grep` of a log that a background server writes is read again for this long until its lines are there:
# the server may write a request's last line just after the client has its response
LOG_WAIT = 10.0


def run_command(command: Command, scratch: Scratch, env: dict[str, str], port: int | None) -> None:
    stdin = "".join(f"{line}\n" for line in command.typed)
    deadline = time.monotonic() + (LOG_WAIT if command.text.startswith("grep ") else 0.0)
    while True:
        result = subprocess.run(
            ["bash", "-c", rewrite(command.text, port)],
            cwd=scratch.root,
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
        )
        printed = result.stdout + result.stderr
        shown = [rewrite(line, port) for line in command.shown]
        if time.monotonic() >= deadline or not missing_lines(shown, printed):
            break
        time.sleep(0.5)
    if expects_failure(command.shown):
        assert result.returncode != 0, f"{command.text}: the doc shows an error, but it exited 0:\n{printed}"
    else:
        assert result.returncode == 0, f"{command.text}: exited {result.returncode}:\n{printed}"
    check_shown(command, printed, port)


# -- python blocks ------------------------------------------------------------------------------

RUNNER = r"""
import contextlib, inspect, io, json, sys, traceback
blocks = json.load(sys.stdin)
results, previous, base = {}, {}, {"__name__": "__main__"}
for block in blocks:
    namespace = previous if block["continues"] else dict(base)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(block["code"], block["id"], "exec"), namespace)
            for name, value in list(namespace.items()):
                if name.startswith("test_") and inspect.isfunction(value) and value.__code__.co_filename == block["id"]:
                    if not inspect.signature(value).parameters:
                        value()
        results[block["id"]] = {"ok": True, "stdout": out.getvalue()}
    except BaseException:
        results[block["id"]] = {"ok": False, "stdout": out.getvalue(), "error": traceback.format_exc()}
    previous = namespace
    if block["setup"]:
        base = dict(namespace)
with open(sys.argv[1], "w") as sink:
    json.dump(results, sink)
"""


def python_blocks(page: Path) -> list[Block]:
    return [
        b
        for b in page_blocks(page)
        if b.lang == "python" and not any(b.annotation(a) for a in ("skip", "checked-by", "pytest", "file", "excerpt"))
    ]


def run_python_page(page: Path, scratch: Scratch) -> dict[str, dict]:
    """Run a page's python blocks in one process; each block's result by block id."""
    blocks = python_blocks(page)
    if not blocks:
        return {}
    scratch.provide("".join(b.text + "".join(f" {a.argument}\n" for a in b.annotations) for b in blocks))
    plain = [b for b in blocks if not b.annotation("server")]
    port = scratch.shared_server() if any(STAND_INS.search(b.text) for b in plain) else None
    servers: dict[str, Process] = {}  # ``server ARGS`` of a block -> its server, for the page's run
    ports: dict[str, int] = {}
    try:
        for block in blocks:
            if (server := block.annotation("server")) and server.argument not in servers:
                process = scratch.start(
                    f"exec llmp serve {server.argument} --port 0", scratch.env(), f"python-server-{block.line}"
                )
                servers[server.argument] = process
                ports[server.argument] = process.wait_ready()
        payload = [
            {
                "id": b.id,
                "code": rewrite(b.text, ports[b.annotation("server").argument] if b.annotation("server") else port),
                "continues": bool(b.annotation("continues")),
                "setup": bool(b.annotation("setup")),
            }
            for b in blocks
        ]
        results_path = scratch.root / f".python-{page.stem}.json"
        result = subprocess.run(
            [str(REPO / ".venv" / "bin" / "python"), "-c", RUNNER, str(results_path)],
            cwd=scratch.root,
            env=scratch.env(client_port=port),
            input=json.dumps(payload),
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        for process in servers.values():
            process.terminate(timeout=30)
    if not results_path.exists():
        raise AssertionError(f"the runner of {page.name} failed ({result.returncode}):\n{result.stderr}")
    results = json.loads(results_path.read_text())
    for value in results.values():
        value.setdefault("log", result.stderr[-4000:])
    return results


def run_pytest_block(block: Block, scratch: Scratch) -> None:
    project = scratch.root / f".project-{block.line}"
    shutil.copytree(REPO / block.annotation("pytest").argument, project)
    (project / "tests").mkdir(exist_ok=True)
    (project / "tests" / "test_from_docs.py").write_text(block.text)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_from_docs.py"],
        cwd=project,
        env=scratch.env(),
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- blocks that are not run --------------------------------------------------------------------


def check_file(block: Block) -> None:
    annotation = block.annotation("file") or block.annotation("excerpt")
    actual = (REPO / annotation.argument).read_text()
    if annotation.action == "file":
        assert block.text.rstrip("\n") == actual.rstrip("\n"), f"the block is not {annotation.argument}"
    else:
        lines = set(actual.splitlines())
        missing = [line for line in block.text.splitlines() if line.strip() and line not in lines]
        assert not missing, f"not lines of {annotation.argument}: {missing}"


def check_synopsis(block: Block, scratch: Scratch) -> None:
    words = block.text.split()
    command = []
    for word in words:
        if word.startswith(("[", "-")) or word.isupper():
            break
        command.append(word)
    flags = re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", block.text[len(" ".join(command)) :])
    missing = missing_flags(flags, help_of(command, scratch))
    assert not missing, f"`{' '.join(command)} --help` does not list {missing}"


def check_tree(block: Block) -> None:
    """Every path of a layout block exists: at the start of a line, nested by indentation."""
    stack: list[tuple[int, str]] = []
    missing = []
    for line in block.text.splitlines():
        if not line.strip():
            continue
        indent, name = len(line) - len(line.lstrip()), line.split()[0]
        stack = [(i, p) for i, p in stack if i < indent]
        path = (stack[-1][1] if stack else "") + name
        if not list(REPO.glob(re.sub(r"<[^>]+>", "*", path).rstrip("/"))):
            missing.append(path)
        if name.endswith("/"):
            stack.append((indent, path))
    assert not missing, f"no such paths: {missing}"


def json_matches(shown: object, actual: object) -> bool:
    if isinstance(shown, dict):
        return (
            isinstance(actual, dict)
            and shown.keys() == actual.keys()
            and all(json_matches(v, actual[k]) for k, v in shown.items())
        )
    if isinstance(shown, list):
        return isinstance(actual, list) and all(any(json_matches(s, a) for a in actual) for s in shown)
    if isinstance(shown, str) and "/path/to/" in shown:
        return isinstance(actual, str) and bool(expected_line_pattern(shown).fullmatch(actual))
    return shown == actual


def check_output_of(block: Block, scratch: Scratch) -> None:
    command = block.annotation("output-of").argument
    text = re.sub(r"^\s*\.\.\.\s*$\n", "", block.text, flags=re.MULTILINE)
    shown = json.loads(re.sub(r",(\s*[\]}])", r"\1", text))
    result = subprocess.run(
        ["bash", "-c", command], cwd=scratch.root, env=scratch.env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    actual = json.loads(result.stdout)
    assert json_matches(shown, actual), f"`{command}` prints no such JSON:\n{json.dumps(actual, indent=1)[:6000]}"


# -- the test modules ---------------------------------------------------------------------------

ENGINE_IN_PYTHON = re.compile(r"\b(?:LLM|AsyncLLM)\(")
ENGINE_COMMAND = re.compile(r"\bllmp\s+(?:mcp|bench\s+(?:throughput|latency))\b")
NOT_SHELL = ("skip", "checked-by", "synopsis", "tree", "file", "excerpt", "output-of", "pytest")


def runs_engines(block: Block) -> bool:
    """Whether the block starts engines or talks to a server. Those of docs/*.md are the tests of
    tests/test_docs_engines.py, all other blocks (README's engines, and every quick block) of
    tests/test_docs.py: two modules of about equal time, which pytest-xdist's ``--dist loadfile``
    gives a worker each. A page's python blocks run in one process, so they go together."""
    if block.lang == "python":
        page = python_blocks(block.page)
        return block in page and any(ENGINE_IN_PYTHON.search(b.text) or STAND_INS.search(b.text) for b in page)
    if block.lang not in RUN_LANGUAGES or any(block.annotation(a) for a in NOT_SHELL):
        return False
    help_only = block.annotation("help-only")
    run = [c for c in block_commands(block) if not help_only_command(c, help_only)]
    return bool(block.annotation("server")) or any(
        is_server_command(c) or CLIENT_COMMAND.search(c.text) or ENGINE_COMMAND.search(c.text) for c in run
    )


def in_engines_module(block: Block) -> bool:
    """Whether the block is a test of tests/test_docs_engines.py rather than tests/test_docs.py."""
    return block.page.name != "README.md" and runs_engines(block)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scratch]:
    """The directory a test module's blocks run in, and the servers they start."""
    scratch = Scratch.create(tmp_path_factory.mktemp("docs"))
    yield scratch
    problems = scratch.close()
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def python_results(scratch: Scratch) -> Callable[[Block], dict]:
    """A python block's result; a page's blocks run together the first time one is asked for."""
    cache: dict[Path, dict[str, dict]] = {}

    def result(block: Block) -> dict:
        if block.page not in cache:
            cache[block.page] = run_python_page(block.page, scratch)
        return cache[block.page][block.id]

    return result


def run_block(block: Block, scratch: Scratch, python_results: Callable[[Block], dict]) -> None:
    """Run or check one block as its annotations say."""
    for action in ("skip", "checked-by"):
        if annotation := block.annotation(action):
            pytest.skip(f"{action} {annotation.argument}: {annotation.reason}".replace(" : ", ": "))
    if block.annotation("file") or block.annotation("excerpt"):
        check_file(block)
    elif block.annotation("synopsis"):
        check_synopsis(block, scratch)
    elif block.annotation("tree"):
        check_tree(block)
    elif block.annotation("output-of"):
        check_output_of(block, scratch)
    elif block.annotation("pytest"):
        run_pytest_block(block, scratch)
    elif block.lang == "python":
        result = python_results(block)
        assert result["ok"], f"{result['error']}\nprinted:\n{result['stdout']}\nstderr:\n{result['log']}"
    else:
        run_shell_block(block, scratch)
