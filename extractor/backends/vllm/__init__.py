"""Backend `vllm`: hidden states from real vLLM servers (started by `hsmon vllm-serve`) over HTTP.

Modules: ``options`` (the run's options, light to import), ``preflight`` (the server checks before the
first row), ``dumps`` (vLLM's connector files: waited for, read, removed), ``final_norm`` (the model's
own final norm for the last layer), ``backend`` (the Backend itself; the pool, retries, pauses and the
rejects of the sglang client are shared).
"""
