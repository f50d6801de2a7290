"""movement ops (being written)."""
__all__ = []
