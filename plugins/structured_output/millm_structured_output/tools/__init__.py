"""Function calling: tools shown by the model's own template, replies parsed back into ``tool_calls``."""
