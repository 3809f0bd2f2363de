"""`hsmon extract`: hidden states from a target model into SpecForge-layout chunks."""
