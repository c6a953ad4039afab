"""What ``pdserve up`` quotes about a worker that is slow to start."""

from __future__ import annotations

from pathlib import Path

from localrun.cluster import ClusterPlan, LocalCluster


def cluster_in(run_dir: Path) -> LocalCluster:
    plan = ClusterPlan(model_path=Path("/nonexistent"), served_name="m", run_dir=run_dir)
    return LocalCluster(plan, say=lambda _: None)


def test_the_engine_log_is_quoted_before_the_agent_log(tmp_path):
    cluster = cluster_in(tmp_path)
    assert cluster.last_log_line("decode-0") == "(no log yet)"
    (tmp_path / "decode-0.log").write_text("agent: engine started\n")
    assert cluster.last_log_line("decode-0") == "agent: engine started"
    (tmp_path / "decode-0.engine.log").write_text("loading weights\n\n" + "x" * 500 + "\n\n")
    assert cluster.last_log_line("decode-0") == "x" * 160


def test_only_the_end_of_a_big_log_is_read(tmp_path):
    cluster = cluster_in(tmp_path)
    (tmp_path / "prefill-0.engine.log").write_text("early line\n" * 100_000 + "latest line\n")
    assert cluster.last_log_line("prefill-0") == "latest line"
