"""Transformer models, data, vocabularies, gin configs and the command line.

Import the modules you need, e.g.

    >>> from mesh_tensorflow.transformer import transformer, vocabulary, dataset

`python -m mesh_tensorflow.transformer.main` trains, evaluates and decodes the
models from gin configs (see `utils.run`).
"""
