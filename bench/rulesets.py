"""Rule sets: RE2 against Python's ``re`` on catastrophic backtracking, and a 20-signal set against
``RULE_TIME_BUDGET_MS``.

1. ``(a+)+$`` on ``"a" * n + "!"``: Python's ``re`` backtracks exponentially (each
   extra ``a`` doubles its time); the rulesets plugin compiles patterns with RE2,
   whose time is linear in the text. ``re`` runs in a child process killed after
   ``--re-timeout`` seconds, so the bench always ends.
2. A 20-signal set (patterns, the three validators, proximity, word lists) with
   its expressions, run the way live serving runs it (``evaluate``, every
   expression) on a ~4,000-token text; the median of ``--runs`` against the
   20 ms budget.

    python bench/rulesets.py [--runs 50] [--re-timeout 20]
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time

from millm_rulesets.document import parse
from millm_rulesets.evaluate import evaluate

EVIL = "(a+)+$"
BUDGET_MS = 20.0


def python_re_seconds(n: int, timeout: float) -> float | None:
    """Python ``re`` on the evil pattern in a child process; None when it ran past ``timeout``."""
    code = (
        "import re, time; t = time.perf_counter(); "
        f"re.search({EVIL!r}, 'a' * {n} + '!'); print(time.perf_counter() - t)"
    )
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, check=True)
    except subprocess.TimeoutExpired:
        return None
    return float(out.stdout)


def re2_seconds(n: int) -> float:
    rs = parse(
        {
            "format": "mi.ruleset/v1",
            "ruleset_id": "evil",
            "version": "1",
            "signals": {"evil": {"kind": "pattern", "pattern": EVIL}},
            "expressions": {"e": "evil"},
        }
    )
    text = "a" * n + "!"
    started = time.perf_counter()
    evaluate(rs, text)
    return time.perf_counter() - started


TWENTY = {
    "format": "mi.ruleset/v1",
    "ruleset_id": "bench-twenty",
    "version": "1",
    "signals": {
        "card": {"kind": "pattern", "pattern": r"\b(?:\d[ -]?){13,19}\b"},
        "card_ok": {"kind": "validator", "validator": "luhn", "span_of": "card"},
        "iban": {"kind": "pattern", "pattern": r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){3,7}(?: ?[A-Z0-9]{1,3})?\b"},
        "iban_ok": {"kind": "validator", "validator": "mod97", "span_of": "iban"},
        "iban_len": {
            "kind": "validator",
            "validator": "length_prefix_table",
            "span_of": "iban",
            "table": {"DE": 22, "FR": 27, "GB": 22, "NL": 18},
        },
        "email": {"kind": "pattern", "pattern": r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}"},
        "ssn": {"kind": "pattern", "pattern": r"\b\d{3}-\d{2}-\d{4}\b"},
        "ssn_near": {"kind": "proximity", "anchor": "ssn", "cues": ["ssn", "social security"], "within_chars": 40},
        "phone": {"kind": "pattern", "pattern": r"\+?\d{1,3}[ .-]?\(?\d{3}\)?[ .-]?\d{3}[ .-]?\d{4}"},
        "phone_near": {"kind": "proximity", "anchor": "phone", "cues": ["call", "phone", "mobile"], "within_chars": 30},
        "ipv4": {"kind": "pattern", "pattern": r"\b(?:\d{1,3}\.){3}\d{1,3}\b"},
        "url": {"kind": "pattern", "pattern": r"https?://[^\s]+"},
        "date": {"kind": "pattern", "pattern": r"\b\d{4}-\d{2}-\d{2}\b"},
        "postcode": {"kind": "pattern", "pattern": r"\b[A-Z]{1,2}\d[A-Z\d]? ?\d[A-Z]{2}\b"},
        "passport": {"kind": "pattern", "pattern": r"(?i)\bpassport\s*(?:no\.?|number)?\s*[A-Z0-9]{6,9}\b"},
        "threat": {
            "kind": "wordlist",
            "words": {"kill": 2.0, "bomb": 3.0, "attack": 1.5, "weapon": 2.0},
            "min_weight": 3.0,
        },
        "secrets": {"kind": "wordlist", "words": {"password": 1.0, "api key": 2.0, "token": 0.5, "secret": 1.0}},
        "evil": {"kind": "pattern", "pattern": EVIL},
        "caps": {"kind": "pattern", "pattern": r"\b[A-Z]{5,}\b"},
        "money": {"kind": "pattern", "pattern": r"[$€£]\s?\d+(?:[.,]\d{2})?"},
    },
    "expressions": {
        "pii": {"any": ["card_ok", "iban_ok", "email", "ssn_near", "phone_near", "passport"]},
        "iban_valid": {"all": ["iban_ok", "iban_len"]},
        "card_and_email": {"within_n": {"a": "card_ok", "b": "email", "n": 80}},
        "threat_words": "threat",
        "leaks": {"any": ["secrets", "url", "ipv4"]},
        "no_threat": {"not": "threat"},
        "evil_line": "evil",
        "shouting_money": {"all": ["caps", "money"]},
        "dated_pii": {"within_n": {"a": "date", "b": "email", "n": 100}},
        "where": {"any": ["postcode", "ipv4"]},
    },
}

WORDS = (
    "the a of to and in is it you that he was for on are with as I his they be at one have this from or had by "
    "word but what some we can out other were all there when up use your how said an each she which do their "
    "time if will way about many then them write would like so these her long make thing see him two has look "
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa kill attack password token SHOUTING $12.50 2026-11-02"
).split()
PLANTED = [
    "card 4111 1111 1111 1111",
    "iban DE89 3704 0044 0532 0130 00",
    "mail jane@example.org",
    "my ssn is 123-45-6789",
    "call +1 (555) 123-4567",
    "see https://example.org/x",
    "host 10.0.0.1",
]


def text_of_tokens(tokens: int) -> tuple[str, str]:
    """A text of about ``tokens`` tokens (counted by SmolLM2's tokenizer when it is at hand)."""
    rng = random.Random(0)
    words = [rng.choice(WORDS) for _ in range(tokens)]
    for i, planted in enumerate(PLANTED):
        words.insert((i + 1) * len(words) // (len(PLANTED) + 1), planted)
    text = " ".join(words)
    try:
        from transformers import AutoTokenizer

        from millm_host.testing.tiny_models import tiny_llama

        tokenizer = AutoTokenizer.from_pretrained(
            tiny_llama("probe-llama", num_hidden_layers=4, max_position_embeddings=4096, seed=7)
        )
        while len(tokenizer(text)["input_ids"]) > tokens:
            text = text[: int(len(text) * 0.98)]
        return text, f"{len(tokenizer(text)['input_ids'])} tokens (SmolLM2 tokenizer)"
    except Exception:  # no tokenizer here: about four characters a token
        return text[: tokens * 4], f"~{tokens} tokens ({tokens * 4} characters)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--re-timeout", type=float, default=20.0)
    args = parser.parse_args()

    print(f"1. {EVIL} on 'a' * n + '!'")
    print(f"{'n':>8} {'python re (s)':>14} {'re2 (s)':>10} {'re / re2':>10}")
    last_ratio = None
    for n in (18, 20, 22, 24, 26, 28):
        slow = python_re_seconds(n, args.re_timeout)
        fast = min(re2_seconds(n) for _ in range(5))
        ratio = slow / fast if slow is not None else None
        last_ratio = ratio or last_ratio
        slow_s = f"{slow:.3f}" if slow is not None else f">{args.re_timeout:.0f} (killed)"
        print(f"{n:>8} {slow_s:>14} {fast:>10.6f} {(f'{ratio:,.0f}x' if ratio else '-'):>10}")
        if slow is None:
            break
    big = 1_000_000
    print(f"{big:>8} {'(not tried)':>14} {min(re2_seconds(big) for _ in range(3)):>10.6f}  re2 stays linear")

    rs = parse(TWENTY)
    text, size = text_of_tokens(4000)
    evaluate(rs, text)  # warm-up
    times = []
    for _ in range(args.runs):
        started = time.perf_counter()
        got = evaluate(rs, text)
        times.append((time.perf_counter() - started) * 1000)
    median = statistics.median(times)
    fired = sorted(name for name, o in got.items() if o is not None and o.fires)
    print(f"\n2. {len(rs.signals)} signals, {len(rs.expressions)} expressions on {size}, {len(text)} characters")
    print(f"   median {median:.2f} ms, max {max(times):.2f} ms over {args.runs} runs; budget {BUDGET_MS:.0f} ms")
    print(f"   median / budget = {median / BUDGET_MS:.3f}; fired: {', '.join(fired)}")
    if last_ratio:
        print(f"\nratio python re / re2 at the largest n re finished: {last_ratio:,.0f}x")


if __name__ == "__main__":
    main()
