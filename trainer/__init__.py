"""`hsmon train`: the EAGLE-3 drafter trained on extracted hidden states."""
