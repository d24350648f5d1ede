"""`rlstack.plot` and `rlstack.record` on real short runs: curves PNG from TensorBoard event files,
GIF from the exported policy graph."""

import imageio.v3 as iio
import numpy as np
import pytest

from rlstack.config import load_config
from rlstack.plot import EVAL_TAG, TRAIN_TAG, group_runs, load_run
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
