"""The int8 rewrite of weight products, on small graphs built here."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from context_engine.inference.int8_matmul import int8_matmul_model


def _weight_product_model(weight: np.ndarray, scale: np.ndarray, *, scale_first: bool = False) -> bytes:
    """y = x @ (float(W) * scale), the way the packaged MiniLM stores its weights."""
    rows, columns = weight.shape
    mul_inputs = ["scale", "w_float"] if scale_first else ["w_float", "scale"]
    graph = helper.make_graph(
        [helper.make_node("Cast", ["w"], ["w_float"], to=TensorProto.FLOAT),
         helper.make_node("Mul", mul_inputs, ["w_scaled"]),
         helper.make_node("MatMul", ["x", "w_scaled"], ["y"], name="product")],
        "weights",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", rows])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", columns])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(scale, "scale")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


def _run(model: bytes, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("scale_first", [False, True])
def test_the_product_keeps_its_int8_weights_and_its_value(scale_first: bool) -> None:
    rng = np.random.default_rng(7)
    weight = rng.integers(-127, 128, size=(64, 48), dtype=np.int8)
    scale = rng.uniform(0.001, 0.01, size=(1, 48)).astype(np.float32)
    x = rng.normal(size=(5, 64)).astype(np.float32)
    model = _weight_product_model(weight, scale, scale_first=scale_first)

    rewritten, count = int8_matmul_model(model)

    assert count == 1
    graph = onnx.load_from_string(rewritten).graph
    assert [(n.op_type, n.domain) for n in graph.node] == [("DynamicQuantizeMatMul", "com.microsoft")]
    kept = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    np.testing.assert_array_equal(kept["w"], weight)  # the very same int8 weights
    assert "scale" not in kept  # only the removed Mul read it
    expected = _run(model, x)
    got = _run(rewritten, x)
    # The error is x's uint8 quantization: a fraction of a percent of the products' range.
    assert np.abs(got - expected).max() < 0.01 * np.abs(expected).max()


def test_a_per_tensor_scale_is_spread_over_the_columns() -> None:
    weight = np.arange(-12, 12, dtype=np.int8).reshape(4, 6)
    x = np.eye(4, dtype=np.float32)
    rewritten, _ = int8_matmul_model(_weight_product_model(weight, np.array(0.5, dtype=np.float32)))
    np.testing.assert_allclose(_run(rewritten, x), weight * 0.5, atol=0.05)


def test_a_graph_without_int8_weights_is_refused() -> None:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "float",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2])],
        [numpy_helper.from_array(np.ones((3, 2), dtype=np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()
    with pytest.raises(ValueError, match="no MatMul of an int8 weight"):
        int8_matmul_model(model)
