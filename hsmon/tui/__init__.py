"""`hsmon tui`: the Textual dashboard. Part of the monitor: never imports torch or transformers."""
