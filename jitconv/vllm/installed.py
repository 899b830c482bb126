"""What the installed vLLM's conv ops take, read from the source of its ops module.

vLLM's layers call ``causal_conv1d_fn`` / ``causal_conv1d_update`` as its ops module
defines them (the Triton ops; vLLM's CPU build rebinds the names to CPU fallbacks that
take ``**kwargs``, so the definitions, not the bound objects, say what callers pass).
Releases differ in three ways that matter to a replacement:

- the padding convention: with a ``null_block_id`` parameter (vLLM's null block, line
  NULL_BLOCK_ID = 0 skipped) or, before it, only ``pad_slot_id`` (lines equal to
  PAD_SLOT_ID = -1 skipped, line 0 a cache line like any other);
- the parameters and their order (vLLM 0.32's ops take prefix-caching arguments between
  ``null_block_id`` and ``validate_data``; older ones take ``cache_seqlens``);
- the defaults.

``read_module`` reads them from a live module (defaults that name module constants are
resolved there); ``read_source`` from a file's text alone (the tests read the ops file
of each release out of its wheel), leaving such defaults as ``Unresolved`` names. Nothing
here imports vLLM.
"""

import ast
import inspect
from dataclasses import dataclass

OP_NAMES = ("causal_conv1d_fn", "causal_conv1d_update")
NULL_BLOCK = "null block"
PAD_SLOT = "pad slot"


class ConventionError(Exception):
    """The ops module does not say what its ops take (no source, no definition, or a
    definition jitconv cannot follow)."""


@dataclass(frozen=True)
class Unresolved:
    """A default given by a name (or expression) whose value the source alone does not
    give, e.g. ``NULL_BLOCK_ID`` imported from another module."""
    text: str

    def __repr__(self):
        return self.text


@dataclass(frozen=True, kw_only=True)
class OpSignature:
    """One op as its module defines it: parameter names in order, and the defaults of
    those that have one (values, or ``Unresolved``)."""
    name: str
    parameters: tuple
    defaults: tuple  # ((name, value), ...), in parameter order

    def default(self, name):
        return dict(self.defaults)[name]


@dataclass(frozen=True, kw_only=True)
class InstalledOps:
    """The two ops of an installed vLLM and the convention they follow."""
    where: str            # the file read
    fn: OpSignature
    update: OpSignature
    convention: str       # NULL_BLOCK or PAD_SLOT
    skipped_line: object  # the default null_block_id (NULL_BLOCK) or pad_slot_id (PAD_SLOT)

    def op(self, name):
        return self.fn if name == "causal_conv1d_fn" else self.update

    def describe(self):
        """How the convention was read, for the plugin's log line."""
        parameter = "null_block_id" if self.convention == NULL_BLOCK else "pad_slot_id"
        return (f"{self.convention} {self.skipped_line!r} (causal_conv1d_update takes "
                f"{parameter}={self.update.default(parameter)!r} in {self.where})")


def read_module(module):
    """``InstalledOps`` of a live ops module: its source file read, defaults that name
    the module's own constants resolved from it."""
    try:
        where = inspect.getsourcefile(module)
        text = inspect.getsource(module)
    except (OSError, TypeError) as exc:
        raise ConventionError(f"the source of {module.__name__} cannot be read ({exc})") \
            from None
    return read_source(text, where, vars(module))


def read_source(text, where, namespace=None):
    """``InstalledOps`` from an ops module's source text. ``namespace``: the module's
    globals, to resolve defaults given by name (None: they stay ``Unresolved``)."""
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        raise ConventionError(f"{where} does not parse ({exc})") from None
    found = {}
    for node in tree.body:  # top-level definitions only: a rebinding in an `if` is not one
        if isinstance(node, ast.FunctionDef) and node.name in OP_NAMES \
                and node.name not in found:
            found[node.name] = _signature(node, where, namespace)
    missing = [name for name in OP_NAMES if name not in found]
    if missing:
        raise ConventionError(f"{where} defines no {' or '.join(missing)}")
    fn, update = found["causal_conv1d_fn"], found["causal_conv1d_update"]
    if "null_block_id" in update.parameters:
        convention, skipped = NULL_BLOCK, update.default("null_block_id")
    elif "pad_slot_id" in update.parameters:
        convention, skipped = PAD_SLOT, update.default("pad_slot_id")
    else:
        raise ConventionError(f"causal_conv1d_update in {where} takes neither "
                              f"null_block_id nor pad_slot_id: its padding convention "
                              f"is unknown")
    return InstalledOps(where=where, fn=fn, update=update, convention=convention,
                        skipped_line=skipped)


def _signature(node, where, namespace):
    args = node.args
    if args.vararg is not None or args.kwarg is not None:
        raise ConventionError(f"{node.name} in {where} takes *args or **kwargs: what its "
                              f"callers pass cannot be read")
    positional = args.posonlyargs + args.args
    with_default = positional[len(positional) - len(args.defaults):]
    defaults = [(a.arg, _value(d, namespace)) for a, d in zip(with_default, args.defaults)]
    defaults += [(a.arg, _value(d, namespace)) for a, d in zip(args.kwonlyargs,
                                                               args.kw_defaults)
                 if d is not None]
    return OpSignature(name=node.name,
                       parameters=tuple(a.arg for a in positional + args.kwonlyargs),
                       defaults=tuple(defaults))


def _value(node, namespace):
    try:
        return ast.literal_eval(node)
    except ValueError:
        pass
    if isinstance(node, ast.Name) and namespace is not None and node.id in namespace:
        return namespace[node.id]
    return Unresolved(ast.unparse(node))
