"""One chat client for every LLM-backed stage (OpenAI-compatible endpoints incl. vLLM, or
local transformers), plus a launcher for a vLLM OpenAI-compatible server."""
