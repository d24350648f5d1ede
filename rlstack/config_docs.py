"""The config keys' documentation: every key with its default and the docstring under its field
(`python -m rlstack.train --help-keys ALGO`), read from the dataclasses' source as CleanRL's tyro
does, without loading MindSpore (an algorithm's `train` class is rebuilt from its module's source)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlstack import config, registry

SOURCE_ATTR = "__rlstack_source__"
"""Where `help_config` keeps the source of a class it rebuilt (for its field docstrings)."""


def help_config(name: str) -> type:
    """The `train` dataclass of algorithm `name`, for help texts: the registered class, or for one
    not imported yet, the class rebuilt from its module's source (only the dataclass definition
    runs, in rlstack.config's namespace), so `--help-keys` does not load MindSpore."""
    entry = registry.registered(name)
    if entry is not None:
        return entry.config_cls
    import __future__

    import ast
    import importlib.util

    module = registry.module_of(name)
    spec = importlib.util.find_spec(module) if module else None  # (imports the package, not the module)
    if spec is not None and spec.origin:
        text = Path(spec.origin).read_text()
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "register" and len(node.args) >= 2
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value == name
                    and isinstance(node.args[1], ast.Name)):
                cls_name = node.args[1].id
                cls_node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name)
                namespace = {**vars(config), "__name__": config.__name__}
                code = compile(ast.Module([cls_node], []), spec.origin, "exec",
                               flags=__future__.annotations.compiler_flag, dont_inherit=True)
                exec(code, namespace)
                cls = namespace[cls_name]
                setattr(cls, SOURCE_ATTR, ast.get_source_segment(text, cls_node))
                return cls
    return registry.get(name).config_cls  # registered some other way: load it (or the usual KeyError)


def describe(algo: str = "ppo") -> str:
    """Every key with its default and docstring, for `--help` (without loading MindSpore)."""
    schema = config._schema(algo, help_config)
    docs = _docs(algo)
    lines = []
    for key in config._valid_keys(schema):
        node = OmegaConf.select(schema, key)
        if isinstance(node, DictConfig):
            continue
        lines.append(f"  {key} = {node!r}{'  # ' + docs[key] if docs.get(key) else ''}")
    return "\n".join(lines)


def _docs(algo: str) -> dict[str, str]:
    """Every documented key of algorithm `algo`'s config -> its docstring (each class's source read
    once)."""
    classes = {"": config.Config, "env": config.EnvConfig, "net": config.NetConfig, "train": help_config(algo),
               "selfplay": config.SelfPlayConfig, "ray": config.RayConfig, "learner": config.LearnerConfig}
    return {f"{section}.{name}" if section else name: doc
            for section, cls in classes.items() for name, doc in field_docs(cls).items()}


def field_docs(cls: type) -> dict[str, str]:
    """Docstrings written under dataclass fields (read from the source, as CleanRL's tyro does)."""
    import ast
    import inspect

    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(klass.__dict__.get(SOURCE_ATTR) or inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body  # type: ignore[attr-defined]
        for prev, node in zip(body, body[1:], strict=False):
            if (isinstance(prev, ast.AnnAssign) and isinstance(prev.target, ast.Name)
                    and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str)):
                docs[prev.target.id] = " ".join(node.value.value.split())
    return docs
