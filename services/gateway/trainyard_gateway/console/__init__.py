"""The web console: server-rendered pages (Jinja2 + htmx) the gateway serves
at ``/``, behind the same login and role policy as the API.

:func:`trainyard_gateway.console.app.build_router` builds its routes;
:mod:`trainyard_gateway.console.assets` serves the vendored scripts and styles (and
the Swagger UI assets of ``/docs``), so nothing is loaded from a CDN.
"""
