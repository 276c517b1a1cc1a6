"""From residuals to readings: capture on the device, the probes' math, windows, SAE encoders; every scorer uses it."""
