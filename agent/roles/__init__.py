"""The worker's three roles, each a choice of engine spec inside the one agent program
(``agent/runner.py``): ``prefill`` (NixlConnector ``kv_producer``), ``decode``
(``kv_consumer``) and ``colocated`` (a plain vLLM, no P/D); ``pd`` holds what the two
P/D roles share (the transport flags, the NIXL spec, re-role).

Why here and not in top-level prefill/ and decode/ folders: a P/D worker is re-roled at
runtime (prefill <-> decode through the SRE ratio API), so one agent program must build
both P/D specs. As folders of their own, prefill/ and decode/ imported agent while the
agent's re-role needed their specs back (so the P/D spec sat in ``agent/runner.py``, away
from its roles). The roles import ``agent.runner``; the runner never imports the roles.
The prefill-rate probe stays in ``agent/prefill_probe.py``: the runner runs it for every
role that prefills a prompt (prefill and colocated).
"""

from __future__ import annotations

import argparse

from agent.roles import pd


def agent_argv(role: str, **flags: object) -> list[str]:
    """The agent command line (``pdserve <role> ...``) for flag values given by their
    argparse names, so a launcher never spells a flag itself. None leaves a flag out."""
    parser = argparse.ArgumentParser(add_help=False)
    pd.add_arguments(parser)  # every role's flags (colocated takes a subset)
    spelled = {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}
    argv = [role]
    for dest, value in flags.items():
        if dest not in spelled:
            raise ValueError(f"the agent has no flag for {dest!r}")
        if value is not None:
            argv += [spelled[dest], str(value)]
    return argv
