"""`rkrun serve`: an LLM rkbin behind an OpenAI-compatible HTTP API (app.py),
one NPU thread behind a bounded queue (worker.py), a chat page (static/)."""
