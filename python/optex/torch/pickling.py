"""pickle, ``copy.deepcopy`` and ``torch.save(opt)`` of an ``optex.torch.OptEx``.

The copy is the optimizer rebuilt from its constructor settings, its param
groups and its ``state_dict()`` (optimizer.py's ``_restore``, the other half of
``OptEx.__reduce_ex__``), so it continues bit for bit. This module says which
settings travel, and refuses what cannot be copied so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import hyperparameters as _hyper
from .exchange import distributed_enabled

if TYPE_CHECKING:
    from .optimizer import OptEx


def settings(opt: OptEx) -> dict[str, Any]:
    """The constructor settings that ``_restore`` rebuilds ``opt`` from; TypeError,
    naming ``state_dict()``, for an optimizer that cannot be copied."""
    if distributed_enabled(opt._distributed_flag) or opt._group is not None:
        raise TypeError(
            "optex.torch.OptEx: an optimizer that shares its rounds over torch.distributed "
            "cannot be pickled or deep-copied (its process group does not travel); save "
            "opt.state_dict() and load it into an optimizer built on the other side"
        )
    if opt._engine is not None and opt._engine.pending:
        raise TypeError(
            "optex.torch.OptEx: cannot be pickled or deep-copied while a round is pending "
            "(the last step failed mid-round); call step(closure) to finish it, or save "
            "opt.state_dict() afterwards"
        )
    return {
        "optimizer": opt._kind,
        "defaults": dict(opt.defaults),
        "options": {name: getattr(opt._options, name) for name in _hyper.OPTION_FIELDS},
        "device": opt._device,
        "drop_nonfinite": opt._drop_nonfinite,
        "buffers": opt._buffer_tensors,
        "distributed": opt._distributed_flag,
    }
