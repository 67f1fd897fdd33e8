"""Options declared once: the generated commands follow their records, and engine defaults are not repeated.

The commands are built by typer exactly as ``llmp`` builds them; the option sources
(command line, ``LLMP_*``, YAML) are exercised through ``llmp.config`` and, for the
engine options of ``llmp serve``, through the real CLI in a subprocess.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from pathlib import Path
from typing import Any

import pytest
import typer
from llmp_frontend_mcp.cli import mcp

from llmp.cli.bench_cmd import serve as bench_serve
from llmp.cli.bench_offline import latency, throughput
from llmp.cli.client_cmd import chat, complete
from llmp.cli.env_cmd import collect_env
from llmp.cli.models_cmd import ls, pull, rm
from llmp.cli.option_checks import option_problems
from llmp.cli.plugins_cmd import list_plugins, show_plugin
from llmp.cli.serve_cmd import serve
from llmp.config import OptionError, Select, load_records
from llmp.options import EngineConfig, FrontendOptions, ServerOptions
from llmp.testing import run_llmp

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {
    "serve": serve,
    "bench throughput": throughput,
    "bench latency": latency,
    "bench serve": bench_serve,
    "mcp": mcp,
    "plugins list": list_plugins,
    "plugins show": show_plugin,
    "collect-env": collect_env,
    "chat": chat,
    "complete": complete,
    "pull": pull,
    "ls": ls,
    "rm": rm,
}


def click_params(function: Any) -> dict[str, Any]:
    holder = typer.Typer(add_completion=False)  # as `llmp` builds its commands
    holder.command()(function)
    return {p.name: p for p in typer.main.get_command(holder).params}


def record_fields(record: Any) -> list[tuple[dataclasses.Field, str]]:
    """The option fields of a command parameter's record, with the help text this command shows."""
    select = Select()
    if typing.get_origin(record) is typing.Annotated:
        record, select = typing.get_args(record)
    return [
        (f, select.help.get(f.name, f.metadata["help"]))
        for f in dataclasses.fields(record)
        if f.metadata.get("help") and (select.only is None or f.name in select.only) and f.name not in select.omit
    ]


@pytest.mark.parametrize("name", COMMANDS)
def test_generated_command_matches_its_records(name: str) -> None:
    command = COMMANDS[name]
    params = click_params(command)
    hints = typing.get_type_hints(command.function, include_extras=True)
    expected = {"config"}
    for record in hints.values():
        if record is type(None):
            continue
        for f, help_text in record_fields(record):
            flag_name = (f.metadata.get("flag") or "").split("/")[0].removeprefix("--").replace("-", "_")
            option = f.metadata.get("name") or flag_name or f.name  # --json: LLMP_JSON, `json:` in YAML
            expected.add(option)
            param = params[option]
            assert param.help == help_text, option
            default = f.default
            if f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            if f.metadata.get("scale"):
                default = default / f.metadata["scale"]
            if f.metadata.get("argument"):
                assert param.param_type_name == "argument" and param.required == (default is dataclasses.MISSING)
                continue
            flag = f.metadata.get("flag") or "--" + option.replace("_", "-")
            assert flag.split("/")[0] in param.opts, (option, param.opts)
            if f.metadata.get("short"):
                assert f.metadata["short"] in param.opts
            if isinstance(default, tuple):  # repeatable; the record's default applies when none is given
                assert param.multiple and param.default is None, option
            else:
                assert param.default == default, option
            if default is True:
                assert param.secondary_opts == ["--no-" + flag[2:]], option
    assert set(params) == expected


