"""`hsmon regenerate`: the target answers the dataset's prompts again (docs/regenerate.md)."""
