"""Looking at layouts before running them: `cost_model` (estimated step time
and memory of a graph under a layout) and `layout_report` (what each tensor
costs under a layout, as text or a picture). The layout search lives in
`mesh_tensorflow.auto_mtf`.
"""
