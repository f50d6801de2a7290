"""linalg ops (being written)."""
__all__ = []
