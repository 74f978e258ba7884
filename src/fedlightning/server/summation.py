"""Exact weighted sums on any device: float64 where the device has it, else compensated float32.

The server combines state_dicts on the device its tensors live on (docs/algorithms.md section 2.1,
"Where and how exactly the server computes"). The rule, per device:

- **float64** (CPU, CUDA, every device torch gives float64): ``sum_i c_i x_i`` accumulates in
  float64 and is rounded once to the entry's dtype. The result is within one rounding of the exact
  sum for any order of the clients.
- **compensated float32** (devices without float64, e.g. Apple's MPS): each product ``c_i x_i``
  is split into an exactly representable float32 pair (Dekker's product with Veltkamp's
  splitting, the coefficient carried as a float32 pair ``c_hi + c_lo``), and the terms are summed
  with an error-free two-sum whose rounding errors accumulate in a second float32 tensor
  (Neumaier / Ogita-Rump-Oishi ``Sum2``). The sum is as accurate as one computed in twice
  float32's precision and rounded once: ``|result - S| <= u|S| + O(n u^2) sum_i |c_i x_i|`` with
  ``u = 2^-24``, the float32 mean to within float32 rounding even where a naive float32 sum loses
  its digits to cancellation. Inputs must stay below about ``8e34`` in magnitude (Veltkamp's
  splitting multiplies by ``4097``); model weights are many orders of magnitude smaller.

Everything else the server computes "in float64" (server optimizer steps, SCAFFOLD's ``c``,
InCo's cross-layer update, FedCross's similarities) uses :func:`wide`: float64 where the device has
it, float32 otherwise. On a device with float64 every function here performs exactly the
operations the CPU-only code did, so CPU results are bit for bit those of earlier releases.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

#: Veltkamp's splitting constant for float32 (24-bit significand): 2^12 + 1
_SPLITTER = 4097.0


@functools.cache
def _probe_float64(device: str) -> bool:
    try:
        torch.zeros(1, dtype=torch.float64, device=device)
    except (TypeError, RuntimeError):  # MPS: "the MPS framework doesn't support float64"
        return False
    return True


def supports_float64(device: torch.device | str) -> bool:
    """Whether tensors of ``device`` can be float64 (probed once per device, then cached)."""
    return _probe_float64(str(torch.device(device)))


def wide_dtype(device: torch.device | str) -> torch.dtype:
    """The dtype the server computes in on ``device``: float64, or float32 without float64."""
    return torch.float64 if supports_float64(device) else torch.float32


def wide(tensor: Tensor) -> Tensor:
    """``tensor`` in :func:`wide_dtype` of its device (``tensor.double()`` where float64 exists)."""
    return tensor.to(wide_dtype(tensor.device))


def two_sum(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Knuth's error-free sum: ``s = fl(a + b)`` and ``e`` with ``s + e == a + b`` exactly.

    >>> s, e = two_sum(torch.tensor([1.0]), torch.tensor([2.0**-30]))
    >>> s.item(), e.item() == 2.0**-30
    (1.0, True)
    """
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _split(a: Tensor) -> tuple[Tensor, Tensor]:
    """Veltkamp's split: ``a = hi + lo`` with ``hi`` and ``lo`` of at most 12 significant bits."""
    t = a * _SPLITTER
    hi = t - (t - a)
    return hi, a - hi


def two_product(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Dekker's error-free product (no FMA needed): ``p = fl(a * b)`` and ``e`` with
    ``p + e == a * b`` exactly (barring overflow and underflow).

    >>> a = torch.tensor([1.0 + 2.0**-20])
    >>> p, e = two_product(a, a)  # (1 + 2^-20)^2 = 1 + 2^-19 + 2^-40: the last term is lost in p
    >>> e.item() == 2.0**-40
    True
    """
    p = a * b
    a_hi, a_lo = _split(a)
    b_hi, b_lo = _split(b)
    return p, a_lo * b_lo - (((p - a_hi * b_hi) - a_lo * b_hi) - a_hi * b_lo)


class WeightedSum:
    """``sum_i c_i x_i`` of same-shaped tensors on ``device``, under the rule of the module
    docstring: a float64 accumulator where the device has float64, else the compensated float32
    pair ``(s, compensation)``.

    >>> total = WeightedSum((2,), "cpu")
    >>> total.add(torch.tensor([1.0, 2.0]), 0.25)
    >>> total.add(torch.tensor([3.0, 6.0]), 0.75)
    >>> total.result(torch.float32)
    tensor([2.5000, 5.0000])
    """

    def __init__(
        self,
        shape: torch.Size | tuple[int, ...],
        device: torch.device | str,
        compensated: bool | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.compensated = not supports_float64(self.device) if compensated is None else compensated
        dtype = torch.float32 if self.compensated else torch.float64
        self.sum = torch.zeros(shape, dtype=dtype, device=self.device)
        self.compensation = torch.zeros_like(self.sum) if self.compensated else None

    def add(self, x: Tensor, coefficient: float = 1.0) -> None:
        """Add ``coefficient * x`` (``coefficient`` a Python float, exact in float64)."""
        if not self.compensated:
            self.sum.add_(x.detach().to(self.device, torch.float64), alpha=coefficient)
            return
        x = x.detach().to(self.device, torch.float32)
        c_hi = torch.tensor(coefficient, dtype=torch.float32)
        c_lo = torch.tensor(coefficient - float(c_hi), dtype=torch.float32)
        product, product_error = two_product(x, c_hi.to(self.device))
        self.sum, sum_error = two_sum(self.sum, product)
        self.compensation += sum_error + product_error + x * c_lo.to(self.device)

    def result(self, dtype: torch.dtype) -> Tensor:
        """The sum, rounded once to ``dtype``."""
        if not self.compensated:
            return self.sum.to(dtype)
        return (self.sum + self.compensation).to(dtype)


def weighted_sum(
    tensors: list[Tensor] | tuple[Tensor, ...],
    coefficients: list[float] | tuple[float, ...],
    dtype: torch.dtype,
    compensated: bool | None = None,
) -> Tensor:
    """``sum_i coefficients[i] * tensors[i]`` on the first tensor's device, rounded once to
    ``dtype`` (:class:`WeightedSum`; ``compensated=None`` follows the device's rule)."""
    total = WeightedSum(tensors[0].shape, tensors[0].device, compensated)
    for coefficient, tensor in zip(coefficients, tensors, strict=True):
        total.add(tensor, coefficient)
    return total.result(dtype)
