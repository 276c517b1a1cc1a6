"""An unload issued while an SAE attaches (issue 35): the unload never waits for it, and nothing attaches.

Attaching reads the SAE's weights and converts them to float32 on the model's device, on
a worker thread, holding no place in the queue. Here that conversion is held for
``CONVERT_S`` (the app is in-process, served over real HTTP, so the test slows that one
function down). An unload issued meanwhile returns at once; the attach then answers
``503 model_busy`` saying nothing was attached; the SAE is not attached, in memory or in
the desired state, and once the model is loaded again it attaches as usual.
"""

from __future__ import annotations

import threading
import time

import pytest

from millm_host.testing import assert_error
from millm_host.testing.replicas import wait_until

GRACE_S = 3.0
CONVERT_S = 1.5


@pytest.fixture(scope="module")
def server(app_factory, tiny_model_dir, sae_root):
    env = {"MILLM_SAE_DIRS": str(sae_root), "GRACEFUL_UNLOAD_TIMEOUT": str(GRACE_S)}
    return app_factory(plugins="all", checkpoint=tiny_model_dir, env=env)


def test_an_unload_while_an_sae_attaches(server, sae_dir, monkeypatch):
    from millm_steering import sae

    convert = sae.load

    def slowly(*args):
        time.sleep(CONVERT_S)
        return convert(*args)

    monkeypatch.setattr(sae, "load", slowly)
    model_id = server.model_id
    with server.http(timeout=60) as http:
        path = sae_dir("unload-race")
        assert http.post("/api/saes", json={"path": str(path), "sae_id": "unload-race"}).status_code == 200
        answer: dict = {}
        attaching = threading.Thread(target=lambda: answer.update(r=http.post("/api/saes/unload-race/attach")))
        attaching.start()
        time.sleep(0.3)  # its weights are loading
        began = time.monotonic()
        unload = http.post(f"/api/models/{model_id}/unload")
        took = time.monotonic() - began
        assert unload.status_code == 200, unload.text
        assert attaching.is_alive(), f"the unload waited for the attach ({took:.1f} s)"
        assert took < GRACE_S, f"the unload took {took:.1f} s"
        attaching.join(30)
        error = assert_error(answer["r"], 503, "model_busy")
        assert "began to unload" in error["message"] and "nothing was attached" in error["message"], error
        assert http.get("/api/health").json()["status"] == "no_model"
        assert http.get("/api/saes/unload-race").json()["attached"] == []

        assert http.post(f"/api/models/{model_id}/load").status_code == 200
        wait_until(lambda: http.get("/api/health").json()["replica"]["converged"], "convergence after the load")
        assert http.get("/api/saes/unload-race").json()["attached"] == []  # nor attached by convergence
        body = {"model": model_id, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        assert http.post("/v1/chat/completions", json=body).status_code == 200
        monkeypatch.setattr(sae, "load", convert)
        attached = http.post("/api/saes/unload-race/attach")
        assert attached.status_code == 200 and attached.json()["model"] == model_id, attached.text
