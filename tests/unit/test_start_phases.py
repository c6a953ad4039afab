"""``agent.start_phases``: an engine start split into its parts from vLLM's own log lines
(as vLLM 0.32 writes them) and the pull's record, this start's lines only."""

from __future__ import annotations

import json
from pathlib import Path

from agent.start_phases import log_offset, start_phases

EARLIER_START = """\
(Worker pid=1) INFO 12-07 06:30:00 [default_loader.py:501] Loading weights took 9.00 seconds
(EngineCore pid=1) INFO 12-07 06:30:05 [core.py:402] init engine (profile, create kv cache, warmup model) took 9.00 s
"""  # noqa: E501
THIS_START = """\
(Worker pid=15073) INFO 12-07 06:39:48 [base_loader.py:82] Initializing model took 0.593672 seconds
(Worker pid=15073) INFO 12-07 06:39:48 [default_loader.py:501] Loading weights took 0.08 seconds
(EngineCore pid=15053) INFO 12-07 06:39:55 [core.py:402] init engine (profile, create kv cache, warmup model) took 6.47 s
(APIServer pid=15028) INFO 12-07 06:39:57 [entry.py:140] Starting vLLM server on http://127.0.0.1:11732
"""  # noqa: E501


def test_this_starts_figures_are_split_out_and_the_rest_is_process_start(tmp_path: Path):
    log = tmp_path / "engine.log"
    assert log_offset(log) == 0  # the first start writes the log from its beginning
    log.write_text(EARLIER_START)
    offset = log_offset(log)
    with log.open("a") as more:
        more.write(THIS_START)
    model = tmp_path / "cache" / "m" / "v1"
    model.mkdir(parents=True)
    (model.parent / ".v1.pull.json").write_text(json.dumps({"copy_s": 4.0, "verify_s": 1.5}))

    phases = start_phases(model_path=model, log_path=log, log_from=offset,
                          engine_start_s=38.0, probe_s=2.0)  # fmt: skip
    assert phases == {"pull": 5.5, "process_start": 30.856, "weights_load": 0.674,
                      "engine_warm_up": 6.47, "probe": 2.0}  # fmt: skip


def test_without_vllms_lines_or_a_pull_the_engine_start_is_whole(tmp_path: Path):
    log = tmp_path / "sim.log"
    log.write_text("sim listening\n")
    phases = start_phases(model_path=tmp_path / "m", log_path=log, log_from=0,
                          engine_start_s=1.25, probe_s=0.5)  # fmt: skip
    assert phases == {"engine_start": 1.25, "probe": 0.5}
    stdout = start_phases(model_path=tmp_path / "m", log_path=Path("/dev/stdout"),
                          log_from=log_offset(Path("/dev/stdout")), engine_start_s=3.0,
                          probe_s=0.0)  # fmt: skip
    assert stdout == {"engine_start": 3.0, "probe": 0.0}
