"""Backend `sglang`: hidden states from real SGLang servers over HTTP (see docs/extract.md).

Modules: ``options`` (the command-line options, light to import), ``preflight`` (server checks
before the first row), ``pool`` (spreading, retries, server pauses), ``transports`` (json and
shm decoding, the rows == tokens check), ``dumpdir`` (shm backpressure and orphans),
``backend`` (the Backend itself).
"""
