"""Pure-Python kernels for the neural-network ops (conv, pooling, norms, sort...)."""
KERNELS = {}
