"""Bad options stop every command before it starts anything: one ``llmp: error:`` line naming the
option as it was given (flag, ``LLMP_*`` variable or YAML key), status 2, well under an engine's start.

Each case runs the real CLI in a subprocess (``python -m llmp``).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from llmp.cli.option_checks import option_problems
from llmp.config import load_records
from llmp.model_files.resolve import model_context_len
from llmp.options import EngineConfig, FrontendOptions, ServerOptions
from llmp.testing import run_llmp, save_tiny_llama

FAST_S = 5.0  # the engine alone takes longer to start; a refusal must come before anything starts

# (arguments, the start of the message after "llmp: error: ")
COMMAND_LINE = [
    (["serve", "--port", "99999"], "--port must be between 0 and 65535, got 99999"),
    (["serve", "--port", "-1"], "--port must be between 0 and 65535, got -1"),
    (["serve", "--port", "http"], "--port must be an integer, got 'http'"),
    (
        ["serve", "--executor", "nosuch"],
        "--executor must be mp, ray or uniproc (the installed executor plugins), got 'nosuch'",
    ),
    (
        ["serve", "--executor", "uniprc"],
        "--executor must be mp, ray or uniproc (the installed executor plugins), got 'uniprc' (did you mean uniproc?)",
    ),
    (["serve", "m", "--enable-lora", "--lora-modules", "a=/x", "a=/y"], "--lora-modules a: the name is given twice"),
    (["serve", "m", "--enable-lora", "--lora-modules", "m=/x"], "--lora-modules m: the name is the served model's"),
    (["models"], "No such command 'models': `llmp ls` lists the models on this machine (see 'llmp --help')"),
    (["run", "smollm2"], "No such command 'run': `llmp chat MODEL` runs a model here"),
    (["serve", "--kernels", "nosuch"], "--kernels must be "),
    (["serve", "--frontend", "nosuch"], "--frontend must be "),
    (["serve", "--frontend", "openai", "--frontend", "antropic"], "--frontend must be "),
    (["serve", "-tp", "2"], "--tensor-parallel-size 2 needs an executor that runs several ranks (--executor mp"),
    (["serve", "-tp", "0"], "--tensor-parallel-size must be >= 1, got 0"),
    (["serve", "--max-model-len", "1"], "--max-model-len must be >= 2, got 1"),
    (["serve", "--max-num-seqs", "0"], "--max-num-seqs must be >= 1, got 0"),
    (["serve", "--kv-cache-memory-gib", "-1"], "--kv-cache-memory-gib must be >= 0, got -1"),
    (["serve", "--dtype", "bf16"], "--dtype must be auto, bfloat16, float16, float32, half or float, got 'bf16' (did"),
    (["serve", "--device", "tpu"], "--device must be auto, cpu, cuda or cuda:N, got 'tpu'"),
    (["serve", "--device", "cuda:x"], "--device must be auto, cpu, cuda or cuda:N, got 'cuda:x'"),
    (["serve", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization must be > 0 and <= 1, got 1.5"),
    (["serve", "--cuda-graph-sizes", "0"], "--cuda-graph-sizes must be a whole number >= 1, got 0"),
    (["serve", "--device", "cuda:0", "--port", "99999"], "--port must be between"),  # cuda:N is a device
    (["serve", "--tool-call-parser", "hermess"], "--tool-call-parser must be "),
    (["serve", "--reasoning-parser", "nosuch"], "--reasoning-parser must be "),
    (["serve", "--enable-auto-tool-choice"], "--enable-auto-tool-choice needs --tool-call-parser NAME"),
    # an option that acts only beside another is refused when that other is off, never ignored
    (["serve", "--max-cpu-loras", "4"], "--max-cpu-loras needs --enable-lora"),
    (["serve", "--max-loras", "2"], "--max-loras needs --enable-lora"),
    (["serve", "--admin-api-key", "k"], "--admin-api-key needs --enable-admin-api"),
    (["serve", "--allow-credentials"], "--allow-credentials needs --allowed-origins ORIGIN"),
    (["serve", "--ray-address", "auto"], "--ray-address needs --executor ray"),
    (["serve", __file__, "--revision", "v2"], f"--revision picks a revision of a Hub model; {__file__} is a local"),
    (["serve", __file__, "--gguf-file", "x.gguf"], "--gguf-file picks a file of a directory or repository;"),
    (["serve", "--grpc-port", "70000"], "--grpc-port must be between 0 and 65535, got 70000"),
    (["serve", "--max-n", "0"], "--max-n must be >= 1, got 0"),
    (["serve", "--max-logprobs", "-1"], "--max-logprobs must be >= 0, got -1"),
    (["serve", "--overload-status", "500"], "--overload-status must be 503 or 429, got 500"),
    (["serve", "--request-timeout", "-5"], "--request-timeout must be >= 0, got -5"),
    (["serve", "--log-level", "loud"], "--log-level must be debug, info, warning or error, got 'loud'"),
    (["serve", "--prot", "1"], "No such option: --prot"),
    (["serve", "--max-num-seqs", "0", "--port", "99999"], "--max-num-seqs must be >= 1, got 0; --port must be"),
    (["bench", "throughput", "--num-prompts", "0"], "--num-prompts must be >= 1, got 0"),
    (["bench", "throughput", "-tp", "2"], "--tensor-parallel-size 2 needs an executor"),
    (["bench", "throughput", "--executor", "nosuch"], "--executor must be mp, ray or uniproc"),
    (["bench", "latency", "--kernels", "nosuch"], "--kernels must be "),
    (["bench", "latency", "--batch-size", "many"], "--batch-size must be an integer, got 'many'"),
    (["bench", "serve", "--request-rate", "0"], "--request-rate must be > 0, got 0"),
    (["complete", "--max-tokens", "0"], "--max-tokens must be >= 1, got 0"),
    # infinity is no number a request, a timer or JSON can carry (where it is not the option's own default)
    (["complete", "--temperature", "inf"], "--temperature must be a finite number, got 'inf'"),
    (["chat", "--temperature", "1e400"], "--temperature must be a finite number, got '1e400'"),
    (["serve", "--request-timeout", "inf"], "--request-timeout must be a finite number, got 'inf'"),
    (["plugins", "list", "--kind", "gizmo"], "--kind must be model, kernels, executor"),
    (["plugins", "list", "--kind", "kernel"], "--kind must be model, kernels, executor"),
    (
        ["plugins", "show", "kernels-cpux"],
        "NAME must be an installed plugin (executors-mp, ",
    ),
    (["collect-env", "--bogus"], "No such option: --bogus"),
    # empty or malformed values that would start a server with a surprise
    (["serve", "--api-key", ""], "--api-key must not be empty"),
    (["serve", "--api-key", "k", "--api-key", " "], "--api-key must not be empty"),
    (["serve", "--served-model-name", ""], "--served-model-name must not be empty"),
    (["serve", "--host", ""], "--host must not be empty"),
    (["serve", ""], "MODEL must not be empty"),
    (["serve", "--max-request-body-bytes", "0"], "--max-request-body-bytes must be >= 1, got 0"),
    (["serve", "--root-path", "nope"], "--root-path must start with /, got 'nope'"),
    (["serve", "--seed", "-1"], "--seed must be between 0 and 18446744073709551615, got -1"),
    (["serve", "--config", "."], "--config file '.' is a directory"),
    # a vLLM flag llmp has under another name points to it
    (["serve", "--model", "m"], "No such option: --model (the model is the first argument: llmp serve MODEL)"),
    (["serve", "--uvicorn-log-level", "debug"], "No such option: --uvicorn-log-level (use --log-level)"),
    (
        ["complete", "--gpu-memory-utilization", "0.9"],
        "No such option: --gpu-memory-utilization (see",
    ),  # no such option there
]


def refused_at_once(args: list[str], env: dict[str, str] | None = None) -> str:
    """The one error line of ``llmp ARGS``, checked to come alone, fast, with status 2 and nothing started."""
    started = time.monotonic()
    result = run_llmp(*args, env=env, check=False, timeout=60)
    elapsed = time.monotonic() - started
    shown = f"llmp {' '.join(args)} (status {result.returncode}):\n{result.stdout}{result.stderr}"
    assert result.returncode == 2, shown
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("llmp: error: "), shown
    assert result.stdout == "", shown
    for started_something in ("Uvicorn", "INFO", "Started server", "Traceback", "Exception ignored"):
        assert started_something not in result.stderr, shown
    assert elapsed < FAST_S, f"{shown}\ntook {elapsed:.1f} s"
    return lines[0].removeprefix("llmp: error: ")


@pytest.mark.parametrize(("args", "message"), COMMAND_LINE, ids=[" ".join(a) for a, _ in COMMAND_LINE])
def test_a_bad_flag_is_one_line_naming_it(args: list[str], message: str) -> None:
    assert refused_at_once(args).startswith(message)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LLMP_PORT": "99999"}, "LLMP_PORT must be between 0 and 65535, got 99999"),
        ({"LLMP_EXECUTOR": "nosuch"}, "LLMP_EXECUTOR must be mp, ray or uniproc"),
        ({"LLMP_TENSOR_PARALLEL_SIZE": "2"}, "LLMP_TENSOR_PARALLEL_SIZE=2 needs an executor"),
        ({"LLMP_ENABLE_PREFIX_CACHING": "maybe"}, "LLMP_ENABLE_PREFIX_CACHING must be true or false, got 'maybe'"),
        ({"LLMP_FRONTEND": "openai,nosuch"}, "LLMP_FRONTEND must be "),
        ({"LLMP_API_KEY": ""}, "LLMP_API_KEY must not be empty"),  # $KEY unset must not turn auth off unseen
        ({"LLMP_API_KEY": "a,"}, "LLMP_API_KEY must not be empty"),
        ({"LLMP_SEED": "-1"}, "LLMP_SEED must be between 0 and"),
        ({"LLMP_ROOT_PATH": "api"}, "LLMP_ROOT_PATH must start with /, got 'api'"),
    ],
    ids=lambda value: next(iter(value)) if isinstance(value, dict) else None,
)
def test_a_bad_variable_is_one_line_naming_it(env: dict[str, str], message: str) -> None:
    assert refused_at_once(["serve"], env).startswith(message)


@pytest.mark.parametrize(
    ("yaml", "message"),
    [
        ("port: 99999\n", "port in {path} must be between 0 and 65535, got 99999"),
        ("max_model_len: 1\n", "max_model_len in {path} must be >= 2, got 1"),
        ("tensor-parallel-size: 2\n", "tensor-parallel-size: 2 in {path} needs an executor"),
        ("kernels: nosuch\n", "kernels in {path} must be "),
        ("frontend: [openai, nosuch]\n", "frontend in {path} must be "),
        ('api-key: ""\n', "api-key in {path} must not be empty"),
        ("served-model-name: ['']\n", "served-model-name in {path} must not be empty"),
        ("max-num-seqz: 8\n", "--config {path} has unknown options: max-num-seqz (did you mean max-num-seqs?)"),
        ("port: [1, 2]\n", "port in {path} must be an integer, got [1, 2]"),
        ("- a list\n", "--config {path} must hold a mapping of option: value"),
        ("port: [1\n", "--config {path} is not valid YAML"),
    ],
)
def test_a_bad_yaml_key_is_one_line_naming_it(tmp_path: Path, yaml: str, message: str) -> None:
    config = tmp_path / "llmp.yaml"
    config.write_text(yaml)
    assert refused_at_once(["serve", "--config", str(config)]).startswith(message.format(path=config))


def test_good_values_pass_the_same_checks() -> None:
    """Plugin names, a tensor-parallel executor and the bounds' edges are accepted as given."""
    records = {"engine": EngineConfig, "server": ServerOptions, "request": FrontendOptions}
    given = {
        "executor": "mp",
        "tensor_parallel_size": "2",
        "kernels": "torch",
        "frontend": ["openai", "anthropic"],
        "tool_call_parser": "hermes",
        "enable_auto_tool_choice": True,
        "port": "0",
        "grpc_port": "65535",
        "overload_status": "429",
        "kv_cache_memory_gib": "0.5",
        "api_key": [" key "],  # text is taken without surrounding blanks, whatever its type
        "max_request_body_bytes": "1",
        "root_path": "/llm",
    }
    environ = {"LLMP_DEVICE": "cpu", "LLMP_MAX_MODEL_LEN": "2", "LLMP_PORT": " 8000 ", "LLMP_SEED": "0"}
    built = load_records(records, given, environ=environ, check=option_problems)
    engine, server, request = built["engine"], built["server"], built["request"]
    assert (engine.executor, engine.tensor_parallel_size, engine.kernels) == ("mp", 2, "torch")
    assert (engine.max_model_len, engine.kv_cache_memory_bytes) == (2, 1 << 29)
    assert (server.frontend, server.port, server.overload_status) == (("openai", "anthropic"), 0, 429)
    assert (server.api_key, server.max_request_body_bytes, server.root_path) == (("key",), 1, "/llm")
    assert load_records({"server": ServerOptions}, {}, environ={"LLMP_PORT": " 8000 "})["server"].port == 8000
    assert (request.tool_call_parser, request.grpc_port) == ("hermes", 65535)
    # an option whose default is infinity takes it (--request-rate inf: every request at once)
    from llmp.cli.bench_cmd import BenchServeSettings

    assert load_records({"bench": BenchServeSettings}, {"request_rate": "inf"})["bench"].request_rate == math.inf


