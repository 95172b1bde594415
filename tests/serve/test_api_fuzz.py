"""rkrun serve's HTTP API fuzzed from its own OpenAPI description
(runtime/serve/openapi.py, at /openapi.json) with schemathesis, in-process
against the ASGI app (tools/api_fuzz.py): requests that fit the schema and
requests that break it, seeded; none may be answered 5xx or raise out of the
app. The default run sends ~60 requests; the slow one >= 2,000."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("rkc_api_fuzz",
                                               Path(__file__).resolve().parents[2] / "tools/api_fuzz.py")
api_fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(api_fuzz)  # (by path: tools/ on sys.path could shadow tests' modules)
fuzz, tiny_app = api_fuzz.fuzz, api_fuzz.tiny_app


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    app = tiny_app(tmp_path_factory.mktemp("fuzz"))
    yield app
    app.state.worker.stop()


def _check(row: dict, at_least: int) -> None:
    print(f"\n{row['requests']} requests in {row['seconds']} s: " +
          ", ".join(f"{k}: {v}" for k, v in row["by"].items()))
    assert not row["server_errors"], row["server_errors"]
    assert all(int(k.rsplit(" ", 1)[1]) < 500 for k in row["by"])
    # a request outside the description is refused: the description and the checks agree
    for request in row["accepted_negatives"]:
        print("answered, though outside the description:", request)
    assert not [k for k in row["by"] if " negative 2" in k], "\n".join(row["accepted_negatives"])
    assert row["requests"] >= at_least
    for route in ("chat/completions", "/v1/completions"):  # both kinds of answer were reached
        assert any(route in k and k.endswith(" 200") for k in row["by"]), row["by"]
        assert any(route in k and k.endswith(" 400") for k in row["by"]), row["by"]


def test_the_description_is_served_and_matches_the_checks(app):
    import jsonschema
    from starlette.testclient import TestClient

    from rkc.runtime.serve import openapi, schema

    doc = TestClient(app).get("/openapi.json").json()
    assert doc == openapi.describe() and doc["openapi"].startswith("3.1")
    for path, kind in (("/v1/chat/completions", "chat"), ("/v1/completions", "completion")):
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert set(body["properties"]) == set(schema.CHAT if kind == "chat" else schema.COMPLETION)
        assert body["required"] == list(schema.REQUIRED[kind])
        # a null include_usage is "not given" to the checks, so the description allows it (CI's fuzz
        # found it answered 200 while the description said boolean only)
        given = {"messages": [{"role": "user", "content": "hi"}]} if kind == "chat" else {"prompt": "hi"}
        given["stream_options"] = {"include_usage": None}
        jsonschema.validate(given, body)
        assert TestClient(app).post(path, json={**given, "max_tokens": 1}).status_code == 200


def test_schema_fuzzing_finds_no_server_error(app):
    _check(fuzz(app, examples=15, seed=0), 60)


@pytest.mark.slow
def test_schema_fuzzing_2000_requests(app):
    _check(fuzz(app, examples=500, seed=1), 2000)
