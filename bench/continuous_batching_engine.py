"""Continuous batching in-process, without HTTP: the transformers engine serial against continuous.

The default model (float32 checkpoint converted from the bundled GGUF, as
``continuous_batching.py`` finds it) loaded twice in this process, once per
``MILLM_BATCHING``. ``N`` greedy generations of ``--max-tokens`` tokens: one
after the other on the serial engine, on ``N`` threads at once on the continuous
one. Prints aggregate tokens/s and the ratio, per size, sizes in turn, each the
median of ``--runs``.

    OMP_NUM_THREADS=1 python bench/continuous_batching_engine.py [--runs 3] [--max-tokens 32] [--clients 1,4,8]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from continuous_batching import converted_checkpoint

from millm_host.api import ModelDescriptor, SamplingParams, Settings


def main() -> None:
    from millm_engine_transformers.engine import TransformersEngine

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--clients", default="1,4,8")
    args = parser.parse_args()
    sizes = [int(s) for s in args.clients.split(",")]
    descriptor = ModelDescriptor(id="default", path=str(converted_checkpoint()), format="hf", engine="transformers")
    engines = {
        mode: TransformersEngine.load(descriptor, Settings(environ={"MILLM_BATCHING": mode}), lambda message: None)
        for mode in ("serial", "continuous")
    }
    prompts = [
        engines["serial"].chat_ids([{"role": "user", "content": f"Write a long story about topic {i}."}])
        for i in range(max(sizes))
    ]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0)

    def generate(engine, ids) -> int:
        count = 0
        tokens = engine.generate(ids, params)
        for _ in tokens:
            count += 1
            if count >= params.max_tokens:
                break
        tokens.close()
        return count

    def rate(mode: str, size: int) -> float:
        engine, counts = engines[mode], [0] * size

        def work(index: int) -> None:
            counts[index] = generate(engine, prompts[index])

        start = time.perf_counter()
        if mode == "serial":
            for index in range(size):
                work(index)
        else:
            threads = [threading.Thread(target=work, args=(i,)) for i in range(size)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        return sum(counts) / (time.perf_counter() - start)

    results: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.runs):
        for size in sizes:
            for mode in engines:
                results.setdefault((mode, size), []).append(rate(mode, size))
    print(f"max_tokens={args.max_tokens} runs={args.runs} (tok/s, medians)")
    print(f"{'clients':>7} {'serial':>8} {'continuous':>10} {'ratio':>6}")
    for size in sizes:
        serial = statistics.median(results[("serial", size)])
        continuous = statistics.median(results[("continuous", size)])
        print(f"{size:>7} {serial:>8.1f} {continuous:>10.1f} {continuous / serial:>6.2f}")
    for engine in engines.values():
        engine.close()


if __name__ == "__main__":
    main()
