"""sixlab.southbound."""
