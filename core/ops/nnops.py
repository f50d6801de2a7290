"""Neural-network ops: activations, softmax, conv, pooling, normalization, attention, sort (being written)."""
__all__ = []
