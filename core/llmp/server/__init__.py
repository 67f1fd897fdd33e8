"""The HTTP server of ``llmp serve``: one FastAPI app that front-end plugins mount their routes on.

The server owns what every front-end shares: start-up and readiness, the
API key, CORS, request ids, body limits, ``/health``, ``/version`` and
``/metrics``. Front-ends own their protocol's routes (see ``llmp.api.Frontend``).
"""
