"""millm steering: SAEs, live values, profiles, inline steering, X-miLLM-Steering and per-request SAE activations."""
