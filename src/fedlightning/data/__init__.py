"""Federated data: sources, partitions and the FederatedDataModule."""

from fedlightning.data.datamodule import FederatedDataModule
from fedlightning.data.loader import TensorBatches
from fedlightning.data.sources import SOURCES, DataSplit, load_source

__all__ = ["SOURCES", "DataSplit", "FederatedDataModule", "TensorBatches", "load_source"]
