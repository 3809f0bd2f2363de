"""The dashboard's screens: overview (a tab per job), training, help, confirmation."""
