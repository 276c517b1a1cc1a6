"""The settings the rulesets plugin reads (names as the spec gives them)."""

from millm_host.api import Setting

SETTINGS = (
    Setting(
        "RULE_TIME_BUDGET_MS",
        float,
        20.0,
        "Time every attached rule signal of one request may take; a signal not started within it reports rule_timeout",
    ),
    Setting(
        "RULE_SIGNALS_ENABLED",
        bool,
        True,
        "Run attached rule signals beside armed probes; false reports rule_signals_disabled and keeps attachments",
    ),
)
