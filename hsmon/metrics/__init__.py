"""Prometheus: the exporter's collectors (read the monitor's state at scrape time), the engine's
families (SGLang servers, GPUs) and the builders they share."""
