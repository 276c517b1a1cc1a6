"""The settings the probes plugin reads (names as the spec gives them)."""

from millm_host.api import Setting

SETTINGS = (
    Setting(
        "PROBE_MAX_ARMED", int, 64, "Most probes armed at once, and scored per stateless request (a backstop, D83)"
    ),
    Setting(
        "PROBE_VERDICT_HEADER_MAX_BYTES",
        int,
        8192,
        "Byte cap of X-miLLM-Probe-Verdicts; past it whole behaviours are left out",
    ),
    Setting("PROBE_SCORE_MAX_INPUTS", int, 64, "Most inputs one POST /api/probes/score may carry"),
    Setting(
        "PROBE_SAE_DIR",
        str,
        None,
        "Directory of SAELens SAE directories (<dir>/<sae_id>/) that sae-basis probes encode with",
    ),
    Setting(
        "PROBE_OVERHEAD_WARN_MS", float, 5.0, "Per-request probe overhead above which GET /api/probes/status warns"
    ),
    # the cost budget (probe-monitors.txt, "Probe limits per model"; capacity/costs.py)
    Setting("PROBE_SLOWDOWN_BUDGET_PCT", float, 5.0, "Share of the model's own step time probes may add (percent)"),
    Setting("PROBE_BUDGET_HEADROOM", float, 0.9, "Fraction of the slowdown budget arming may fill"),
    Setting("PROBE_MAX_OVERHEAD_MS_PER_PASS", float, 0.25, "Fallback budget per generated token (ms) until measured"),
    Setting("PROBE_MAX_PREFILL_MS_PER_1K", float, 0.5, "Fallback budget per 1,000 prompt tokens (ms) until measured"),
    Setting(
        "PROBE_TAIL_INTERVAL_MS",
        float,
        250.0,
        "How often each process reads the results other processes stored (the feed and status cover them all)",
    ),
    Setting(
        "PROBE_MEASURE_TIMEOUT_S",
        float,
        300.0,
        "The longest a probe-capacity measurement runs before it stops (nothing stored); a tiny model measures in "
        "about a minute on 2 busy cores",
    ),
    Setting(
        "PROBE_FORCE_SERIAL",
        bool,
        False,
        "Run generations with armed probes alone, outside the continuous batch (default: they score inside it, "
        "with the scores they get alone; test_batched_equals_serial)",
    ),
    # Browse Hub (hub/): anonymous, read-only
    Setting(
        "PROBE_HUB_ENDPOINT",
        str,
        "https://huggingface.co",
        "The Hugging Face Hub that Browse Hub searches and imports from (read anonymously)",
    ),
    Setting("PROBE_HUB_TIMEOUT_S", float, 10.0, "Longest one Browse Hub read of the Hub may take, in seconds"),
)
