"""The language core: named dimensions and shapes, layout rules, the graph of
mtf operations, and the random-number scheme that keeps results independent
of the layout. Nothing here creates a TensorFlow op for a processor.

    >>> from mesh_tensorflow.core.shapes import Dimension, Shape
    >>> Shape([Dimension("batch", 8), Dimension("d_model", 64)]).size
    512
"""
