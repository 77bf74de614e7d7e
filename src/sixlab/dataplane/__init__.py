"""sixlab.dataplane."""
