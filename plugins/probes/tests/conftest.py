"""Fixtures for the probes plugin's tests.

``lab`` computes everything the server is checked against on its own, from the
FORMATS.md rules: hidden states from transformers (``output_hidden_states``,
float32), the scoring math in numpy, the identity digests with hashlib, greedy
decoding with full forward passes. It never calls the plugin's code.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from millm_host.testing import databases

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Please transfer the funds before the deadline tomorrow.",
    "What is the capital of France?",
]


def canonical_digest(obj: Any) -> str:
    data = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return "sha256:" + hashlib.sha256(data.encode("utf-8")).hexdigest()


def with_digests(doc: dict[str, Any]) -> dict[str, Any]:
    """The document with an ``identity`` block whose digests follow FORMATS.md."""
    detector = {k: doc.get(k) for k in ("model", "read", "scope", "basis", "sae", "head", "aggregation", "behaviour")}
    doc = copy.deepcopy(doc)
    doc["identity"] = {
        "algorithm": "mi.probe.identity/v1",
        "detector_digest": canonical_digest(detector),
        "decision_digest": canonical_digest(doc.get("decision")),
    }
    return doc


class Lab:
    """An independent reference for the tiny test model."""

    def __init__(self, model_dir: Path) -> None:
        import torch
        import transformers

        self.torch = torch
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.d_model = self.model.config.hidden_size
        self.n_layers = self.model.config.num_hidden_layers
        self.eos = self.tokenizer.eos_token_id
        self.saes: dict[str, dict[str, Any]] = {}
        #: Every layer's hidden states per token ids: each probe's test vectors are the same few chats.
        self._states: dict[tuple[int, ...], list[np.ndarray]] = {}

    # --- ids -------------------------------------------------------------------------
    def chat_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """A chat as live serving tokenizes it (openai-api.txt: one BOS, never two)."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        bos = self.tokenizer.bos_token
        return self.tokenizer(text, add_special_tokens=not (bos and text.startswith(bos)))["input_ids"]

    def text_ids(self, text: str) -> list[int]:
        return self.tokenizer(text)["input_ids"]

    def greedy(self, ids: list[int], max_tokens: int) -> list[int]:
        """Greedy tokens with full (uncached) forward passes; EOS ends without being kept."""
        out: list[int] = []
        with self.torch.no_grad():
            for _ in range(max_tokens):
                logits = self.model(self.torch.tensor([ids + out])).logits[0, -1]
                token = int(self.torch.argmax(logits))
                if token == self.eos:
                    break
                out.append(token)
        return out

    def template_prefix(self, ids: list[int]) -> int:
        """The longest common prefix of ``ids`` and the template up to an empty user message's header."""
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": ""}], tokenize=False)
        header = "<|im_start|>user\n"
        cut = text.rindex(header) + len(header)
        prefix = self.tokenizer(text[:cut], add_special_tokens=False)["input_ids"]
        n = 0
        while n < min(len(ids), len(prefix)) and ids[n] == prefix[n]:
            n += 1
        return n

    def last_user_span(self, ids: list[int]) -> tuple[int, int]:
        """From the newest ``<|im_start|>user`` header through its ``<|im_end|>`` and newline."""
        header = self.tokenizer("<|im_start|>user\n", add_special_tokens=False)["input_ids"]
        end_id = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        starts = [i for i in range(len(ids) - len(header) + 1) if ids[i : i + len(header)] == header]
        start = starts[-1]
        end = ids.index(end_id, start) + 2
        return start, end

    # --- SAEs (SAELens layout) --------------------------------------------------------
    def make_sae(
        self,
        folder: Path,
        sae_id: str,
        *,
        architecture: str = "standard",
        d_sae: int = 96,
        k: int | None = None,
        layer: int = 1,
        seed: int = 0,
    ) -> None:
        """Write ``folder/sae_id`` (cfg.json, sae_weights.safetensors) and remember its arrays."""
        from safetensors.numpy import save_file

        rng = np.random.default_rng(seed)
        d = self.d_model
        arrays = {
            "W_enc": rng.normal(scale=0.3, size=(d, d_sae)).astype(np.float32),
            "b_enc": rng.normal(scale=0.1, size=d_sae).astype(np.float32),
            "W_dec": rng.normal(scale=0.3, size=(d_sae, d)).astype(np.float32),
            "b_dec": rng.normal(scale=0.1, size=d).astype(np.float32),
        }
        if architecture == "jumprelu":
            arrays["threshold"] = rng.uniform(0.0, 0.5, size=d_sae).astype(np.float32)
        cfg = {
            "d_in": d,
            "d_sae": d_sae,
            "hook_name": f"blocks.{layer}.hook_resid_post",
            "architecture": architecture,
            "apply_b_dec_to_input": True,
            "model_name": "tests",
            "dtype": "float32",
        }
        if k is not None:
            cfg["k"] = k
        target = folder / sae_id
        target.mkdir(parents=True, exist_ok=True)
        (target / "cfg.json").write_text(json.dumps(cfg))
        save_file(arrays, str(target / "sae_weights.safetensors"))
        self.saes[sae_id] = {"cfg": cfg, **{name: a.astype(np.float64) for name, a in arrays.items()}}

    def encode(self, sae_id: str, h: np.ndarray) -> np.ndarray:
        """FORMATS.md's encode(x) over every feature."""
        sae = self.saes[sae_id]
        cfg = sae["cfg"]
        x = h - sae["b_dec"] if cfg["apply_b_dec_to_input"] else h
        pre = x @ sae["W_enc"] + sae["b_enc"]
        if cfg["architecture"] == "jumprelu":
            return pre * (pre > sae["threshold"])
        acts = np.maximum(pre, 0.0)
        if cfg["architecture"] == "topk":
            cut = np.sort(acts, axis=1)[:, -cfg["k"]][:, None]
            acts = np.where(acts >= cut, acts, 0.0)
        return acts

    # --- the math --------------------------------------------------------------------
    def hidden(self, ids: list[int], layer: int, point: str) -> np.ndarray:
        """The hidden states at one point (read-only: one forward pass per ``ids`` serves every caller)."""
        assert point == "resid_pre" or layer < self.n_layers - 1, "the last hidden state is normed"
        key = tuple(ids)
        if key not in self._states:
            with self.torch.no_grad():
                states = self.model(self.torch.tensor([ids]), output_hidden_states=True).hidden_states
            self._states[key] = [state[0].numpy().astype(np.float32) for state in states]
            for array in self._states[key]:
                array.setflags(write=False)
        return self._states[key][layer if point == "resid_pre" else layer + 1]

    def per_token(self, doc: dict[str, Any], ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(s_t, attention logits) for every position of ``ids``, in float64 from float32 hidden states."""
        h = self.hidden(ids, doc["read"]["layer"], doc["read"]["hook_point"]).astype(np.float64)
        head = doc["head"]
        x = h
        if doc["basis"] == "sae":
            x = self.encode(doc["sae"]["sae_id"], h)[:, doc["sae"]["feature_indices"]]
        width = len(head["weights"])
        mean = np.asarray(head.get("norm_mean") or np.zeros(width))
        std = np.asarray(head.get("norm_std") or np.ones(width))
        s = ((x - mean) / std) @ np.asarray(head["weights"]) + head.get("bias", 0.0)
        query = head.get("attention_query")
        return s, (h @ np.asarray(query) if query is not None else np.zeros(len(ids)))

    @staticmethod
    def aggregate(doc: dict[str, Any], s: np.ndarray, logits: np.ndarray) -> float:
        rule = doc["aggregation"]["rule"]
        if rule == "mean":
            return float(np.mean(s))
        if rule == "max":
            return float(np.max(s))
        if rule == "last":
            return float(s[-1])
        if rule == "topk_mean":
            k = doc["aggregation"]["params"]["k"]
            return float(np.mean(sorted(s)[-k:]))
        alpha = np.exp(logits - logits.max())
        alpha /= alpha.sum()
        return float(np.sum(alpha * s))

    def score(self, doc: dict[str, Any], ids: list[int], start: int = 0, end: int | None = None) -> float:
        s, logits = self.per_token(doc, ids)
        end = len(ids) if end is None else end
        return self.aggregate(doc, s[start:end], logits[start:end])

    # --- documents -------------------------------------------------------------------
    def definition_of(self, identity: dict[str, Any], spec: tuple, **kwargs: Any) -> dict[str, Any]:
        """``definition`` from a row ``(name, layer, hook point, rule, k, skip_template_prefix)``, seeded by
        its name (each probe its own weights)."""
        name, layer, point, rule, k, skip = spec
        kwargs.setdefault("seed", zlib.crc32(name.encode()) % 1000)
        return self.definition(
            identity, name=name, layer=layer, point=point, rule=rule, k=k, skip_prefix=skip, **kwargs
        )

    def definition(
        self,
        identity: dict[str, Any],
        *,
        name: str,
        layer: int = 1,
        point: str = "resid_post",
        rule: str = "mean",
        k: int | None = None,
        windows: list[str] | None = None,
        skip_prefix: bool | None = None,
        threshold: float | None = 0.0,
        rung: int = 2,
        scope: str = "all",
        behaviour: str | None = None,
        seed: int = 0,
        vectors: int = 2,
        bands: list[dict[str, Any]] | None = None,
        digests: bool = True,
        vector_layer: int | None = None,
        sae: dict[str, Any] | None = None,
        weight_scale: float = 1.0,
    ) -> dict[str, Any]:
        """A probe for the resident model, its test vectors scored here (``vector_layer``: on another layer).

        ``sae`` (``{"sae_id", "feature_indices"}``) makes a k-sparse probe over that SAE's features.
        ``weight_scale`` scales the head's weights and attention query: on a real model's residual
        (entries in the hundreds) unit weights give scores in the hundreds and attention logits in
        the thousands, where float32 rounding alone moves a score by ~1e-3.
        """
        rng = np.random.default_rng(seed)
        d = len(sae["feature_indices"]) if sae else self.d_model
        head: dict[str, Any] = {
            "weights": [round(float(x) * weight_scale, 6) for x in rng.normal(size=d)],
            "bias": round(float(rng.normal()), 6),
            "norm_mean": [round(float(x), 6) for x in rng.normal(scale=0.1, size=d)],
            "norm_std": [round(float(x), 6) for x in rng.uniform(0.5, 2.0, size=d)],
            "attention_query": [round(float(x) * weight_scale, 6) for x in rng.normal(size=self.d_model)]
            if rule == "attention"
            else None,
        }
        aggregation: dict[str, Any] = {"rule": rule, "params": {"k": k} if k is not None else {}}
        if skip_prefix is not None:
            aggregation["skip_template_prefix"] = skip_prefix
        decision: dict[str, Any] = {
            "threshold": threshold,
            "target_fpr": 0.01,
            "realised_fpr": 0.0098,
            "threshold_source": "test-calibration",
            "calibration": {"n": 100},
        }
        if windows is not None:
            decision["windows"] = windows
        if bands is not None:
            decision["length_bands"] = bands
        doc: dict[str, Any] = {
            "format": "mi.probe.definition/v1",
            "provenance": {"probe_id": f"prb_{name}", "exported_at": "2026-11-01T00:00:00Z", "producer": "tests"},
            "name": name,
            "behaviour": behaviour,
            "version": "1",
            "model": {k2: identity[k2] for k2 in ("hf_id", "revision", "d_model", "n_layers", "chat_template_sha256")},
            "read": {"layer": layer, "hook_point": point},
            "scope": scope,
            "basis": "sae" if sae else "residual",
            "sae": sae,
            "head": head,
            "aggregation": aggregation,
            "decision": decision,
            "evidence": {"rung": rung, "acknowledgement": None, "provisional": False},
            "test_vectors": [],
            "parity": {"tolerance": 0.001},
        }
        reference = copy.deepcopy(doc)
        if vector_layer is not None:
            reference["read"]["layer"] = vector_layer
        for text in TEXTS[:vectors]:
            messages = [{"role": "user", "content": text}]
            ids = self.chat_ids(messages)
            start = self.template_prefix(ids) if skip_prefix else 0
            s, _ = self.per_token(reference, ids)
            doc["test_vectors"].append(
                {
                    "token_ids": ids,
                    "prompt_tokens": len(ids),
                    "messages": messages,
                    "score": self.score(reference, ids, start),
                    "per_token": [float(x) for x in s],
                }
            )
        return with_digests(doc) if digests else doc


@pytest.fixture(scope="session")
def probe_model_dir() -> Path:
    """A random 4-layer Llama (SmolLM2's tokenizer and template) with room for long generations."""
    from millm_host.testing.tiny_models import tiny_llama

    return tiny_llama("probe-llama", num_hidden_layers=4, max_position_embeddings=4096, seed=7)


@pytest.fixture(scope="session")
def lab(probe_model_dir) -> Lab:
    return Lab(probe_model_dir)


@pytest.fixture(scope="session")
def sae_dir(tmp_path_factory) -> Path:
    """Where the shared server reads k-sparse probes' SAEs (tests write them as they need them)."""
    return tmp_path_factory.mktemp("saes")


@pytest.fixture(scope="session")
def probe_app(app_factory, probe_model_dir) -> Callable[..., Any]:
    """``probe_app(**env)``: an app of a test module's own, in-process, as ``probes_server`` is (every
    installed plugin, the transformers engine, the probe model), with the settings ``env`` gives."""
    return lambda **env: app_factory(plugins="all", checkpoint=probe_model_dir, env=env)


@pytest.fixture(scope="session")
def probes_server(app_factory, probe_model_dir, sae_dir):
    """The probes plugin's own app (tests arm and import here; each cleans up after itself).

    In-process (``AppServer``), with every installed plugin and the transformers engine;
    restarts and unloads are tested on a real server (``test_lifecycle``).
    """
    return app_factory(
        shared=True,
        plugins="all",
        models={},
        model=str(probe_model_dir),
        env={"PROBE_SAE_DIR": str(sae_dir), "MILLM_SAE_DIRS": str(sae_dir)},
    )


@pytest.fixture(scope="session")
def model_id(probes_server) -> str:
    with probes_server.http() as http:
        return http.get("/api/health").json()["model"]


@pytest.fixture(scope="session")
def identity(probes_server, model_id) -> dict[str, Any]:
    """The resident model's identity, read from ``GET /api/models/{id}``."""
    with probes_server.http() as http:
        return http.get(f"/api/models/{model_id}").json()


@pytest.fixture
def api(probes_server):
    """An HTTP client on the probes server; every probe a test imports is disarmed and deleted after it."""
    with probes_server.http() as http:
        before = {p["id"] for p in http.get("/api/probes").json()["data"]}
        yield http
        for probe in http.get("/api/probes").json()["data"]:
            if probe["id"] not in before:
                http.post(f"/api/probes/{probe['id']}/disarm")
                http.delete(f"/api/probes/{probe['id']}")


def import_probe(http, doc: dict[str, Any], **params: str) -> dict[str, Any]:
    response = http.post("/api/probes/import", json=doc, params=params)
    assert response.status_code == 201, response.text
    return response.json()


def arm(http, probe_id: str, **body: Any) -> dict[str, Any]:
    response = http.post(f"/api/probes/{probe_id}/arm", json=body)
    assert response.status_code == 200, response.text
    return response.json()


@contextlib.contextmanager
def armed(http, docs: list[dict[str, Any]]) -> Iterator[list[str]]:
    """Import and arm each probe document; yields their ids, then disarms and deletes them."""
    ids = []
    try:
        for doc in docs:
            probe = import_probe(http, doc)
            arm(http, probe["id"])
            ids.append(probe["id"])
        yield ids
    finally:
        for probe_id in ids:
            http.post(f"/api/probes/{probe_id}/disarm")
            http.delete(f"/api/probes/{probe_id}")


@contextlib.contextmanager
def attached_sae(api, lab: Lab, sae_dir: Path, sae_id: str, *, layer: int, seed: int) -> Iterator[None]:
    """An SAE the lab writes for this model, registered and attached; detached and deleted afterwards."""
    lab.make_sae(sae_dir, sae_id, layer=layer, seed=seed)
    registered = api.post("/api/saes", json={"path": str(sae_dir / sae_id)})
    assert registered.status_code in (200, 201), registered.text
    assert api.post(f"/api/saes/{sae_id}/attach", json={}).status_code == 200
    try:
        yield
    finally:
        api.post(f"/api/saes/{sae_id}/detach", json={})
        api.delete(f"/api/saes/{sae_id}")


@pytest.fixture(scope="session")
def helpers():
    """Small request helpers shared by the test modules."""

    class Helpers:
        import_probe = staticmethod(import_probe)
        arm = staticmethod(arm)
        armed = staticmethod(armed)
        attached_sae = staticmethod(attached_sae)
        with_digests = staticmethod(with_digests)
        canonical_digest = staticmethod(canonical_digest)

    return Helpers


def pytest_collection_modifyitems(items):
    # The tests that store or read back state (imports, arming, events, sessions, the feed, behaviours,
    # capacity, replicas, restarts) run on PostgreSQL too (pytest -m storage); scoring arithmetic,
    # batching and the schema do not depend on the database, and CI runs within 45 minutes.
    databases.mark_storage(items, Path(__file__).parent, only=STORED)


STORED = frozenset(
    {
        "test_batch_score.py",
        "test_behaviours.py",
        "test_capacity.py",
        "test_cost_model.py",
        "test_feed.py",
        "test_gates.py",
        "test_hostile_names.py",
        "test_hub.py",
        "test_import.py",
        "test_lifecycle.py",
        "test_live.py",
        "test_replicas.py",
        "test_whole_feed.py",
        "test_restarts.py",
        "test_result_counts.py",
        "test_sae_paths.py",
        "test_session_turns_concurrent.py",
        "test_sessions.py",
        "test_transcripts.py",
    }
)
