"""Family LightningModules: methods are configs over these plus a core.

The modules are discovered, not listed: every public class of a module in this package (or every name of its
``__all__``) is a name of ``zoo.modules``, imported on first use (``from zoo.modules import CausalLMModule``, a
config's ``_target_``; :mod:`zoo.lazy`), so a run loads only the family it trains and a new module needs no edit here.
"""

from zoo.lazy import discovered_exports

__getattr__, __dir__ = discovered_exports(__name__, globals())
