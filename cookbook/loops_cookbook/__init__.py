"""Loops cookbook: SFT, RL and DPO recipes that use only the tinker SDK.

Every recipe is a module under ``loops_cookbook.recipes`` with a ``Config`` dataclass (its
documented defaults), a ``DATA_FORMAT`` string, and ``main(cfg)``. ``python -m loops_cookbook``
lists, shows, checks and runs them; ``loops cookbook`` (the Go command) drives the same CLI.
"""

__version__ = "0.1.0"
