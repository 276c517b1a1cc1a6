"""millm's operator web UI (``/ui``): pages built only on the server's public HTTP API and live feed."""
