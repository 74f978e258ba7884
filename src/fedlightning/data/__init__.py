"""Federated data: sources, partitions and the FederatedDataModule."""

from fedlightning.lazy import lazy_exports

#: public name -> its module, imported on first use (fedlightning.lazy: no Lightning before)
EXPORTS = {
    "SOURCES": "fedlightning.data.sources",
    "DataSplit": "fedlightning.data.sources",
    "FederatedDataModule": "fedlightning.data.datamodule",
    "TensorBatches": "fedlightning.data.loader",
    "load_source": "fedlightning.data.sources",
}
__all__ = list(EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