# Every flag of these commands before they were generated, with its default: none may go or change.
# (One changed on purpose: --kv-cache-memory-gib defaults to 0, 4 GiB on the CPU and the measured
# rest of --gpu-memory-utilization on a GPU.)
FLAGS_BEFORE = {
    "serve": """--allow-credentials=False --allowed-hosts=None --allowed-origins=None --api-key=None --block-size=16
        --chat-template=None --disable-access-log=False --disable-fastapi-docs=False --dtype='auto'
        --enable-auto-tool-choice=False --enable-chunked-prefill/--no-enable-chunked-prefill=True
        --enable-force-include-usage=False --enable-prefix-caching/--no-enable-prefix-caching=True
        --enable-store=False --exclude-tools-when-tool-choice-none=False --executor='uniproc' --frontend=None
        --generation-config='auto' --grpc-port=50051 --header-timeout=10.0 --health-check-timeout=5.0
        --host='127.0.0.1' --kernels=None --kv-cache-memory-gib=0.0 --log-level='info' --max-logprobs=20
        --max-model-len=None --max-n=128 --max-num-batched-tokens=2048 --max-num-seqs=256 --max-queue-len=1024
        --max-request-body-bytes=2097152 --max-stop-sequences=64 --model-impl='auto' --num-threads=None
        --overload-status=503 --port=8000 --ray-address=None --reasoning-parser=None --request-timeout=None
        --response-role='assistant' --return-tokens-as-token-ids=False --root-path='' --seed=0
        --served-model-name=None --shutdown-timeout=10.0 --task='auto' --tensor-parallel-size/-tp=1
        --tool-call-parser=None --trust-request-chat-template=False""",
    "bench throughput": """--block-size=16 --dataset='random' --dtype='auto'
        --enable-chunked-prefill/--no-enable-chunked-prefill=True
        --enable-prefix-caching/--no-enable-prefix-caching=True
        --executor='uniproc' --input-len=128 --json/--no-json=False --kernels=None --kv-cache-memory-gib=0.0
        --max-model-len=None --max-num-batched-tokens=2048 --max-num-seqs=256 --min-input-len=None
        --min-output-len=None --model-impl='auto' --num-prompts=64 --num-threads=None --output-len=64
        --prefix-len=128 --save-result=None --seed=0 --tensor-parallel-size/-tp=1""",
    "bench latency": """--batch-size=8 --block-size=16 --dtype='auto'
        --enable-chunked-prefill/--no-enable-chunked-prefill=True
        --enable-prefix-caching/--no-enable-prefix-caching=True
        --executor='uniproc' --input-len=32 --json/--no-json=False --kernels=None --kv-cache-memory-gib=0.0
        --max-model-len=None --max-num-batched-tokens=2048 --max-num-seqs=256 --model-impl='auto' --num-iters=5
        --num-iters-warmup=1 --num-threads=None --output-len=128 --save-result=None --seed=0
        --tensor-parallel-size/-tp=1""",
    "mcp": """--chat-template=None --dtype='auto' --generation-config='auto' --kv-cache-memory-gib=0.0
        --log-level='warning' --max-model-len=None --max-num-seqs=256 --max-stop-sequences=64 --num-threads=None
        --seed=0 --served-model-name=None""",
}


@pytest.mark.parametrize("name", FLAGS_BEFORE)
def test_every_flag_of_before_is_still_there_with_its_default(name: str) -> None:
    now = {}
    for param in click_params(COMMANDS[name]).values():
        if param.param_type_name == "option":
            now["/".join(param.opts + param.secondary_opts)] = repr(param.default)
    for item in FLAGS_BEFORE[name].split():
        flags, default = item.split("=", 1)
        assert now.get(flags) == default, (name, flags, now.get(flags), default)


# Defaults too common to tell a repeat from another use of the same name: not scanned for the server's
# records (EngineConfig's are all scanned; none of them is repeated).
COMMON = (False, True, 0, 1, "", (), "auto")
# the same name meaning something else: the tiny test model's weights seed, bench serve's prompt seed,
# the engine task the offline benchmarks set (not the front-end's)
ELSEWHERE = {
    ("EngineConfig", "core/llmp/testing.py", "seed"),
    ("EngineConfig", "core/llmp/cli/bench_cmd.py", "seed"),
    ("FrontendOptions", "core/llmp/cli/bench_offline.py", "task"),
}


