"""The user's own training, measured as it runs: ``memclaims.watch`` (``session.py``) around any training loop, the
phases told from hooks (``phases.py``), the Record assembled by memclaims' one builder (``record.py``), and the
stacks' own callbacks around the same watch (``trainer_callback.py``: transformers' ``TrainerCallback``;
``lightning_callback.py``: Lightning's ``Callback``), and the watch on the sim (``on_sim.py``, imported only where a watch
asks for ``device="sim"``). May import ``core``, ``measure`` and ``sim``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memclaims.watching.lightning_callback import LightningWatch
    from memclaims.watching.session import PhasesNotSeen, Watch, watch
    from memclaims.watching.trainer_callback import TrainerWatch

__all__ = ["LightningWatch", "PhasesNotSeen", "TrainerWatch", "Watch", "watch"]

_WHERE = {"watch": "session", "Watch": "session", "PhasesNotSeen": "session",
          "TrainerWatch": "trainer_callback", "LightningWatch": "lightning_callback"}


def __getattr__(name: str) -> Any:
    """Each name imported on first use: the callbacks import transformers or Lightning only when asked for."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
