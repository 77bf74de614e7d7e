"""sixlab.ilnp."""