@pytest.mark.parametrize(
    ("record", "skipped"),
    [(EngineConfig, ()), (ServerOptions, COMMON), (FrontendOptions, COMMON)],
    ids=["EngineConfig", "ServerOptions", "FrontendOptions"],
)
def test_option_defaults_are_written_once(record: type, skipped: tuple) -> None:
    """An option's default is written in its record alone: not again in a CLI, a component, a plugin
    or another record (FrontendOptions's copy of a ServerOptions default)."""
    sources = {
        p.relative_to(REPO).as_posix(): p.read_text()
        for root in ("core", "plugins")
        for p in (REPO / root).rglob("*.py")
        # the conformance kit is test code shipped to plugin authors: its workloads spell their settings
        # on purpose, so that a changed default does not change what a check tests
        if "tests" not in p.parts and "conformance" not in p.parts
    }
    # the record's own declarations are where its defaults belong: blanked, keeping line numbers
    lines, first = inspect.getsourcelines(record)
    options = sources["core/llmp/options.py"].splitlines()
    options[first - 1 : first - 1 + len(lines)] = [""] * len(lines)
    sources["core/llmp/options.py"] = "\n".join(options)
    repeats = default_repeats(record, skipped, sources)
    assert not repeats, f"{record.__name__} defaults written again:\n" + "\n".join(repeats)


def test_the_defaults_check_sees_a_repeat() -> None:
    sources = {
        "a.py": "class Limits:\n    overload_status: int = 503\n",
        "b.py": "serve(max_request_body_bytes=2 << 20)\nprint('the cap max_request_body_bytes=2 << 20')\n",
        "c.py": "host = '127.0.0.1'\nallow_credentials=False\n",
    }
    assert sorted(default_repeats(ServerOptions, COMMON, sources)) == [
        "a.py:2: overload_status: int = 503",
        "b.py:1: serve(max_request_body_bytes=2 << 20)",
        "c.py:1: host = '127.0.0.1'",
    ]


def default_repeats(record: type, skipped: tuple, sources: dict[str, str]) -> list[str]:
    """``path:line: text`` of every line of ``sources`` (text by path) that sets one of ``record``'s
    field names to its default: ``name: type = value``, ``name=value``, ``name = option(value``,
    ``"name": value``; not inside a string, and not the defaults in ``skipped``."""
    repeats = []
    for f in dataclasses.fields(record):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if default is dataclasses.MISSING or default is None:
            continue
        if any(default == common and type(default) is type(common) for common in skipped):
            continue
        spellings = _literals(default)
        if not spellings:
            continue
        names = "|".join({f.name, f.metadata.get("name") or f.name})
        pattern = re.compile(
            rf"""["']?\b(?:{names})\b["']?\s*(?::[^=\n]*)?[=:]\s*(?:option\(\s*)?(?:{"|".join(spellings)})(?![\w.])"""
        )
        for path, text in sources.items():
            if (record.__name__, path, f.name) in ELSEWHERE:
                continue
            for number, line in enumerate(text.splitlines(), 1):
                match = pattern.search(line)
                if match and not _in_string(line[: match.start()]):
                    repeats.append(f"{path}:{number}: {line.strip()}")
    return repeats


def _in_string(before: str) -> bool:
    """Whether a match starting after ``before`` lies inside a string literal (a message, not code)."""
    return before.count('"') % 2 == 1 or before.count("'") % 2 == 1


def _literals(value: Any) -> list[str]:
    """How a default may be spelt in source."""
    if isinstance(value, bool):
        return [str(value)]
    if isinstance(value, int):
        spelt = [str(value)]
        for shift in (30, 20, 10):  # GiB, MiB, KiB
            if value >= 1 << shift and value % (1 << shift) == 0:
                count = value >> shift
                spelt += [
                    rf"{count}\s*<<\s*{shift}",
                    rf"{count}\s*\*\s*\(?1\s*<<\s*{shift}",
                    rf"{count}\s*\*\s*2\s*\*\*\s*{shift}",
                ]
        if value >= 1 << 30 and value % (1 << 30) == 0:
            spelt.append(rf"{value >> 30}\.0")  # an option given in GiB
        return spelt
    if isinstance(value, float):
        return [re.escape(repr(value)), rf"{int(value)}\b(?!\.)"] if value.is_integer() else [re.escape(repr(value))]
    if isinstance(value, str):
        return [rf"[\"']{re.escape(value)}[\"']"]
    return []


# -- where values come from -------------------------------------------------------------------


