"""BERT on Mesh TensorFlow: the model, its tokenizer, optimizer and the
pre-training, classification and SQuAD programs (`mesh_tensorflow.bert.bert`,
`.tokenization`, `.optimization`, `.run_pretraining`, `.run_classifier`,
`.run_squad`).

Training runs on `mtf.training.Trainer` (TF2) instead of TPUEstimator; see
docs/bert.md.

Example:
  >>> from mesh_tensorflow.bert import bert as bert_lib
  >>> config = bert_lib.BertConfig(vocab_size=100, d_model=32, num_blocks=2)
"""
