"""One error base: every error rlstack raises on purpose is an `RlstackError` (what the CLIs
catch to print a message instead of a traceback), still the builtin kind it was."""

import pytest

import rlstack
from rlstack.artifact import ArtifactError
from rlstack.bench.graphs import CensusError
from rlstack.checkpoints import CheckpointError, ResumeError
from rlstack.collector import ActorError
from rlstack.config import ConfigError, load_config
from rlstack.envs.games import IllegalMoveError
from rlstack.envs.make import EnvError
from rlstack.errors import RlstackError
from rlstack.plot import PlotError
from rlstack.profiling import ProfileError
from rlstack.record import RecordError
from rlstack.runtime import DeviceError


@pytest.mark.parametrize(("error", "builtin"), [
    (ConfigError, ValueError), (EnvError, ValueError), (IllegalMoveError, ValueError), (PlotError, ValueError),
    (ArtifactError, RuntimeError), (CheckpointError, RuntimeError), (ResumeError, RuntimeError),
    (ActorError, RuntimeError), (DeviceError, RuntimeError), (ProfileError, RuntimeError),
    (RecordError, RuntimeError), (CensusError, RuntimeError),
])
def test_every_error_is_an_rlstack_error_of_its_builtin_kind(error, builtin):
    assert issubclass(error, RlstackError) and issubclass(error, builtin)


def test_the_public_names():
    assert rlstack.RlstackError is RlstackError
    from rlstack.acting import load_policy

    assert rlstack.load_policy is load_policy
    assert load_policy.__annotations__["return"] == "Policy" and rlstack.Policy.__name__ == "Acting"
    with pytest.raises(RlstackError, match="train.n_epochs"):
        load_config(None, ["train.n_epoch=3"])
