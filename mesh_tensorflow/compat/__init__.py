"""What exists only so that code written for the original Mesh TensorFlow
runs: its module paths (`original_paths`), its `ops` namespace
(`original_ops`), its legacy operation classes, its names on the lowering
(`lowering`, mixed into the implementations at its paths `placement_mesh_impl`
and `simd_mesh_impl`), its checkpoint format (`original_checkpoint`),
`mtf.utils`, `test_utils` and `ops_with_redefined_builtins`.
"""
