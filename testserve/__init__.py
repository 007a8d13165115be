"""testserve: emulated LLM providers (Anthropic, OpenAI chat + Responses, Gemini, Ollama) for
meshfast's tests and benchmarks. Run with `python -m testserve`; the app is `testserve.app:app`."""

__version__ = "0.1.0"
