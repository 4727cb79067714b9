"""The version of fastckpt, in one place."""
__version__ = "0.3.0"