@pytest.mark.parametrize(
    ("args", "env", "yaml", "source"),
    [
        (["serve", "--max-model-len", "10000000"], {}, None, "--max-model-len"),
        (["bench", "throughput", "--max-model-len", "10000000"], {}, None, "--max-model-len"),
        (["bench", "latency", "--max-model-len", "10000000"], {}, None, "--max-model-len"),
        (["serve"], {"LLMP_MAX_MODEL_LEN": "10000000"}, None, "LLMP_MAX_MODEL_LEN"),
        (["serve"], {}, "max-model-len: 10000000\n", "max-model-len in {path}"),
    ],
    ids=["serve", "bench throughput", "bench latency", "variable", "yaml"],
)
def test_a_context_longer_than_the_models_is_refused_before_anything_starts(
    tmp_path: Path, args: list[str], env: dict[str, str], yaml: str | None, source: str
) -> None:
    """The model's config.json is read when the options are: no engine, no server (vLLM's check)."""
    save_tiny_llama(tmp_path / "tiny")  # max_position_embeddings 512
    # read once here, as any earlier use of the model would have: reading a new model's config imports
    # transformers, which on a busy machine alone can take longer than FAST_S
    assert model_context_len(str(tmp_path / "tiny")) == 512
    extra = []
    if yaml is not None:
        (tmp_path / "llmp.yaml").write_text(yaml)
        extra = ["--config", str(tmp_path / "llmp.yaml")]
    message = refused_at_once([*args, str(tmp_path / "tiny"), *extra], env)
    where = source.format(path=tmp_path / "llmp.yaml")
    assert message == f"{where} 10000000 exceeds the model's context (max_position_embeddings = 512)"


