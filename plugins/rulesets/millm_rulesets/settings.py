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
    Setting(
        "RULE_CODE_CALL_WALL_MS",
        float,
        200.0,
        "Wall time of one operator-code (code_rule) call in the rule runner; past it the call is rule_timeout",
    ),
    Setting(
        "RULE_CODE_CALLS_PER_REQUEST",
        int,
        64,
        "Operator-code calls one stateless request (evaluate, validate, import) may make; the rest rule_worker_unavailable",
    ),
    Setting("RULE_CODE_FUEL", int, 50_000_000, "Fuel (wasm instructions, roughly) of one operator-code call"),
    Setting(
        "RULE_CODE_MEMORY_PAGES",
        int,
        64,
        "Memory of one operator-code call, in 64 KiB wasm pages (the text's included)",
    ),
    Setting("RULE_CODE_STACK_BYTES", int, 512 * 1024, "Wasm stack of one operator-code call, in bytes"),
    Setting(
        "RULE_CODE_MAX_INPUT_BYTES",
        int,
        1 << 20,
        "Longest text (UTF-8 bytes) operator code is given; longer is rule_input_too_large",
    ),
)
