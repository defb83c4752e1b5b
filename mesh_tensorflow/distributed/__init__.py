"""Meshes over several processes and hosts: `cluster` (connecting, resolving
the cluster, watching workers) and `launch` (`python -m mesh_tensorflow.launch`,
one process per host).
"""
