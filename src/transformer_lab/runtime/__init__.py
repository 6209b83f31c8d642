"""How entry points start: the bootstrap, the warm interpreter, stage dependencies."""
