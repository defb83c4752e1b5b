"""mtf operations, one module per family. Everything is re-exported as `mtf.*`."""
