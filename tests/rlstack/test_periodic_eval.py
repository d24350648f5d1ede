"""`train.eval_every` / `train.keep_best`: periodic deterministic evaluation and the best-model policy."""

import numpy as np

from rlstack.acting import load_policy
from rlstack.config import load_config
from rlstack.trainer import Trainer

SMALL = ["train.total_steps=1024", "train.n_steps=32", "train.batch_size=64", "train.n_epochs=2",
         "train.progress=off", "env.eval_episodes=2", "train.eval_every=256"]


def _tb_scalars(run_dir, tag):
    from tensorboardX.proto import event_pb2

    points = []
    for path in (run_dir / "tb").glob("events.out.tfevents.*"):
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            length = int.from_bytes(data[pos: pos + 8], "little")
            event = event_pb2.Event.FromString(data[pos + 12: pos + 12 + length])
            points += [(event.step, v.simple_value) for v in event.summary.value if v.tag == tag]
            pos += 12 + length + 4
    return points


def test_periodic_evaluations_are_logged_and_the_best_network_is_the_final_policy(tmp_path):
    run = tmp_path / "run"
    trainer = Trainer(load_config(None, [*SMALL, "train.keep_best=true"]), run)
    summary = trainer.train()
    steps = [s for s, _ in _tb_scalars(run, "eval/mean_return")]
    # every 256 steps (an update is 8 envs x 32 steps = 256), plus the final evaluation
    assert steps == [256, 512, 768, 1024, 1024]
    periodic = [r for _, r in _tb_scalars(run, "eval/mean_return")][:4]
    assert summary["eval/best_mean_return"] == max(periodic)
    assert summary["eval/best_steps"] == steps[int(np.argmax(periodic))]
    assert summary["final_policy"] == "best"
    # The published policy carries the best network's parameters, not the last ones.
    graph_params = dict(load_policy(run).graph.parameters_and_names())
    for name, value in trainer.best.params.items():
        if name in graph_params:
            np.testing.assert_array_equal(graph_params[name].asnumpy(), value)


def test_without_keep_best_the_last_network_is_the_final_policy(tmp_path):
    summary = Trainer(load_config(None, SMALL), tmp_path / "run").train()
    assert summary["final_policy"] == "last" and summary["eval/best_mean_return"] is not None


def test_resume_continues_the_best_evaluation(tmp_path):
    run = tmp_path / "run"
    first = Trainer(load_config(None, [*SMALL, "train.keep_best=true"]), run)
    first.train()
    best = first.best
    resumed = Trainer.resume(run, ["train.total_steps=1536"])
    # The checkpoint holds the best evaluation: its score, step and parameters come back.
    assert (resumed.best.mean_return, resumed.best.steps, resumed.best.rank) == (best.mean_return, best.steps,
                                                                               best.rank)
    for name, value in best.params.items():
        np.testing.assert_array_equal(resumed.best.params[name], value)
    summary = resumed.train()
    # The evaluation schedule goes on where it stopped (finals at 1024 and 1536 besides the periodic ones).
    assert sorted(s for s, _ in _tb_scalars(run, "eval/mean_return")) == [256, 512, 768, 1024, 1024, 1280,
                                                                          1536, 1536]
    assert summary["eval/best_mean_return"] >= best.mean_return
    if summary["eval/best_steps"] <= 1024:  # nothing after the resume beat the kept best
        assert (summary["eval/best_mean_return"], summary["eval/best_steps"]) == (best.mean_return, best.steps)
