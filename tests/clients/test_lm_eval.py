"""EleutherAI's lm-evaluation-harness: ``local-completions`` and ``local-chat-completions`` against millm.

The tasks are made here (a task YAML over local JSON lines, no dataset download) and run
in-process through ``lm_eval.simple_evaluate``. Both tasks are also run with lm-eval's own
``hf`` model on the very checkpoint the server serves: the loglikelihoods millm returns
(``echo`` with ``logprobs``) must equal the ones transformers computes, and its greedy
generations the ones transformers generates.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

# The tiny random model picks the right answer in the last two only: an accuracy of 0.5 to compare.
MC_DOCS = [
    {"question": "The capital of France is", "choices": ["Paris", "Rome"], "answer": 0},
    {"question": "Two plus two is", "choices": ["three", "four"], "answer": 1},
    {"question": "The colour of grass is", "choices": ["green", "blue"], "answer": 0},
    {"question": "Ice is", "choices": ["cold", "hot"], "answer": 0},
]
GEN_DOCS = [{"question": "What is the capital of Italy?", "answer": "Rome"}, {"question": "Say hi.", "answer": "hi"}]


def task_yaml(name: str, data: Path, cache: Path, **fields: Any) -> str:
    """A task over ``data`` (JSON lines); ``datasets`` caches its Arrow copy under ``cache``."""
    body = {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}, "cache_dir": str(cache)},
        "test_split": "test",
        **fields,
    }
    return json.dumps(body)  # JSON is YAML, and needs no quoting rules


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A TaskManager that knows only the two tasks made here (indexing lm-eval's own thousands is slow)."""
    from lm_eval.tasks import TaskManager

    folder = tmp_path_factory.mktemp("lm-eval-tasks")
    cache = folder / "datasets-cache"
    for name, docs in (("mc", MC_DOCS), ("gen", GEN_DOCS)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    mc = task_yaml(
        "millm_mc",
        folder / "mc.jsonl",
        cache,
        output_type="multiple_choice",
        doc_to_text="{{question}}",
        doc_to_choice="{{choices}}",
        doc_to_target="{{answer}}",
        metric_list=[{"metric": "acc"}],
    )
    gen = task_yaml(
        "millm_gen",
        folder / "gen.jsonl",
        cache,
        output_type="generate_until",
        doc_to_text="Q: {{question}}\nA:",
        doc_to_target="{{answer}}",
        generation_kwargs={"until": ["\n"], "max_gen_toks": 6, "do_sample": False},
        metric_list=[{"metric": "exact_match"}],
    )
    (folder / "millm_mc.yaml").write_text(mc)
    (folder / "millm_gen.yaml").write_text(gen)
    return TaskManager(include_path=str(folder), include_defaults=False)


def evaluate(tasks: Any, names: list[str], lm: Any, **model_args: Any) -> dict[str, Any]:
    """The tasks ``names`` through ``lm``: an lm-eval model's name (``local-completions``, ...) or instance."""
    import lm_eval

    results = lm_eval.simple_evaluate(
        model=lm,
        model_args=model_args,
        tasks=names,
        task_manager=tasks,
        bootstrap_iters=0,
        apply_chat_template=lm == "local-chat-completions",
    )
    assert results is not None
    return dict(results)


def loglikelihoods(results: dict[str, Any], task: str) -> list[list[float]]:
    """Per document, per choice: the continuation's loglikelihood."""
    samples = sorted(results["samples"][task], key=lambda sample: sample["doc_id"])
    return [[resp[0][0] for resp in sample["resps"]] for sample in samples]


def generations(results: dict[str, Any], task: str) -> list[str]:
    """Per document, the text generated."""
    samples = sorted(results["samples"][task], key=lambda sample: sample["doc_id"])
    return [sample["resps"][0][0] for sample in samples]


@pytest.fixture(scope="module")
def served(server: Any, tiny_model_dir: Path) -> dict[str, Any]:
    """``local-completions`` arguments for the server (tokenizer read from the served checkpoint)."""
    return {
        "model": server.model_id,
        "base_url": f"{server.v1}/completions",
        "tokenizer_backend": "huggingface",
        "tokenizer": str(tiny_model_dir),
        "max_retries": 1,
    }


@pytest.fixture(scope="module")
def reference(tasks: Any, tiny_model_dir: Path) -> dict[str, Any]:
    """Both tasks through lm-eval's ``hf`` model on the same checkpoint (loaded once)."""
    from lm_eval.models.huggingface import HFLM

    hf = HFLM(pretrained=str(tiny_model_dir), device="cpu", dtype="float32")
    return evaluate(tasks, ["millm_mc", "millm_gen"], hf)


# Token ids, four prompts to a request (as lm-eval is told to batch a capable server); and text, one at a time.
@pytest.mark.parametrize(("tokenized", "batch_size"), [(True, 4), (False, 1)], ids=["tokens", "text"])
def test_multiple_choice_matches_transformers(tasks, served, reference, tokenized, batch_size):
    results = evaluate(
        tasks, ["millm_mc"], "local-completions", **served, tokenized_requests=tokenized, batch_size=batch_size
    )
    ours, theirs = loglikelihoods(results, "millm_mc"), loglikelihoods(reference, "millm_mc")
    assert [len(doc) for doc in ours] == [len(doc["choices"]) for doc in MC_DOCS]
    for our_doc, their_doc in zip(ours, theirs, strict=True):
        assert our_doc == pytest.approx(their_doc, abs=1e-4)
    assert results["results"]["millm_mc"]["acc,none"] == reference["results"]["millm_mc"]["acc,none"] == 0.5


def test_generate_until_matches_transformers(tasks, served, reference):
    """Greedy, so the same checkpoint writes the same words (cut at lm-eval's ``until``)."""
    results = evaluate(tasks, ["millm_gen"], "local-completions", **served)
    replies = generations(results, "millm_gen")
    assert len(replies) == len(GEN_DOCS) and all(replies)
    assert replies == generations(reference, "millm_gen")


def test_chat_completions_generate_until(tasks, served):
    chat = {**served, "base_url": served["base_url"].replace("/completions", "/chat/completions")}
    results = evaluate(tasks, ["millm_gen"], "local-chat-completions", **chat)
    replies = generations(results, "millm_gen")
    assert len(replies) == len(GEN_DOCS) and all(isinstance(reply, str) for reply in replies)
