"""`rlstack.plot` and `rlstack.record` on real short runs: curves PNG from TensorBoard event files,
GIF from the exported policy graph."""

import json

import imageio.v3 as iio
import numpy as np
import pytest

from rlstack.config import load_config
from rlstack.plot import EVAL_TAG, TRAIN_TAG, PlotError, group_runs, load_run
from rlstack.plot import main as plot_main
from rlstack.record import RecordError, record
from rlstack.record import main as record_main
from rlstack.trainer import Trainer

SHORT = ["train.total_steps=512", "train.n_steps=32", "train.batch_size=128", "train.n_epochs=1",
         "env.eval_episodes=2", "train.progress=off"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for seed in (0, 1):
        Trainer(load_config(None, [*SHORT, f"seed={seed}"]), root / f"seed{seed}").train()
    return [root / "seed0", root / "seed1"]


def test_plot_reads_event_files_and_writes_png(runs, tmp_path):
    run = load_run(runs[0])
    train, evaluation = run.scalars[TRAIN_TAG], run.scalars[EVAL_TAG]
    assert len(train.steps) >= 1 and train.steps[-1] == 512 and np.all(np.diff(train.steps) > 0)
    assert np.all(train.seconds >= 0) and np.all(np.isfinite(train.values))
    assert evaluation.steps.tolist() == [512.0]
    # Two runs differing only by seed form one group (mean and spread across seeds).
    assert [len(g) for g in group_runs([load_run(r) for r in runs]).values()] == [2]

    out = tmp_path / "curves.png"
    assert plot_main([str(r) for r in runs] + ["--out", str(out)]) == 0
    data = out.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 20_000


def _sb3_run(root, seed):
    """A Stable-Baselines3 run as `bench peer --keep` keeps it: SB3's TensorBoard log (its tag
    names, written by tensorboardX as SB3's logger writes them) and the spec it ran."""
    from tensorboardX import SummaryWriter

    from rlstack.bench.peer import sb3_spec

    run = root / f"sb3_seed{seed}"
    writer = SummaryWriter(str(run / "PPO_1"))
    for step in (128, 256, 384, 512):
        writer.add_scalar("rollout/ep_rew_mean", 10.0 + step / 128 + seed, step)
    writer.close()
    spec = sb3_spec(load_config(None, [*SHORT, f"seed={seed}"]), tensorboard=str(run))
    (run / "spec.json").write_text(json.dumps(spec))
    return run


def test_plot_draws_stable_baselines3_runs_beside_rlstack(runs, tmp_path):
    peers = [_sb3_run(tmp_path, seed) for seed in (0, 1)]
    sb3 = load_run(peers[0])
    assert sb3.scalars[TRAIN_TAG].steps.tolist() == [128, 256, 384, 512]
    assert sb3.scalars[TRAIN_TAG].values.tolist() == [11.0, 12.0, 13.0, 14.0]
    assert sb3.label.startswith("SB3 ppo CartPole-v1 seed 0")
    assert EVAL_TAG not in sb3.scalars  # no final evaluation recorded
    # `bench peer` keeps what the SB3 side measured: its final evaluation is the last eval point
    (peers[0] / "result.json").write_text(json.dumps({"steps": 512, "seconds": 9.5, "eval_mean_return": 42.0}))
    evaluated = load_run(peers[0]).scalars[EVAL_TAG]
    assert (evaluated.steps.tolist(), evaluated.values.tolist()) == ([512], [42.0])
    # SB3's seeds form a group of their own, apart from rlstack's
    groups = group_runs([load_run(r) for r in [*runs, *peers]]).values()
    assert sorted(sorted(r.path.name for r in g) for g in groups) == [["sb3_seed0", "sb3_seed1"], ["seed0", "seed1"]]
    out = tmp_path / "both.png"
    assert plot_main([str(r) for r in [*runs, *peers]] + ["--out", str(out)]) == 0
    (peers[1] / "spec.json").write_text("{not json")
    with pytest.raises(PlotError, match="spec.json"):
        load_run(peers[1])


def test_plot_rejects_what_is_not_a_run(tmp_path, capsys):
    assert plot_main([str(tmp_path), "--out", str(tmp_path / "x.png")]) == 2
    assert "no TensorBoard event files" in capsys.readouterr().err
    assert plot_main([str(tmp_path), "--out", str(tmp_path / "x.jpg")]) == 2


def test_record_renders_the_exported_policy_to_gif(runs, tmp_path):
    out = tmp_path / "agent.gif"
    rec = record(runs[0], out, episodes=2, max_steps=25)
    assert len(rec.returns) == 2 and all(1 <= n <= 25 for n in rec.lengths)
    assert rec.returns == [float(n) for n in rec.lengths]  # CartPole pays 1 per step
    frames = iio.imread(out, index=None)
    assert out.stat().st_size > 0 and frames.ndim == 4 and frames.shape[-1] in (3, 4)
    assert 2 <= len(frames) <= rec.frames


def test_record_errors_are_clear(runs, tmp_path, capsys):
    with pytest.raises(RecordError, match="must end in one of .gif, .mp4"):
        record(runs[0], tmp_path / "agent.avi")
    assert record_main([str(tmp_path / "missing"), "--out", str(tmp_path / "a.gif")]) == 2
    assert "not a run directory" in capsys.readouterr().err