def test_command_line_beats_environment_beats_yaml_beats_default(tmp_path: Path) -> None:
    config = tmp_path / "llmp.yaml"
    config.write_text("max-num-seqs: 8\nmax_num_batched_tokens: 64\nport: 9000\nkv-cache-memory-gib: 0.5\n")
    records = {"engine": EngineConfig, "server": ServerOptions}
    built = load_records(records, {}, config, environ={})
    engine, server = built["engine"], built["server"]
    assert (engine.max_num_seqs, engine.max_num_batched_tokens, server.port) == (8, 64, 9000)
    assert engine.kv_cache_memory_bytes == 1 << 29  # given in GiB, kept in bytes
    assert engine.block_size == EngineConfig().block_size  # set nowhere: the record's default
    built = load_records(records, {}, config, environ={"LLMP_MAX_NUM_SEQS": "4", "LLMP_API_KEY": "a, b"})
    assert built["engine"].max_num_seqs == 4 and built["engine"].max_num_batched_tokens == 64
    assert built["server"].api_key == ("a", "b")  # a repeatable option's variable splits at commas
    built = load_records(records, {"max_num_seqs": 2}, config, environ={"LLMP_MAX_NUM_SEQS": "4"})
    assert built["engine"].max_num_seqs == 2


def test_a_yaml_mapping_in_a_list_is_its_json_text(tmp_path: Path) -> None:
    """docs/lora.md: --lora-modules takes NAME=PATH or a JSON object; in YAML the object is a mapping."""
    config = tmp_path / "llmp.yaml"
    config.write_text("lora-modules:\n  - sql=/a/sql\n  - name: chat\n    path: /a/chat\n")
    built = load_records({"server": ServerOptions}, {}, config, environ={})
    assert built["server"].lora_modules == ("sql=/a/sql", '{"name": "chat", "path": "/a/chat"}')


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"LLMP_OVERLOAD_STATUS": "500"}, "LLMP_OVERLOAD_STATUS must be 503 or 429, got 500"),
        ({"LLMP_REQUEST_TIMEOUT": "-1"}, "LLMP_REQUEST_TIMEOUT must be >= 0, got -1"),
        ({"LLMP_MAX_NUM_SEQS": "many"}, "LLMP_MAX_NUM_SEQS must be an integer, got 'many'"),
        ({"LLMP_MAX_NUM_SEQS": "0"}, "LLMP_MAX_NUM_SEQS must be >= 1, got 0"),
        ({"LLMP_KV_CACHE_MEMORY_GIB": "-1"}, "LLMP_KV_CACHE_MEMORY_GIB must be >= 0, got -1"),
        ({"LLMP_PORT": "99999"}, "LLMP_PORT must be between 0 and 65535, got 99999"),
        ({"LLMP_ENABLE_PREFIX_CACHING": "maybe"}, "LLMP_ENABLE_PREFIX_CACHING must be true or false, got 'maybe'"),
        (
            {"LLMP_DTYPE": "bf16"},
            "LLMP_DTYPE must be auto, bfloat16, float16, float32, half or float, got 'bf16' (did you mean bfloat16?)",
        ),
        (
            {"LLMP_EXECUTOR": "uniprc"},
            "LLMP_EXECUTOR must be mp, ray or uniproc (the installed executor plugins), got 'uniprc' "
            "(did you mean uniproc?)",
        ),
        ({"LLMP_TENSOR_PARALLEL_SIZE": "2"}, "LLMP_TENSOR_PARALLEL_SIZE=2 needs an executor that runs several ranks"),
        ({"LLMP_API_KEY": " "}, "LLMP_API_KEY must not be empty"),
        ({"LLMP_HOST": ""}, "LLMP_HOST must not be empty"),
    ],
)
def test_bad_values_name_their_option_as_set(environ: dict[str, str], message: str) -> None:
    """A value from the environment names its variable (the command line names the flag: test_cli_validation)."""
    with pytest.raises(OptionError) as caught:
        load_records({"engine": EngineConfig, "server": ServerOptions}, {}, environ=environ, check=option_problems)
    assert caught.value.message.startswith(message)


