"""The stage layer: admit a stage where the plan and the evidence allow, then serve it.

``open_stage`` walks the plan's candidates; ``Stage`` is what an admitted candidate becomes;
``Ledger`` is the process-wide memory state that open stages share.
"""

from __future__ import annotations

from xstage.stage.handle import Stage
from xstage.stage.ledger import Holding, Ledger
from xstage.stage.open import open_stage

__all__ = ["Holding", "Ledger", "Stage", "open_stage"]
