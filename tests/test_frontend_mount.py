"""How ``llmp serve`` mounts several front-ends on one app: ``requires`` brings the front-ends
another one calls, ``root_priority`` decides who keeps ``/``, ``public_paths`` skip the API key.

The real app (build_app: gate, error handlers) and the real mounting code, with two small
front-ends registered in this process; the engine is not needed for routes like these.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from llmp import hookimpl, plugins
from llmp.api import FrontendSpec, LLMPError
from llmp.frontend import APIError
from llmp.options import FrontendOptions
from llmp.server.app import Limits, ServerState, build_app
from llmp.server.launch import _frontend_specs, _mount, early_error_renderers
from llmp.server.metrics import ServerMetrics

pytestmark = pytest.mark.usefixtures("clean_plugin_env")


class Banner:
    """Like Ollama's front-end: a banner at / (GET and HEAD) and an API route."""

    root_priority = 1
    public_paths = ("/api/version",)
    any_body_type_paths = ("/api/",)

    def __init__(self, engine: object, options: FrontendOptions) -> None:
        pass

    def http_router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_route("/", lambda: PlainTextResponse("banner"), methods=["GET", "HEAD"])
        router.add_api_route("/api/version", lambda: {"version": "1"}, methods=["GET"])
        router.add_api_route("/api/tags", lambda: {"models": []}, methods=["GET"])
        router.add_api_route("/api/echo", echo, methods=["POST"])
        return router

    async def serve(self) -> None:
        return None


async def echo(body: dict) -> dict:
    return body


class Page(Banner):
    """Like the web chat page: / and its assets, served without the key."""

    root_priority = 10
    public_paths = ("/", "/assets/")
    any_body_type_paths = ()

    def http_router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_route("/", lambda: PlainTextResponse("page"), methods=["GET"])
        router.add_api_route("/assets/app.js", lambda: PlainTextResponse("js"), methods=["GET"])
        return router


class FrontendsPlugin:
    @hookimpl
    def llmp_register_frontends(self):
        yield FrontendSpec(name="t-banner", impl="test_frontend_mount:Banner")
        yield FrontendSpec(name="t-page", impl="test_frontend_mount:Page", requires=("t-banner",))
        yield FrontendSpec(name="t-loop-a", impl="test_frontend_mount:Page", requires=("t-loop-b",))
        yield FrontendSpec(name="t-loop-b", impl="test_frontend_mount:Page", requires=("t-loop-a",))


@pytest.fixture
def registered():
    name = plugins.register(FrontendsPlugin(), name="t-frontends")
    yield
    plugins.unregister(name)


def test_requires_mounts_the_required_front_end_first(registered):
    assert [name for name, _ in _frontend_specs(("t-page",))] == ["t-banner", "t-page"]
    assert [name for name, _ in _frontend_specs(("t-banner", "t-page", "t-banner"))] == ["t-banner", "t-page"]


def test_a_cycle_of_requires_is_a_start_up_error(registered):
    with pytest.raises(LLMPError, match="cycle: t-loop-a -> t-loop-b -> t-loop-a"):
        _frontend_specs(("t-loop-a",))


def serve(frontends: list[tuple[str, type]], api_keys: list[str]) -> httpx.AsyncClient:
    state = ServerState()
    app = build_app(
        state,
        api_keys=api_keys,
        allowed_origins=[],
        allow_credentials=False,
        limits=Limits(max_body_bytes=1 << 20, overload_status=503),
        root_path="",
        docs=False,
        metrics=ServerMetrics("m"),
        health_timeout=1.0,
    )
    _mount(app, state, engine=None, frontends=frontends, options=FrontendOptions(served_model_names=("m",)))
    state.phase = "ready"
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")


def requests(frontends: list[tuple[str, type]], api_keys: list[str], calls: list[tuple]) -> list:
    async def run() -> list:
        async with serve(frontends, api_keys) as client:
            return [await client.request(method, path, **(extra[0] if extra else {})) for method, path, *extra in calls]

    return asyncio.run(run())


@pytest.mark.parametrize("order", [["banner", "page"], ["page", "banner"]])
def test_the_highest_root_priority_keeps_every_method_of_root(order):
    classes = {"banner": Banner, "page": Page}
    get, head, tags = requests(
        [(name, classes[name]) for name in order], [], [("GET", "/"), ("HEAD", "/"), ("GET", "/api/tags")]
    )
    assert get.text == "page"
    assert head.status_code == 405  # the banner's HEAD / went with its GET /: / is the page's alone
    assert tags.status_code == 200  # the banner's other routes stay


