"""Weights I/O: safetensors (read and write), PyTorch checkpoints (read, without torch and
without executing any pickled code) and GGUF (read; quantized tensors stay quantized).
Importing ``ember.io`` imports neither numpy nor torch.

>>> import ember
>>> sd = ember.io.load_safetensors(ember.io.save_safetensors({"w": ember.tensor([1.0])}))
>>> sd["w"].tolist()
[1.0]
"""
from .safetensors import SafeTensors, load_safetensors, save_safetensors  # noqa: F401
from .torch import load_torch  # noqa: F401
from .gguf import GGUFFile, load_gguf  # noqa: F401

__all__ = ["load_safetensors", "save_safetensors", "SafeTensors", "load_torch", "load_gguf", "GGUFFile"]