def test_help_is_also_dash_h_on_every_level() -> None:
    for args in (["-h"], ["serve", "-h"], ["bench", "-h"], ["bench", "throughput", "-h"], ["plugins", "list", "-h"]):
        result = run_llmp(*args, check=False, timeout=60)
        assert result.returncode == 0 and result.stderr == "", (args, result.stderr)
        assert result.stdout.lstrip().startswith(f"Usage: llmp {' '.join(args[:-1])}".rstrip()), result.stdout


def test_an_engine_that_fails_to_start_says_so_in_one_line_without_a_stray_traceback(tmp_path: Path) -> None:
    """What only the engine can tell (the KV cache holds no block of this model) is one line too,
    after the server's own log lines: no traceback from the engine process as it exits."""
    save_tiny_llama(tmp_path / "tiny")
    result = run_llmp(
        "serve", str(tmp_path / "tiny"), "--port", "0", "--kv-cache-memory-gib", "1e-9", check=False, timeout=120
    )
    errors = [line for line in result.stderr.splitlines() if line.startswith("llmp: error:")]
    assert result.returncode == 1, result.stderr
    assert len(errors) == 1 and "cannot start the engine" in errors[0] and "--kv-cache-memory-gib" in errors[0]
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr


def test_an_option_only_beside_another_from_a_variable_is_a_warning_not_a_refusal(tmp_path: Path) -> None:
    # a standing LLMP_ADMIN_API_KEY (a deployment's secret) must not stop a host without the admin API;
    # the same on the command line is refused above
    result = run_llmp("serve", str(tmp_path / "no-model"), env={"LLMP_ADMIN_API_KEY": "k"}, check=False, timeout=60)
    assert "LLMP_ADMIN_API_KEY needs --enable-admin-api: ignored" in result.stderr
    assert "needs --enable-admin-api" not in result.stderr.split("llmp: error:")[-1]  # the refusal is the model's
