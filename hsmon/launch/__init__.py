"""Launching a drafter training and watching it as a job: one path for the daemon's control API and
the TUI's form.

    training.py  the request validated (every field, with the training defaults) and the training started
    paths.py     the one rule for every path a launch names: the allowed roots, held until use
    unit.py      under the daemon's systemd unit, the training as a transient unit of its own
    watch.py     launch and add the training to the monitor as a job; stop it
"""
