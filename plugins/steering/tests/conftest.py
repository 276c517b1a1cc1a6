"""Fixtures of the steering tests: SAE directories and a tiny-model app whose state each test resets."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from millm_host.testing import databases
from millm_saelens.testing import write_sae

D_MODEL = 64  # the tiny model's hidden size
#: Lowered for the server so a request can exceed it on a 512-token model.
MAX_ENTRIES = 20000


@pytest.fixture(scope="session")
def sae_root(tmp_path_factory) -> Path:
    """The steering server's ``MILLM_SAE_DIRS``: every SAE the tests register lives here."""
    return tmp_path_factory.mktemp("saes")


@pytest.fixture(scope="session")
def sae_dir(sae_root) -> Callable[..., Path]:
    """``sae_dir(name, d_sae=..., layer=..., ...)``: a SAE directory written once per session per name."""
    root = sae_root
    made: dict[str, Path] = {}

    def make(name: str, **kwargs) -> Path:
        if name not in made:
            kwargs.setdefault("d_in", D_MODEL)
            kwargs.setdefault("d_sae", 256)
            kwargs.setdefault("layer", 0)
            made[name] = write_sae(root / name, **kwargs)
        return made[name]

    return make


@pytest.fixture(scope="session")
def steering_server(app_factory, tiny_model_dir, sae_root):
    """The app on the tiny model, of the steering tests' own (they change its state).

    In-process (``AppServer``), with every installed plugin and the transformers
    engine; a restart is tested on a real server (``test_management``).
    """
    return app_factory(
        shared=True,
        plugins="all",
        models={},
        model=str(tiny_model_dir),
        env={"SAE_ACTIVATIONS_MAX_ENTRIES": str(MAX_ENTRIES), "MILLM_SAE_DIRS": str(sae_root)},
    )


def reset(client: httpx.Client) -> None:
    """Back to nothing: no live values, profile, cluster, circuit, attachment, registration or lock."""
    for circuit in client.get("/api/circuits").json()["data"]:
        client.delete(f"/api/circuits/{circuit['circuit_id']}").raise_for_status()
    for cluster in client.get("/api/clusters").json()["data"]:
        client.delete(f"/api/clusters/{cluster['cluster_id']}").raise_for_status()
    client.delete("/api/steering").raise_for_status()
    client.post("/api/profiles/deactivate").raise_for_status()
    client.delete("/api/steering/lock").raise_for_status()
    for profile in client.get("/api/profiles").json()["data"]:
        client.delete(f"/api/profiles/{profile['name']}").raise_for_status()
    for sae in client.get("/api/saes").json()["data"]:
        if sae["attached"]:
            client.post(f"/api/saes/{sae['sae_id']}/detach").raise_for_status()
        client.delete(f"/api/saes/{sae['sae_id']}").raise_for_status()


@pytest.fixture
def server(steering_server) -> Iterator:
    """The steering server, reset before the test."""
    with steering_server.http() as client:
        reset(client)
    yield steering_server


@pytest.fixture
def client(server) -> Iterator[httpx.Client]:
    with server.http() as c:
        yield c


@pytest.fixture
def model_id(client) -> str:
    return client.get("/api/health").json()["model"]


@pytest.fixture
def attach(client, sae_dir) -> Callable[..., dict]:
    """``attach(sae_id, name=..., layer=None, **sae_kwargs)``: register a SAE directory and attach it."""

    def register_and_attach(sae_id: str, *, name: str | None = None, layer: int | None = None, **kwargs) -> dict:
        path = sae_dir(name or sae_id, **kwargs)
        if client.get(f"/api/saes/{sae_id}").status_code == 404:
            client.post("/api/saes", json={"path": str(path), "sae_id": sae_id}).raise_for_status()
        response = client.post(f"/api/saes/{sae_id}/attach", json={} if layer is None else {"layer": layer})
        response.raise_for_status()
        return response.json()

    return register_and_attach


def pytest_collection_modifyitems(items):
    # The tests that store state (SAEs, profiles, clusters, circuits, the lock, restarts) run on
    # PostgreSQL too (pytest -m storage); the arithmetic of steering does not depend on the database,
    # and the whole folder twice kept CI past its 45 minutes.
    databases.mark_storage(items, Path(__file__).parent, only=STORED)


STORED = frozenset(
    {
        "test_management.py",
        "test_clusters.py",
        "test_circuits.py",
        "test_lifecycle.py",
        "test_hostile_names.py",
        "test_labels.py",
    }
)