def test_bounds_and_choices_are_declared_on_the_options() -> None:
    """Constraints are data on the option records, and programs building a record meet the same ones."""
    ports = {f.name: f.metadata for f in dataclasses.fields(ServerOptions)}["port"]
    assert (ports["ge"], ports["le"]) == (0, 65535)
    for record, field, value, message in (
        (ServerOptions, "port", 70000, "port must be between 0 and 65535, got 70000"),
        (ServerOptions, "overload_status", 500, "overload_status must be 503 or 429, got 500"),
        (EngineConfig, "max_num_seqs", 0, "max_num_seqs must be >= 1, got 0"),
        (EngineConfig, "kv_cache_memory_bytes", -1, "kv_cache_memory_bytes must be >= 0, got -1"),
        (FrontendOptions, "max_n", 0, "max_n must be >= 1, got 0"),
        (ServerOptions, "api_key", ("k", ""), "api_key must not be empty"),
        (ServerOptions, "served_model_name", ("",), "served_model_name must not be empty"),
        (ServerOptions, "root_path", "v1", "root_path must start with /, got 'v1'"),
        (ServerOptions, "max_request_body_bytes", 0, "max_request_body_bytes must be >= 1, got 0"),
        (EngineConfig, "model", "", "model must not be empty"),
        (EngineConfig, "seed", -1, "seed must be between 0 and 18446744073709551615, got -1"),
    ):
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            record(**{field: value})


def test_serve_reads_engine_options_from_environment_and_yaml(tmp_path: Path) -> None:
    """Through the real CLI: a bad engine value from either source stops `llmp serve` before it starts anything."""
    from_env = run_llmp("serve", "--port", "1", env={"LLMP_MAX_NUM_SEQS": "0"}, check=False)
    assert from_env.returncode == 2 and "LLMP_MAX_NUM_SEQS must be >= 1, got 0" in from_env.stderr
    config = tmp_path / "llmp.yaml"
    config.write_text("max-num-seqs: 0\n")
    from_yaml = run_llmp("serve", "--port", "1", "--config", str(config), check=False)
    assert from_yaml.returncode == 2 and f"max-num-seqs in {config} must be >= 1, got 0" in from_yaml.stderr
    overloaded = run_llmp("serve", "--port", "1", "--overload-status", "500", check=False)
    assert overloaded.returncode == 2 and "--overload-status must be 503 or 429, got 500" in overloaded.stderr


