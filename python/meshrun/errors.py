"""The errors the SDK raises for what a user wrote: a module of its own so that every other
module may import it without importing each other."""


class BundleError(ValueError):
    """A malformed bundle or job option; the message names the file and field."""


class TorchExportError(ValueError):
    """What meshrun.torch cannot export or load (docs/torch.md lists each); the message names
    the parameter, rule or construct at fault and the fix."""


class DoesNotFitError(ValueError):
    """A program of a bundle does not fit one chip of the compile target (meshrun.tpu); the
    message names the program, the bytes it needs per device and the bytes a chip has."""
