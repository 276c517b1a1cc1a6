"""Browse Hub: anonymous, read-only reads of probe definitions on the Hugging Face Hub, and their routes."""
