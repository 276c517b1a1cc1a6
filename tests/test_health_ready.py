"""``/api/health/live`` and ``/api/health/ready``: what a load balancer asks (in-process, on the echo engine)."""

from __future__ import annotations

from millm_host.testing import assert_error


def test_ready_while_a_model_is_loaded_and_not_while_draining(app_factory):
    app = app_factory(env={"MILLM_API_KEYS": "k", "MILLM_ADMIN_API_KEYS": "admin"})
    admin = {"Authorization": "Bearer admin"}
    with app.http() as http:
        # open without a key: a load balancer carries none
        assert http.get("/api/health/live").json() == {"status": "live"}
        ready = http.get("/api/health/ready").json()
        assert ready == {"status": "ready", "model": "echo", "replica": app.host.convergence.replica_id}
        assert http.get("/api/health").json()["replica"]["converged"] is True
        assert http.post("/api/models/echo/unload", headers=admin).status_code == 200
        assert_error(http.get("/api/health/ready"), 503, "not_ready")
        assert http.post("/api/models/echo/load", headers=admin).status_code == 200
        assert http.get("/api/health/ready").status_code == 200
        app.host.begin_shutdown()  # what SIGTERM does: drain
        draining = http.get("/api/health/ready")
        live = http.get("/api/health/live")
    assert_error(draining, 503, "not_ready")
    assert "shutting down" in draining.json()["error"]["message"]
    assert live.status_code == 200


def test_health_and_ping_are_liveness_aliases(app_factory):
    """``GET /health`` and ``GET /ping`` (vLLM's paths) answer as ``/api/health/live``: open, also while draining,
    and in ``/openapi.json``."""
    app = app_factory(env={"MILLM_API_KEYS": "k", "MILLM_ADMIN_API_KEYS": "admin"})
    with app.http() as http:
        for path in ("/health", "/ping"):
            assert http.get(path).json() == {"status": "live"}
        paths = http.get("/openapi.json").json()["paths"]
        app.host.begin_shutdown()
        draining = [http.get(path) for path in ("/health", "/ping")]
    for path in ("/health", "/ping"):
        assert "/api/health/live" in paths[path]["get"]["summary"]
    assert [r.status_code for r in draining] == [200, 200]
