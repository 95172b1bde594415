"""docs/supported-ops.md is what `rkc ops` prints, and every op has a kernel and a rule."""

from pathlib import Path

from rkc.compiler.ops import OPS
from rkc.compiler.support_table import supported_ops_markdown
from rkc.runtime.kernels import KERNELS

ROOT = Path(__file__).resolve().parents[2]


def test_supported_ops_doc_is_current():
    assert (ROOT / "docs/supported-ops.md").read_text() == supported_ops_markdown(), \
        "regenerate: rkc ops > docs/supported-ops.md"


def test_every_spec_has_a_cpu_kernel_and_reasons():
    for name, spec in OPS.items():
        assert spec.kernel_name in KERNELS, name
        for check in spec.npu:
            assert (check.__doc__ or "").strip(), f"{name}: constraint {check.__name__} has no reason"


def test_issue_op_list_is_covered():
    wanted = """Conv ConvTranspose Gemm MatMul Add Sub Mul Div Relu LeakyRelu Clip Sigmoid HardSigmoid HardSwish
    Tanh Gelu Softmax LayerNormalization BatchNormalization MaxPool AveragePool GlobalAveragePool Concat Split
    Slice Reshape Flatten Transpose Squeeze Unsqueeze Pad Resize ReduceMean QuantizeLinear DequantizeLinear
    QLinearConv QLinearMatMul MatMulInteger ConvInteger Identity Cast""".split()
    assert not [op for op in wanted if op not in OPS]
