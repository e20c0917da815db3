"""meshrun's Python SDK: export a JAX training step as a bundle (meshrun.export) or a PyTorch
module, loss and optimizer (meshrun.torch, needs torch + torchax: docs/torch.md), write its data
(meshrun.data), and drive a cluster (meshrun.Client). See docs/bring_your_own_model.md."""
from meshrun.bundle import job_spec_from_bundle, read_bundle
from meshrun.client import Client
from meshrun.errors import BundleError

__all__ = ["BundleError", "Client", "job_spec_from_bundle", "read_bundle"]
__version__ = "0.1.0"
