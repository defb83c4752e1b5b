"""What exists only so that code written for the original Mesh TensorFlow
runs: its legacy operation classes, `mtf.utils`, `test_utils`,
`ops_with_redefined_builtins`, and the table that keeps this library's
former module paths importable (`moved_modules`).
"""
