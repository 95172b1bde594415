"""The app's lifespan ended and begun again (as an in-process client does:
schemathesis' pytest plugin ends it after each test): the worker stopped by
the shutdown refuses new jobs with 503 at once instead of queueing them for a
thread that is gone, and a new startup serves again."""

from __future__ import annotations

from starlette.testclient import TestClient

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_a_stopped_worker_refuses_and_a_new_lifespan_serves_again(tiny_model):
    from rkc.runtime.serve.app import create_app

    app = create_app(tiny_model)
    with TestClient(app) as client:
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    stopped = app.state.worker
    assert stopped.stopped and not stopped.thread.is_alive()
    r = TestClient(app).post("/v1/chat/completions", json=CHAT)  # no lifespan: nobody restarted the worker
    assert r.status_code == 503 and r.json()["error"]["code"] == "server_shutdown"
    with TestClient(app) as client:  # started again
        assert app.state.worker is not stopped
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert not app.state.worker.thread.is_alive()
