"""The core: argument checks, the parameter layout and its one owner, the lab's initial draws, the losses
and the saved-net file format.  It imports nothing of fastckpt but the kernels."""
