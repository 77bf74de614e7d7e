"""sixlab.controller."""
