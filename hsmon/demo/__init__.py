"""`make demo` (`python -m hsmon.demo`): extraction, daemon, dashboard, drafter training and its
acceptance, on the embedded default target.

    python -m hsmon.demo [DIR] [--headless] [--no-train] [--train-seconds S] [--interval SECONDS]

1. A real `hsmon extract` on a sample dataset (the extraction demo's), watched by a real
   `hsmon daemon` on a free loopback port with a fresh control token, and the TUI on that daemon.
2. Once the daemon says the extraction is done: an EAGLE-3 drafter training, launched through the
   daemon's `POST /api/v1/train` with the token, exactly as the TUI's Launch button does (so it
   is a job the daemon and the TUI watch), time-boxed for a demo and on one torch thread.
3. Once it is done: `hsmon eval-drafter` on a few held-out prompts (docstrings of standard-library
   files neither the sample nor the target's corpus has), the drafter beside the n-gram drafter.
4. A summary: the extraction, the training, the acceptance lengths at depths 1 and 7.

With `--headless` (or when stdout is not a terminal, as in CI) it prints a status line per job
every few seconds instead of the TUI, and exits 0 when every step went through. `--no-train`
stops after the extraction. The torch side (building the target, writing the datasets, training,
evaluating) runs in child processes, so this process, which hosts the TUI, never imports torch.

The package's parts: `prepare` (the child's set-up: target, sample dataset, held-out prompts),
`pipeline` (the steps after the start, in a thread), `report` (headless status lines and the
summary), `cli` (the command: processes, TUI or headless, the verdict).
"""
