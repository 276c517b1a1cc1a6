"""Scoring mode: next-token log-probabilities on ``/v1/completions`` and ``/v1/chat/completions``.

Everything scoring is here: ``protocol`` (its request and response models, the
source of ``docs/schemas/millm-scoring-api-v1.json``), ``serving`` (``ServingScoring``:
validation, tokenizing, the engine call, rendering) and ``engine`` (what an engine
is asked and answers, and the errors of scoring). The generation servings hand a
scoring request to ``ServingScoring``; nothing else branches on it.
"""
