"""TLS: ``--ssl-certfile``, ``--ssl-keyfile``, ``--ssl-ca-certs``, ``--ssl-cert-reqs`` (mutual TLS).

Certificates are made here (a CA, the server's for 127.0.0.1, a client's, and one from a CA the
server does not trust); two servers on loopback, started together: one-way TLS, and mutual TLS
(``--ssl-cert-reqs 2``). Clients are curl (``--cacert``) and httpx."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmp.api import LLMPError
from llmp.options import ServerOptions
from llmp.server.launch import _check_tls
from llmp.server.settings import ServeSettings
from llmp.testing import LiveServer, free_port, save_tiny_llama

pytestmark = pytest.mark.slow

BODY = {"prompt": "hello", "max_tokens": 3}


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _certificate(
    folder: Path, stem: str, common: str, issuer: tuple | None, *, ca: bool = False, server: bool = False
) -> tuple:
    """Write ``stem.pem`` and ``stem.key``; ``(certificate, key)``. ``issuer`` signs it (None: itself)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    signer_cert, signer_key = issuer or (None, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(signer_cert.subject if signer_cert else _name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    elif not ca:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    certificate = builder.sign(signer_key, hashes.SHA256())
    (folder / f"{stem}.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (folder / f"{stem}.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return certificate, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("pki")
    ca = _certificate(folder, "ca", "llmp test CA", None, ca=True)
    _certificate(folder, "server", "127.0.0.1", ca, server=True)
    _certificate(folder, "client", "a client", ca)
    stranger = _certificate(folder, "other-ca", "another CA", None, ca=True)
    _certificate(folder, "stranger", "a stranger", stranger)
    return folder


@contextmanager
def _tls_server(model: Path, *args: str) -> Iterator[LiveServer]:
    """``llmp serve`` with TLS, ready once its ``ready`` line is printed (testing.serving probes http)."""
    port = free_port()
    log_path = Path(tempfile.mkstemp(prefix="llmp-tls-", suffix=".log")[1])
    command = [sys.executable, "-m", "llmp", "serve", str(model), "--host", "127.0.0.1", "--port", str(port)]
    with open(log_path, "wb") as log:
        process = subprocess.Popen([*command, "--dtype", "float32", *args], stdout=log, stderr=subprocess.STDOUT)
    server = LiveServer(process, port, log_path)
    server.url = f"https://127.0.0.1:{port}"
    try:
        yield server
    finally:
        server.stop()


def _wait_ready(server: LiveServer, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while "llmp: ready" not in server.log():
        assert server.process.poll() is None, f"llmp serve exited:\n{server.log()}"
        assert time.monotonic() < deadline, f"not ready within {timeout} s:\n{server.log()}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def servers(pki: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, LiveServer]]:
    """(one-way TLS, mutual TLS), started together."""
    model = tmp_path_factory.mktemp("tiny-llama-tls")
    save_tiny_llama(model, vocab_size=400)
    tls = ["--ssl-certfile", str(pki / "server.pem"), "--ssl-keyfile", str(pki / "server.key")]
    with ExitStack() as stack:
        one_way = stack.enter_context(_tls_server(model, *tls))
        mutual = stack.enter_context(
            _tls_server(model, *tls, "--ssl-ca-certs", str(pki / "ca.pem"), "--ssl-cert-reqs", "2")
        )
        _wait_ready(one_way)
        _wait_ready(mutual)
        yield one_way, mutual


def _curl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["curl", "-sS", "--max-time", "60", *args], capture_output=True, text=True, timeout=90)


def _context(pki: Path, client: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    if client is not None:
        context.load_cert_chain(pki / f"{client}.pem", pki / f"{client}.key")
    return context


def test_tls_serves_https_to_curl_and_httpx_trusting_the_ca(servers, pki: Path):
    one_way, _ = servers
    assert "llmp: ready in" in one_way.log() and f"at https://127.0.0.1:{one_way.port}" in one_way.log()
    url = f"{one_way.url}/v1/completions"
    done = _curl(
        "--cacert",
        str(pki / "ca.pem"),
        "-H",
        "content-type: application/json",
        "-d",
        '{"prompt": "hello", "max_tokens": 3}',
        url,
    )
    assert done.returncode == 0, done.stderr
    assert httpx.Response(200, content=done.stdout).json()["usage"]["completion_tokens"] == 3
    response = httpx.post(url, json=BODY, verify=_context(pki), timeout=60)
    assert response.status_code == 200 and response.json()["choices"][0]["finish_reason"] == "length"
    # a client that does not trust the CA refuses the server; plain http gets no answer
    assert _curl(f"{one_way.url}/health").returncode == 60  # curl: peer certificate cannot be authenticated
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{one_way.port}/health", timeout=10)


def test_llmp_bench_serve_takes_an_https_url(servers, pki: Path, monkeypatch: pytest.MonkeyPatch):
    from llmp.cli.bench_cmd import BenchServeSettings, run_benchmark

    one_way, _ = servers
    monkeypatch.setenv("SSL_CERT_FILE", str(pki / "ca.pem"))  # httpx trusts the CA it names, as curl --cacert
    settings = BenchServeSettings(url=one_way.url, num_prompts=4, input_len=4, output_len=2)
    report = asyncio.run(run_benchmark(settings))
    assert report["failed"] == 0 and report["successful"] == 4, report


def test_mutual_tls_needs_a_client_certificate_signed_by_the_ca(servers, pki: Path):
    _, mutual = servers
    url = f"{mutual.url}/v1/completions"
    ca = ["--cacert", str(pki / "ca.pem")]
    refused = _curl(*ca, f"{mutual.url}/health")
    assert refused.returncode != 0, refused.stdout  # the handshake fails without a client certificate
    mine = ["--cert", str(pki / "client.pem"), "--key", str(pki / "client.key")]
    done = _curl(*ca, *mine, "-H", "content-type: application/json", "-d", '{"prompt": "hello", "max_tokens": 3}', url)
    assert done.returncode == 0, done.stderr
    assert '"finish_reason":"length"' in done.stdout
    response = httpx.post(url, json=BODY, verify=_context(pki, "client"), timeout=60)
    assert response.status_code == 200, response.text
    for client in (None, "stranger"):  # none, or one from a CA the server does not trust
        with pytest.raises(httpx.TransportError):
            httpx.post(url, json=BODY, verify=_context(pki, client), timeout=30)


def _settings(**fields: object) -> ServeSettings:
    return ServeSettings(server=replace(ServerOptions(), **fields))


def test_bad_tls_options_are_one_clear_error(pki: Path, tmp_path: Path):
    cert, key = str(pki / "server.pem"), str(pki / "server.key")
    # the server's key encrypted with a pass phrase: refused, never a prompt on the terminal
    plain = serialization.load_pem_private_key((pki / "server.key").read_bytes(), None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        plain.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pass phrase"),
        )
    )
    cases = {
        "--ssl-keyfile needs --ssl-certfile": _settings(ssl_keyfile=key),
        "--ssl-cert-reqs 2 needs --ssl-certfile": _settings(ssl_cert_reqs=2),
        "--ssl-cert-reqs 2 checks client certificates: give --ssl-ca-certs": _settings(
            ssl_certfile=cert, ssl_keyfile=key, ssl_cert_reqs=2
        ),
        f"--ssl-keyfile {tmp_path}/missing.key: No such file or directory": _settings(
            ssl_certfile=cert, ssl_keyfile=str(tmp_path / "missing.key")
        ),
        # the client's key with the server's certificate
        "the key does not match the certificate (KEY_VALUES_MISMATCH)": _settings(
            ssl_certfile=cert, ssl_keyfile=str(pki / "client.key")
        ),
        "as the TLS certificate and key: not PEM files": _settings(ssl_certfile=cert, ssl_keyfile=str(pki / "ca.pem")),
        "--ssl-ca-certs": _settings(ssl_certfile=cert, ssl_keyfile=key, ssl_ca_certs=key),
        "the grpc front-end's own port": _settings(ssl_certfile=cert, ssl_keyfile=key, frontend=("openai", "grpc")),
        "the key is encrypted with a pass phrase, and encrypted keys are not supported": _settings(
            ssl_certfile=cert, ssl_keyfile=str(encrypted)
        ),
    }
    for expected, settings in cases.items():
        with pytest.raises(LLMPError) as error:
            _check_tls(settings)
        assert expected.lower() in str(error.value).lower(), (expected, str(error.value))
    _check_tls(_settings(ssl_certfile=cert, ssl_keyfile=key, ssl_ca_certs=str(pki / "ca.pem"), ssl_cert_reqs=1))


def test_a_mismatched_key_stops_llmp_serve_with_one_line(pki: Path):
    result = subprocess.run(
        [sys.executable, "-m", "llmp", "serve", "no-such-model", "--ssl-certfile", str(pki / "server.pem"),
         "--ssl-keyfile", str(pki / "client.key")],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"llmp: error: cannot use {pki / 'server.pem'} and {pki / 'client.key'} as the TLS certificate and key: "
        "the key does not match the certificate (KEY_VALUES_MISMATCH)"
    ], result.stderr
