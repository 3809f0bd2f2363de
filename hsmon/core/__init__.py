"""The monitor core: jobs and their ticks (monitor, job_runtime, job_document), the pure
rules that judge a job (state*), the configuration, the inotify glue and the engine check.
No I/O in the rules; no torch, transformers or sglang anywhere here."""
