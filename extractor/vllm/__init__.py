"""vLLM, the second engine: `hsmon vllm-serve` (serve.py), drafters served by vLLM (drafts.py), vLLM's
layer-rule table (rule_table.py). The client side is extractor/backends/vllm/."""
