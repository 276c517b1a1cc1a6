"""millm's HuggingFace transformers engine."""
