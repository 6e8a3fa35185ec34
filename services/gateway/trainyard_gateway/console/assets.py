"""Static assets shipped inside the package: the console's own stylesheet and
script, and the vendored htmx, its SSE extension and Swagger UI
(versions and licences in ``static/vendor/README.md``).  Served at
``/static/`` without credentials, so the login page and ``/docs`` work on a
machine with no internet."""

from __future__ import annotations

from pathlib import Path

from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).parent / "static"
STATIC_URL = "/static"
SWAGGER = f"{STATIC_URL}/vendor/swagger-ui"


class CachedStaticFiles(StaticFiles):
    """Static files with a short browser cache: assets change only with a release."""

    def file_response(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        response = super().file_response(*args, **kwargs)
        response.headers.setdefault("Cache-Control", "public, max-age=3600")
        return response


def static_files() -> StaticFiles:
    return CachedStaticFiles(directory=STATIC_DIR)


def swagger_page(openapi_url: str, title: str) -> HTMLResponse:
    """Swagger UI from the vendored assets (FastAPI's default loads them from a CDN)."""
    return get_swagger_ui_html(
        openapi_url=openapi_url,
        title=title,
        swagger_js_url=f"{SWAGGER}/swagger-ui-bundle.js",
        swagger_css_url=f"{SWAGGER}/swagger-ui.css",
        swagger_favicon_url=f"{SWAGGER}/favicon-32x32.png",
        oauth2_redirect_url="/docs/oauth2-redirect",
    )


def swagger_oauth2_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()
