"""`python -m rlstack.play`: a person against the exported agent, with input checked."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import mindspore as ms
import numpy as np
from mindspore import Tensor

from rlstack.acting import load_policy
from rlstack.artifact import export_policy
from rlstack.envs.games import TICTACTOE, TicTacToe
from rlstack.envs.players import PolicyPlayer
from rlstack.network import NetSpec, Network
from rlstack.play import play_game


def export_tictactoe(policy_dir, favour: int = 4):
    ms.set_seed(0)
    net = Network(TICTACTOE.flat_space(), gym.spaces.Discrete(9), NetSpec(hidden=(16,)))
    bias = np.zeros(9, np.float32)
    bias[favour] = 50.0  # the agent always wants `favour` when it is free
    net.pi[-1].bias.set_data(Tensor(bias))
    return export_policy(net, policy_dir, algorithm="ppo", obs_space=TICTACTOE.flat_space(),
                         action_space=gym.spaces.Discrete(9), device="cpu", fusion=False, config_hash="t",
                         extra={"env_id": "rlstack/TicTacToe-v0"})


def test_scripted_game_validates_input(tmp_path):
    export_tictactoe(tmp_path / "policy")
    agent = PolicyPlayer(load_policy(tmp_path), sample=False)
    answers = iter(["x", "9", "4", "0", "1", "2"])  # junk, out of range, then 4 is the agent's
    out: list[str] = []
    result = play_game(agent, TicTacToe(), human_first=False, read=lambda prompt: next(answers, "q"),
                       write=out.append)
    text = "\n".join(out)
    assert "agent plays cell 4" in text
    assert "'x' is not a cell number" in text
    assert "cell 9 is out of range 0..8" in text
    assert "cell 4 is taken" in text
    assert result in (-1.0, 0.0, 1.0)


def test_cli_draws_the_board_and_lists_legal_moves(tmp_path):
    export_tictactoe(tmp_path / "policy")
    proc = subprocess.run([sys.executable, "-m", "rlstack.play", str(tmp_path), "--first", "human"],
                          input="0\n4\nq\n", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "You are X" in proc.stdout
    assert "0 1 2\n3 4 5\n6 7 8" in proc.stdout  # the empty board
    assert "your move (cells 1, 2, 3, 5, 6, 7, 8)" in proc.stdout  # after 0 and the agent's 4
    assert "cell 4 is taken" in proc.stdout


def test_cli_refuses_a_policy_of_another_game(tmp_path):
    export_tictactoe(tmp_path / "policy")
    proc = subprocess.run([sys.executable, "-m", "rlstack.play", str(tmp_path), "--game", "connect4"],
                          input="", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "observations of shape (27,)" in proc.stderr


def test_cli_search_blocks_a_loss_in_one_that_the_raw_policy_misses(tmp_path):
    # The policy only knows to want the centre; after X 0, O 4, X 1 (threatening 2) the search
    # of 16 simulations on its graph blocks at 2, which its argmax move does not.
    export_tictactoe(tmp_path / "policy")
    raw = PolicyPlayer(load_policy(tmp_path), sample=False)
    game = TicTacToe()
    for move in (0, 4, 1):
        game.step(move)
    assert int(raw.act(game.flat_obs()[None], np.random.default_rng(0))[0]) != 2
    proc = subprocess.run([sys.executable, "-m", "rlstack.play", str(tmp_path), "--first", "human", "--search", "16"],
                          input="0\n1\nq\n", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "agent plays cell 4" in proc.stdout and "agent plays cell 2" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "rlstack.play", str(tmp_path), "--search", "-1"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "--search must be >= 0" in bad.stderr


def test_a_person_plays_an_openspiel_game_against_a_searching_agent(tmp_path):
    """Any game of the interface in the terminal: OpenSpiel's tic-tac-toe, the game named in the
    manifest, the agent searching; bad input asked again."""
    from rlstack.envs.games import game_spec

    game = game_spec("openspiel:tic_tac_toe")
    space, actions = game.flat_space(), gym.spaces.Discrete(9)
    net = Network(space, actions, NetSpec(hidden=(16,), value=True))
    export_policy(net, tmp_path / "policy", algorithm="alphazero", obs_space=space, action_space=actions,
                  device="cpu", fusion=False, config_hash="t",
                  extra={"env_id": "rlstack/Game-v0", "game": "openspiel:tic_tac_toe"})
    proc = subprocess.run([sys.executable, "-m", "rlstack.play", str(tmp_path), "--search", "8"],
                          input="9\n4\n4\nq\n", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "You are player 0" in proc.stdout and "agent plays move" in proc.stdout
    assert "move 9 is out of range 0..8" in proc.stdout
    assert "move 4 is not legal" in proc.stdout
    assert "...\n...\n..." in proc.stdout  # OpenSpiel's drawing of the empty board
