"""Trackers: one module per thing the monitor watches. Each keeps its figures in memory, so that a
scrape or a status request never touches the filesystem."""
