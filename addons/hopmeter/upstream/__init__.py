"""The synthetic LLM upstream (`hopmeter upstream`), a product feature.

`scenario` parses what a request asks for, `formats` writes OpenAI, Anthropic and Ollama events on
a token clock, `replay` plays recorded transcripts, `server` serves them. `hopmeter demo` (the
upstream, the proxy and sample streams in one process) is hopmeter.demo.
"""
