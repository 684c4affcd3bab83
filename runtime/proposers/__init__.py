"""Ways of proposing draft tokens, one file each, behind one protocol (base.Proposer).

The loop asks the request's proposers in order and verifies the first non-empty proposal; adding a
proposer means adding a file here and listing it in SpeculativeDecoder, never touching the loop.
"""
from .base import Proposal, Proposer
from .draft_model import DraftModel
from .hidden_head import HiddenStateHead
from .prompt_lookup import PromptLookup

__all__ = ["DraftModel", "HiddenStateHead", "PromptLookup", "Proposal", "Proposer"]
