"""millm's structured output: ``response_format`` (constrained JSON) and function calling."""
