"""SGLang server side: `hsmon sglang-serve` (serve.py) and the capture plugin (plugin_root/).

Nothing here imports sglang or torch: the plugin runs inside SGLang's own environment.
"""
