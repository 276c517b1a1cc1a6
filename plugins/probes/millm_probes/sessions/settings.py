"""The settings of sessions, transcripts, retention and the live feed (names as the spec gives them)."""

from millm_host.api import Setting

SESSION_SETTINGS = (
    Setting(
        "PROBE_SESSIONS",
        bool,
        True,
        "Group monitored requests into sessions (off: no session lookup, no turns, no X-miLLM-Session-Id)",
    ),
    Setting("PROBE_SESSION_IDLE_MINUTES", float, 30.0, "A recognised session idle this long ends"),
    Setting("PROBE_TRANSCRIPTS", bool, False, "Keep each monitored chat turn's newest user message and visible reply"),
    Setting("PROBE_TRANSCRIPT_MAX_AGE_DAYS", float, 7.0, "How long transcript text and decoded context are kept"),
    Setting("PROBE_TRANSCRIPT_MAX_TURNS", int, 10000, "Most turns whose transcript text is kept, over all sessions"),
    Setting(
        "PROBE_EVENT_MAX_AGE_DAYS",
        float,
        30.0,  # four whole weeks of traffic to prove a bar on, without keeping who said what for ever
        "How long verdicts and sessions are kept (0: until deleted)",
    ),
    Setting("PROBE_RETENTION_INTERVAL_S", float, 600.0, "Seconds between background retention passes"),
    Setting("PROBE_FEED_QUEUE", int, 256, "Messages the live feed holds per client; past it the oldest is dropped"),
)
