"""Pure domain logic of the management plane: no I/O, clocks are arguments."""
