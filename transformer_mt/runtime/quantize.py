"""int8 decoding (`decoding.quantize=int8`): a copy of the model whose linear layers hold int8 weights and
quantize their input as it comes (PyTorch's dynamic quantization), float32 around them; and the precision a
decoding engine runs in, refused in one line where the device, the autocast asked for or the torch build
cannot run int8.

Every `nn.Linear` is quantized: the attention projections, the feed-forward layers and the output
projection. Each weight row (output channel) has its own scale; each call's input gets one scale from its
range. The embeddings, layer norms, attention's score products and the search stay as they are.
"""

from __future__ import annotations

import logging
import warnings

import torch
from torch import nn

from transformer_mt.config import DeviceConfig
from transformer_mt.config.checks import int8_problems
from transformer_mt.errors import ConfigError
from transformer_mt.runtime.device import Precision, precision

log = logging.getLogger(__name__)

# torch's quantized CPU engines that run int8 matrix products on x86 (FBGEMM, oneDNN, or x86, which picks
# between them), best first; qnnpack, the other one, is for ARM phones.
INT8_ENGINES = ("x86", "fbgemm", "onednn")


def _supported_engines() -> list[str]:
    return list(torch.backends.quantized.supported_engines)


def int8_engine() -> str:
    """The quantized engine int8 decoding runs on: torch's current one where it is an x86 int8 engine this
    build has, else the best it has (set for the process); ConfigError naming what is missing otherwise."""
    supported = _supported_engines()
    usable = [name for name in INT8_ENGINES if name in supported]
    if not usable:
        raise ConfigError(f"decoding.quantize=int8 needs a torch build with an x86 int8 engine "
                          f"({' or '.join(INT8_ENGINES)}); this one has {', '.join(supported) or 'none'}: "
                          "install torch's x86 CPU build, or set decoding.quantize=none")
    if torch.backends.quantized.engine not in usable:
        torch.backends.quantized.engine = usable[0]
    return torch.backends.quantized.engine


def decoding_precision(quantize: str, amp: str, device: torch.device) -> Precision:
    """How a decoding engine computes: device.amp's choice (runtime.device.precision) without
    quantization; with decoding.quantize=int8, int8 linear layers and float32 elsewhere (device.amp=auto
    means float32 then: the int8 kernels take float32 input)."""
    if quantize == "none":
        return precision(DeviceConfig(name=device.type, amp=amp), device, training=False)
    problems = int8_problems(quantize, amp, device.type)
    if problems:
        raise ConfigError(problems[0])
    engine = int8_engine()
    return Precision(None, f"decoding.quantize=int8 on torch's {engine} engine; device.amp={amp} gives "
                     "float32, the int8 kernels' input", int8=True)


class RowsLinear(torch.ao.nn.quantized.dynamic.Linear):
    """torch's int8 linear layer (dynamic quantization) that also gives some of its output rows as a layer
    of their own, their int8 weights and scales as they are: the output projection onto a shortlist's
    columns (Transformer._project_columns) is then the full projection's product, for those columns."""

    @classmethod
    def of(cls, layer: torch.ao.nn.quantized.dynamic.Linear) -> RowsLinear:
        """The same layer (its packed weights and bias), as a RowsLinear."""
        same = cls(layer.in_features, layer.out_features, bias_=layer.bias() is not None,
                   dtype=layer.weight().dtype)
        same.set_weight_bias(layer.weight(), layer.bias())
        return same

    def rows(self, ids: torch.Tensor) -> RowsLinear:
        """A layer computing output rows `ids` (U,) alone."""
        q, bias = self.weight(), self.bias()
        scales, zeros = q.q_per_channel_scales()[ids], q.q_per_channel_zero_points()[ids]
        part = RowsLinear(self.in_features, ids.numel(), bias_=bias is not None, dtype=q.dtype)
        part.set_weight_bias(torch.quantize_per_channel(q.dequantize()[ids], scales, zeros, 0, q.dtype),
                             None if bias is None else bias[ids])
        return part


def quantized(model: nn.Module) -> nn.Module:
    """A copy of `model` whose every nn.Linear holds int8 weights (a scale per output channel) and
    quantizes its input per call (output projections as `RowsLinear`); `model` itself is left as it was."""
    with warnings.catch_warnings():
        # torch.ao.quantization is deprecated upstream in favour of torchao (docs/decoding.md#int8) and says
        # so at every call; it stays the fastest int8 path on the CPU without torch.compile.
        warnings.filterwarnings("ignore", r"torch\.ao\.quantization is deprecated", DeprecationWarning)
        warnings.filterwarnings("ignore", r"torch\.quantize_per_tensor, torch\.quantize_per_channel and "
                                "other quantized tensor creation functions", UserWarning)
        copy = torch.ao.quantization.quantize_dynamic(
            model, {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}, inplace=False)
        for module in copy.modules():
            projection = getattr(module, "output_projection", None)
            if isinstance(projection, torch.ao.nn.quantized.dynamic.Linear):
                module.output_projection = RowsLinear.of(projection)
        return copy
