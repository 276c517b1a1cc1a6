"""millm's GGUF engine: .gguf files served through llama-cpp-python."""
