"""The OpenAPI file of the ``http`` listener: valid OpenAPI 3, and the routes it describes
are exactly the routes the server answers (router.http.api.ROUTES), both ways."""

from __future__ import annotations

import json

from openapi_spec_validator import validate

from router.http.api import ROUTES, match_route, openapi_document
from tests.harness import ROOT


def document() -> dict:
    return json.loads(openapi_document())


def test_the_openapi_file_validates():
    validate(document())


def test_docs_openapi_json_is_the_served_file():
    assert (ROOT / "docs" / "openapi.json").read_bytes() == openapi_document()


def test_every_served_route_is_described_and_every_described_route_served():
    described = {(method.upper(), path) for path, operations in document()["paths"].items()
                 for method in operations if method in ("get", "post", "put", "delete",
                                                       "patch")}
    served = {(route.method, route.path) for route in ROUTES}
    assert described == served


def test_each_described_path_reaches_its_own_route():
    """A concrete path made from each template is dispatched to that template's route (no
    route shadows another)."""
    for route in ROUTES:
        concrete = route.path.replace("{topic}", "a.b").replace("{id}", "42")
        found = match_route(route.method, concrete)
        assert found is not None and found[0] is route, (route, found)
