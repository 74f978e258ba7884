"""Federated data: sources, partitions and the FederatedDataModule."""

from fedlightning.lazy import lazy_exports

#: public name -> its module, imported on first use (fedlightning.lazy: no Lightning before)
__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    ".sources": "SOURCES DataSplit load_source", ".datamodule": "FederatedDataModule",
    ".loader": "TensorBatches",
})  # fmt: skip
