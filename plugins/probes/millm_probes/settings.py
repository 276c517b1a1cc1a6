"""The settings the probes plugin reads (names as the spec gives them)."""

from millm_host.api import Setting

SETTINGS = (
    Setting("PROBE_MAX_ARMED", int, 4, "Most probes armed at once (the arming gate 'limit')"),
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
)
