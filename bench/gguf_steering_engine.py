"""GGUF steering overhead per token in the engine alone (no server): steered against unsteered.

The default model's GGUF file in this process (``GGUFEngine``), one thread; a control
vector at layer 15 against none, 128 greedy tokens per run, interleaved (ABBA) rounds,
median of the paired per-token ratios. A switch of vectors re-evaluates the prompt
(the KV prefix is not reused across it): that cost is counted here too.

    OMP_NUM_THREADS=1 python bench/gguf_steering_engine.py
"""

import statistics
import time

import numpy as np

from millm_engine_gguf.engine import GGUFEngine
from millm_engine_gguf.settings import SETTINGS
from millm_engine_gguf.spec import describe
from millm_host.api import LayerHook, SamplingParams
from millm_host.default_model import default_model_path
from millm_host.settings import HOST_SETTINGS, Settings

e = GGUFEngine.load(
    describe(str(default_model_path())),
    Settings(
        (*HOST_SETTINGS, *SETTINGS), environ={"GGUF_N_CTX": "512", "GGUF_N_THREADS": "1", "GGUF_N_THREADS_BATCH": "1"}
    ),
    lambda _: None,
)
ids = e.tokenize("The history of the lighthouse begins with")
v = np.random.default_rng(0).standard_normal(576).astype(np.float32)
hook = [LayerHook(15, "resid_post", lambda h, s: h + v, 100, vector=lambda: v)]
P = SamplingParams(max_tokens=128, temperature=0)


def run(h):
    t = time.perf_counter()
    n = 0
    for _tok in e.generate(ids, P, hooks=h):
        n += 1
        if n >= 128:
            break
    return (time.perf_counter() - t) / n


res = {"b": [], "s": []}
for r in range(9):
    for k in ("b", "s") if r % 2 else ("s", "b"):
        x = run(hook if k == "s" else [])
        if r:
            res[k].append(x)
pairs = [s / b for s, b in zip(res["s"], res["b"], strict=True)]
print(
    "budget 5%: per-token ms base {:.3f} steered {:.3f}; median paired ratio {:.4f}".format(
        1e3 * statistics.median(res["b"]), 1e3 * statistics.median(res["s"]), statistics.median(pairs)
    )
)
