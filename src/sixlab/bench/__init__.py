"""sixlab.bench."""
