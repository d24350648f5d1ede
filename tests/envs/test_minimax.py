"""Minimax: forced wins in one, blocking a loss in one, perfect tic-tac-toe, a symmetric heuristic."""

from __future__ import annotations

import numpy as np
import pytest

from rlstack.envs.games import CONNECT_FOUR, TICTACTOE, ConnectFour, TicTacToe
from rlstack.envs.minimax import Minimax, perfect_player, planes_to_bits
from rlstack.envs.selfplay import RandomPlayer


def position(game, moves):
    for m in moves:
        game.step(m)
    return game


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_connect_four_takes_the_win_in_one(depth):
    # Player 0 has three in the bottom row (columns 1-3); column 0 and column 4 both win.
    game = position(ConnectFour(), [1, 1, 2, 2, 3, 3])
    player = Minimax(CONNECT_FOUR, depth, seed=0)
    me, opp = planes_to_bits(game.observe()["observation"])
    assert sorted(player.best_moves(me, opp)) == [0, 4]
    move = player.choose(game.observe()["observation"])
    game.step(move)
    assert game.winner == 0


@pytest.mark.parametrize("depth", [2, 3, 5])
def test_connect_four_blocks_a_loss_in_one(depth):
    # Player 0 threatens a vertical four in column 6; player 1 (to move) must block there.
    game = position(ConnectFour(), [6, 0, 6, 1, 6])
    move = Minimax(CONNECT_FOUR, depth, seed=0).choose(game.observe()["observation"])
    assert move == 6


def test_tictactoe_win_in_one_is_preferred_over_blocking():
    # X: 0, 1 (threatens 2); O: 3, 4 (threatens 5); X to move wins at 2 rather than blocking 5.
    game = position(TicTacToe(), [0, 3, 1, 4])
    assert perfect_player(TICTACTOE, seed=0).choose(game.observe()["observation"]) == 2


def test_tictactoe_blocks_a_loss_in_one():
    # X: 0, 1 threaten 2; O to move must block at 2.
    game = position(TicTacToe(), [0, 4, 1])
    player = perfect_player(TICTACTOE, seed=0)
    me, opp = planes_to_bits(game.observe()["observation"])
    assert player.best_moves(me, opp) == [2]


def test_perfect_tictactoe_player_draws_itself_and_never_loses_to_random():
    player = perfect_player(TICTACTOE, seed=1)
    assert player.value(0, 0) == 0  # tic-tac-toe is a draw
    me, opp = 0, 0
    assert sorted(player.best_moves(me, opp)) == list(range(9))  # every opening draws
    rng = np.random.default_rng(0)
    random = RandomPlayer(TICTACTOE)
    for g in range(40):
        game, perfect_seat = TicTacToe(), g % 2
        while not game.done:
            obs = game.flat_obs()[None]
            mover = player if game.current_player == perfect_seat else random
            game.step(int(mover.act(obs, rng)[0]))
        assert game.reward(perfect_seat) >= 0.0
    for _ in range(5):
        game = TicTacToe()
        while not game.done:
            game.step(player.choose(game.observe()["observation"]))
        assert game.winner is None


def test_heuristic_is_zero_sum():
    player = Minimax(CONNECT_FOUR, 2)
    game = position(ConnectFour(), [3, 3, 2, 4, 4, 1, 5])
    me, opp = planes_to_bits(game.observe()["observation"])
    assert player.heuristic(me, opp) == -player.heuristic(opp, me)
    assert player.heuristic(me, opp) != 0


def test_depth_two_beats_random_at_connect_four():
    player, random = Minimax(CONNECT_FOUR, 2, seed=0), RandomPlayer(CONNECT_FOUR)
    rng = np.random.default_rng(0)
    wins = 0
    for g in range(10):
        game, seat = ConnectFour(), g % 2
        while not game.done:
            mover = player if game.current_player == seat else random
            game.step(int(mover.act(game.flat_obs()[None], rng)[0]))
        wins += game.reward(seat) == 1.0
    assert wins >= 9


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth must be >= 1"):
        Minimax(CONNECT_FOUR, 0)
