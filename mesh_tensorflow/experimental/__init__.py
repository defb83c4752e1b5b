"""Experimental modules: a 3-D U-Net whose
volume is split spatially across the mesh (`unet`), its augmentations
(`data_aug_lib`, `offline_data_aug`), input readers (`input_reader`) and a
train/eval driver (`model_executor`). See docs/unet3d.md.

    >>> from mesh_tensorflow.experimental import unet
"""
