"""hsmon: extract hidden states for EAGLE-3 drafters, watch the job, warn, and train the drafter."""

__version__ = "0.1.0"
