"""`python -m rlstack.play RUN_DIR [--game NAME]`: a person plays a trained agent in the terminal, on any
game search and self-play play (the built-in ones, `openspiel:<name>(<params>)`, your own).

The agent is the exported graph (`load_policy`: a run dir, its `policy/` dir or one version dir),
playing its argmax move unless `--sample`, or with `--search N` the most visited move of a tree
search of N simulations whose leaves that graph evaluates (`rlstack/search.py`). The board is
drawn after every move with the legal moves listed; input is checked (a number, in range,
legal) and asked again when wrong.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import numpy as np

from rlstack.envs.games import ENV_IDS, GAMES, Game, GameSpec, Positions, TwoPlayerGame, game_spec
from rlstack.envs.players import Player, PolicyPlayer, moves
from rlstack.errors import RlstackError

SYMBOLS = ("X", "O")


def game_of_manifest(manifest: dict) -> str | None:
    """The game a policy was trained on, from its manifest (`game`, else the `env_id` of a
    built-in game; None if not a game)."""
    return manifest.get("game") or ENV_IDS.get(str(manifest.get("env_id", "")))


def play_game(agent: Player, game: Game | TwoPlayerGame, human_first: bool,
              read: Callable[[str], str] = input, write: Callable[[str], None] = print,
              rng: np.random.Generator | None = None) -> float:
    """One game (from the opening, or from a `TwoPlayerGame`'s position); returns the human's
    result (their return: +1 win, 0 draw, -1 loss). `read`/`write` are the terminal."""
    rng = rng or np.random.default_rng()
    human = 0 if human_first else 1
    board: Positions = game.boards if isinstance(game, TwoPlayerGame) else game.positions(1)
    word = board.spec.move_word
    players = f"You are {SYMBOLS[human]}, the agent ({agent.name}) is {SYMBOLS[1 - human]}" \
        if isinstance(board.spec, GameSpec) else f"You are player {human}, the agent ({agent.name}) player {1 - human}"
    write(f"{players}. A move is a {word} number; q quits.")
    while not board.over[0]:
        write("")
        write(board.render(0))
        if board.to_move[0] == human:
            move = _ask(board, read, write)
            if move is None:
                write("quit.")
                return 0.0
        else:
            move = int(moves(agent, board, np.zeros(1, np.int64), rng)[0])
            write(f"agent plays {word} {move}")
        board.play([move], [0])
    write("")
    write(board.render(0))
    result = float(board.result_for(human, [0])[0])
    write("You win!" if result > 0 else "The agent wins." if result < 0 else "Draw.")
    return result


def _ask(board: Positions, read: Callable[[str], str], write: Callable[[str], None]) -> int | None:
    legal = np.flatnonzero(board.legal_mask([0])[0]).tolist()
    spec = board.spec
    word = spec.move_word
    while True:
        try:
            text = read(f"your move ({word}s {', '.join(map(str, legal))}): ").strip()
        except EOFError:
            return None
        if text.lower() in ("q", "quit", "exit"):
            return None
        if not text.lstrip("-").isdigit():
            write(f"'{text}' is not a {word} number; legal {word}s: {legal}")
            continue
        move = int(text)
        if move not in legal:
            gravity = getattr(spec, "gravity", None)
            why = f"out of range 0..{spec.n_actions - 1}" if not 0 <= move < spec.n_actions else \
                "not legal" if gravity is None else "full" if gravity else "taken"
            write(f"{word} {move} is {why}; legal {word}s: {legal}")
            continue
        return move


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlstack.play", description=__doc__.split("\n")[0])
    parser.add_argument("run", help="run directory, its policy/ directory, or a version directory")
    parser.add_argument("--game", default=None,
                        help=f"the game: {', '.join(sorted(GAMES))}, openspiel:<name>(<params>) or module:attribute "
                             "(default: from the policy's manifest)")
    parser.add_argument("--first", choices=("human", "agent"), default="human", help="who moves first")
    parser.add_argument("--sample", action="store_true", help="the agent samples its moves (default: argmax)")
    parser.add_argument("--search", type=int, default=0, metavar="N",
                        help="the agent searches N simulations per move (AlphaZero's tree search on the "
                             "exported graph; default 0: its policy's move)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the agent's sampling")
    args = parser.parse_args(argv)
    if args.search < 0:
        parser.error(f"--search must be >= 0 simulations, got {args.search}")
    if args.search and args.sample:
        parser.error("--search plays the most visited move; it cannot be combined with --sample")

    from rlstack.acting import load_policy
    from rlstack.artifact import ArtifactError, read_manifest, resolve_version_dir
    from rlstack.runtime import configure

    try:
        manifest = read_manifest(resolve_version_dir(args.run))
        name = args.game or game_of_manifest(manifest)
        if name is None:
            raise ArtifactError(f"{args.run}: the manifest does not name a game env (env_id "
                                f"{manifest.get('env_id')!r}); pass --game {' or '.join(sorted(GAMES))} or another")
        try:
            spec = game_spec(name)
        except ValueError as err:
            raise ArtifactError(f"--game: {err}") from None
        configure("cpu", "auto")
        policy = load_policy(args.run, obs_shape=spec.flat_space().shape)
    except RlstackError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.search:
        from rlstack.search import SearchPlayer

        agent: Player = SearchPlayer(policy, spec, args.search)
    else:
        agent = PolicyPlayer(policy, sample=args.sample)
    play_game(agent, spec, args.first == "human", rng=np.random.default_rng(args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
