"""sixlab.testbed."""
