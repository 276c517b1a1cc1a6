"""Tokens/s of two llama-cpp-python builds on the same .gguf file: the portable build against another.

The requirements build llama.cpp for portable x86-64 (AVX2, FMA, F16C, BMI2; no
``-march=native``, no AMX: a native build's AMX path dies with SIGILL on CPUs
that list ``amx_*``). This measures what that costs against a native build
(``-DGGML_NATIVE=ON``, AVX-512 where the CPU has it) installed in another
interpreter, for example a venv::

    CMAKE_ARGS="-DGGML_NATIVE=ON" pip wheel llama-cpp-python==0.3.36 --no-deps \\
        --no-binary llama-cpp-python --no-cache-dir -w /tmp/native-wheel
    python -m venv /tmp/nativevenv
    /tmp/nativevenv/bin/pip install /tmp/native-wheel/*.whl numpy jinja2 diskcache typing-extensions
    python bench/llama_cpp_builds.py --other /tmp/nativevenv/bin/python [--runs 7] [--threads 1]

Each run loads the model in a fresh process of one interpreter and times a
prompt pass (``--prompt-tokens``) and a greedy generation (``--max-tokens``);
runs alternate between the interpreters (the order flips every run), and the
script prints each side's system info, medians and the ratio other / this.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def measure(model: str, threads: int, prompt_tokens: int, max_tokens: int) -> dict:
    """One run in this interpreter: prompt and generation tokens/s."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=model, n_ctx=2048, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False
    )
    prompt = (llm.tokenize(b"The quick brown fox jumps over the lazy dog. " * 200, add_bos=True))[:prompt_tokens]
    started = time.perf_counter()
    llm.eval(prompt)
    prompt_s = time.perf_counter() - started
    llm.reset()
    tokens = llm.generate(prompt[:16], temp=0.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0)
    started = time.perf_counter()
    for count, _ in enumerate(tokens, 1):
        if count >= max_tokens:
            break
    generation_s = time.perf_counter() - started
    tokens.close()
    info = llama_cpp.llama_print_system_info().decode().strip()
    llm.close()
    return {"prompt": len(prompt) / prompt_s, "generation": max_tokens / generation_s, "info": info}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", required=True, help="the interpreter with the other llama-cpp-python build")
    parser.add_argument("--model", help="a .gguf file (default: the bundled SmolLM2-135M-Instruct Q4_1)")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--one-run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.model is None:  # the other interpreter may have no millm: it always gets --model
        from millm_host.default_model import default_model_path

        args.model = str(default_model_path())
    if args.one_run:
        print(json.dumps(measure(args.model, args.threads, args.prompt_tokens, args.max_tokens)))
        return 0
    sides = {"this": sys.executable, "other": args.other}
    results: dict[str, list[dict]] = {name: [] for name in sides}
    command = [
        "-c",
        "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
        __file__,
        "--other",
        args.other,
        "--model",
        args.model,
        "--threads",
        str(args.threads),
        "--prompt-tokens",
        str(args.prompt_tokens),
        "--max-tokens",
        str(args.max_tokens),
        "--one-run",
    ]
    for run in range(args.runs):
        for name in sides if run % 2 == 0 else reversed(list(sides)):
            out = subprocess.run([sides[name], *command], capture_output=True, text=True, check=True).stdout
            results[name].append(json.loads(out.strip().splitlines()[-1]))
    print(
        f"model {args.model}, threads {args.threads}, prompt {args.prompt_tokens} tokens, "
        f"generation {args.max_tokens} tokens, {args.runs} runs each"
    )
    for name, rows in results.items():
        print(f"{name} ({sides[name]}): {rows[0]['info']}")
        for kind in ("prompt", "generation"):
            values = [r[kind] for r in rows]
            print(
                f"  {kind:10} median {statistics.median(values):8.1f} tok/s  runs "
                + " ".join(f"{v:.1f}" for v in values)
            )
    for kind in ("prompt", "generation"):
        paired = statistics.median(o[kind] / t[kind] for o, t in zip(results["other"], results["this"], strict=False))
        print(f"ratio other / this, {kind}: {paired:.3f} (median of paired runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
