"""reduction ops (being written)."""
__all__ = []
