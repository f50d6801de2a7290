"""ember.train: a Learner (fit loop with metrics, checkpoints, early stopping and a live
terminal dashboard), an in-memory DataLoader with seeded shuffling, datasets after Burn's
burn-dataset (CSV with typed columns, transforms, deterministic shuffles and train/valid
splits: ``dataset.py``), and checkpoint files.

>>> import ember
>>> from ember.train import DataLoader, TensorDataset
>>> len(DataLoader(TensorDataset(ember.zeros((10, 3))), batch_size=4))
3
"""
from .checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint  # noqa: F401
from .dashboard import LiveDashboard, LogLines, make_dashboard, sparkline  # noqa: F401
from .data import DataLoader, Dataset, TensorDataset, random_split  # noqa: F401
from .dataset import CsvDataset, InMemoryDataset, MappedDataset, SubsetDataset  # noqa: F401
from .learner import EarlyStopping, Learner, accuracy  # noqa: F401

__all__ = ["Learner", "EarlyStopping", "accuracy", "DataLoader", "Dataset", "TensorDataset", "random_split",
           "CsvDataset", "InMemoryDataset", "MappedDataset", "SubsetDataset",
           "save_checkpoint", "load_checkpoint", "latest_checkpoint", "LiveDashboard", "LogLines", "make_dashboard",
           "sparkline"]