@pytest.mark.parametrize("source", ["command line", "environment"])
def test_a_value_outside_an_options_choices_stops_serve_at_once_in_one_line(source: str) -> None:
    """A closed set (a Literal field) is checked with the other values, before anything starts."""
    args, env = (
        (["--scheduling-policy", "lifo"], {}) if source == "command line" else ([], {"LLMP_SCHEDULING_POLICY": "lifo"})
    )
    result = run_llmp("serve", "--port", "1", *args, env=env, check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    name = "--scheduling-policy" if source == "command line" else "LLMP_SCHEDULING_POLICY"
    assert lines[0] == f"llmp: error: {name} must be fcfs or priority, got 'lifo'"


def test_choices_are_shown_and_checked_for_programs_too() -> None:
    assert click_params(serve)["scheduling_policy"].metavar == "{fcfs,priority}"
    assert click_params(serve)["model_impl"].metavar == "{auto,native,transformers}"
    for field, value in (("scheduling_policy", "lifo"), ("model_impl", "jax"), ("task", "rank"), ("dtype", "int8")):
        with pytest.raises(ValueError, match=rf"^{field} must be .* or .*, got '{value}'$"):
            EngineConfig(**{field: value})
    with pytest.raises(ValueError, match="log_level must be debug, info, warning or error, got 'loud'"):
        ServerOptions(log_level="loud")
    with pytest.raises(ValueError, match="generation_config must be auto or none"):
        FrontendOptions(generation_config="vllm")


def test_a_yaml_key_no_command_takes_is_refused_and_one_of_another_command_is_passed_over(tmp_path: Path) -> None:
    typo = tmp_path / "typo.yaml"
    typo.write_text("max-num-seqz: 8\n")
    refused = run_llmp("serve", "--port", "1", "--config", str(typo), check=False)
    assert refused.returncode == 2 and "max-num-seqz (did you mean max-num-seqs?)" in refused.stderr
    shared = tmp_path / "shared.yaml"
    shared.write_text("max-num-seqs: 8\nkind: model\n")  # a serve option and a plugins-list option
    listed = run_llmp("plugins", "list", "--config", str(shared))
    assert "ignoring options not used by this command" in listed.stderr and "max_num_seqs" in listed.stderr


@pytest.mark.parametrize("command", ["collect-env", "plugins list", "bench serve"])
def test_a_flag_is_named_the_same_as_a_variable_and_a_yaml_key(tmp_path: Path, command: str) -> None:
    """--json is LLMP_JSON and `json:` in a --config file, as the help footer says of every option."""
    params = click_params(COMMANDS[command])
    assert "--json" in params["json"].opts  # the option's name follows its flag
    if command == "bench serve":
        return  # it needs a server; the naming is what is checked
    args = command.split()
    assert run_llmp(*args, env={"LLMP_JSON": "1"}).stdout.startswith(("{", "["))
    config = tmp_path / "llmp.yaml"
    config.write_text("json: true\n")
    assert run_llmp(*args, "--config", str(config)).stdout.startswith(("{", "["))


def test_an_empty_model_name_is_refused_by_name_not_as_a_directory() -> None:
    from llmp import LLM

    with pytest.raises(ValueError, match="^model must not be empty$"):
        LLM("")


@pytest.mark.parametrize("key", ["temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens"])
def test_generation_overrides_take_what_sampling_params_take(key: str) -> None:
    """--override-generation-config is checked at start-up with SamplingParams's own bounds, so a
    request that sets nothing never fails for a value it did not send."""
    from llmp import SamplingParams
    from llmp.options import sampling_defaults

    for value in (-2, -1, -0.5, 0, 0.5, 1, 1.5, 2, 7, float("nan"), float("inf")):
        try:
            SamplingParams(**{"max_tokens" if key == "max_new_tokens" else key: value})
            accepted = True
        except ValueError:
            accepted = False
        assert (sampling_defaults({key: value}) is None) == accepted, (key, value)


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"enable_prefix_caching": "false"}, "enable_prefix_caching must be true or false, got 'false'"),
        ({"seed": None}, "seed must be an integer, got None"),
        ({"max_model_len": "64"}, "max_model_len must be an integer or None, got '64'"),
        ({"block_size": 16.5}, "block_size must be an integer, got 16.5"),
        ({"tensor_parallel_size": True}, "tensor_parallel_size must be an integer, got True"),
        ({"gpu_memory_utilization": "0.5"}, "gpu_memory_utilization must be a number, got '0.5'"),
    ],
)
def test_an_engine_setting_of_the_wrong_type_is_refused_naming_it(keywords, message):
    """From Python nothing parses the values: a string "false" would otherwise be true, and "64" fail deep inside."""
    with pytest.raises(ValueError) as caught:
        EngineConfig(**keywords)
    assert str(caught.value) == message


def test_vllms_other_dtype_names_are_read_as_ours():
    import torch

    assert EngineConfig(dtype="half").dtype == "float16" and EngineConfig(dtype="float").dtype == "float32"
    assert EngineConfig(dtype=torch.bfloat16, kv_cache_dtype=torch.float16).kv_cache_dtype == "float16"
    assert EngineConfig(gpu_memory_utilization=1).gpu_memory_utilization == 1  # an int is a number


def test_numpys_numbers_are_taken_as_pythons():
    """A sweep script's np.int64 and np.float32 are numbers: taken, and kept as Python's."""
    import numpy as np

    config = EngineConfig(max_model_len=np.int64(2048), gpu_memory_utilization=np.float32(0.5), enforce_eager=np.True_)
    assert (config.max_model_len, config.gpu_memory_utilization, config.enforce_eager) == (2048, 0.5, True)
    assert [type(v) for v in (config.max_model_len, config.gpu_memory_utilization, config.enforce_eager)] == [
        int,
        float,
        bool,
    ]
    with pytest.raises(ValueError, match=r"max_model_len must be an integer or None, got np.float64\(2048.0\)"):
        EngineConfig(max_model_len=np.float64(2048))
