"""DeepSeek-V4's own protocol, pure and synchronous: messages -> prompt text (the native encoder, or a
model's jinja template), the tokenizer, the incremental output parser (reasoning, content, DSML tool
calls), and the grammar constraint (JSON schema, forced tool calls) as per-step token masks."""