class NoLicence(Banner):
    def __init__(self, engine: object, options: FrontendOptions) -> None:
        raise RuntimeError("no licence key")


class NoRoutes(Banner):
    def http_router(self) -> APIRouter:
        raise KeyError("route table")


def test_a_front_end_that_raises_as_it_is_mounted_is_one_error_naming_it_and_its_plugin(registered):
    with pytest.raises(LLMPError) as raised:
        serve([("t-banner", NoLicence)], [])
    assert str(raised.value) == (
        "front-end 't-banner' (plugin t-frontends) failed while starting: RuntimeError: no licence key"
    )
    with pytest.raises(LLMPError, match=r"^front-end 'unlisted' failed while building its routes: KeyError"):
        serve([("unlisted", NoRoutes)], [])


class ShapedBanner(Banner):
    error_paths = ("/api/",)

    @staticmethod
    def render_error(error: APIError) -> tuple[int, dict]:
        return error.status, {"error": error.message}


class StatefulShape(ShapedBanner):
    error_paths = ("/stateful/",)

    def render_error(self, error: APIError) -> tuple[int, dict]:  # needs the built front-end
        return error.status, {"error": error.message}


def test_a_static_render_error_shapes_the_refusals_while_the_model_loads():
    state = ServerState()
    state.error_renderers = early_error_renderers([("shaped", ShapedBanner), ("stateful", StatefulShape)])
    loading = APIError(503, "the model is still loading")
    assert state.render_error("/api/tags", loading) == (503, {"error": "the model is still loading"})
    assert state.render_error("/stateful/x", loading) == (503, loading.body())  # not built yet: the default
    assert state.render_error("/v1/models", loading) == (503, loading.body())


@pytest.mark.parametrize("name", ["ollama", "anthropic"])
def test_the_protocols_with_their_own_errors_shape_them_while_loading(name):
    from llmp import registry

    cls = registry.get_component("frontend", name).load()
    assert cls.error_paths and [prefix for prefix, _ in early_error_renderers([(name, cls)])] == list(cls.error_paths)


class GoneAdapter(Banner):
    def http_router(self) -> APIRouter:
        router = APIRouter()

        async def generate() -> dict:
            from llmp.api import LoRAAdapterNotFoundError

            raise LoRAAdapterNotFoundError("Loading lora gone failed: No adapter found for /adapters/gone")

        router.add_api_route("/api/generate", generate, methods=["POST"])
        return router


def test_an_llmp_error_a_handler_raises_is_answered_and_not_raised_on():
    """Starlette re-raises what only the catch-all handler answers: uvicorn then logs a traceback and
    closes the connection (a LoRA adapter gone from disk did that, after its 404)."""
    (response,) = requests([("gone", GoneAdapter)], [], [("POST", "/api/generate")])
    assert response.status_code == 404 and "No adapter found" in response.json()["error"]["message"]


def test_alone_the_banner_keeps_root():
    (get,) = requests([("banner", Banner)], [], [("GET", "/")])
    assert get.text == "banner"


def test_public_paths_skip_the_api_key_and_nothing_else_does():
    page, asset, version, tags, prefix_only = requests(
        [("banner", Banner), ("page", Page)],
        ["secret"],
        [("GET", "/"), ("GET", "/assets/app.js"), ("GET", "/api/version"), ("GET", "/api/tags"), ("GET", "/assets")],
    )
    assert (page.text, asset.text, version.json()) == ("page", "js", {"version": "1"})
    assert tags.status_code == 401  # not public: the key is needed
    assert prefix_only.status_code == 401  # "/assets/" covers what is under it, not "/assets"


def test_any_body_type_paths_read_a_form_typed_body_as_json_unless_a_browser_sent_it():
    body = '{"model": "m"}'
    form = {"Content-Type": "application/x-www-form-urlencoded"}  # what `curl -d` sends
    curl, browser, typed = requests(
        [("banner", Banner)],
        [],
        [
            ("POST", "/api/echo", {"content": body, "headers": form}),
            ("POST", "/api/echo", {"content": body, "headers": {**form, "Origin": "http://evil.example"}}),
            ("POST", "/api/echo", {"content": body, "headers": {"Content-Type": "application/json"}}),
        ],
    )
    assert curl.json() == typed.json() == {"model": "m"}
    assert browser.status_code == 400 and "Unsupported Media Type" in browser.text


def test_without_any_body_type_paths_a_form_typed_body_is_refused():
    (refused,) = requests(
        [("page", Page)], [], [("POST", "/api/echo", {"content": "{}", "headers": {"Content-Type": "text/plain"}})]
    )
    assert refused.status_code == 400 and "Unsupported Media Type" in refused.text
