"""Chat templates: the Jinja templates GGUF files carry in ``tokenizer.chat_template``, rendered
the way Hugging Face transformers renders them, but treated as untrusted input.

The environment matches transformers' ``apply_chat_template``: jinja2's
``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``, the
``loopcontrols`` extension (``{% break %}``, ``{% continue %}``), a ``{% generation %}`` block
that renders its body, a ``tojson`` filter that does not escape HTML (``json.dumps`` with
``ensure_ascii=False``), and the globals ``raise_exception(message)``, ``strftime_now(format)``,
``namespace(...)`` (no attribute names starting with ``_``) and ``dict(...)``. ``lipsum`` is
removed.

Every failure is an :class:`ember.errors.ChatTemplateError`: a syntax error, a
``raise_exception`` call, an attempt to reach Python internals (``''.__class__``, which the
sandbox refuses), any other error while rendering, and going over one of the limits below.

Limits (a template can loop or build big values; rendering stops with ChatTemplateError):

- ``max_chars`` (default ``MAX_RENDER_CHARS`` = 1,000,000 characters): the rendered text, any one
  value built while rendering (string, list, dict, counting the characters of the strings in
  it), and any integer argument of a call or filter (widths, counts).
- the *total* size of everything built while rendering (each ``{{ }}`` output, each literal
  piece of template text, each result of ``+ * ~ %``, of a filter and of a call, anywhere, also
  inside ``{% set %}`` blocks and macros) is at most ``32 * max_chars``. This bounds memory: a
  value can only be built from pieces that were counted.
- ``max_steps`` (default ``MAX_LOOP_STEPS`` = 1,000,000): ``{% for %}`` iterations in total.
- ``timeout`` (default ``RENDER_TIMEOUT_S`` = 5 s): wall time, checked at every loop step, call,
  filter and operator. Recursion (macros, recursive loops) is bounded by Python's recursion limit.

>>> apply_chat_template("{{ messages[0]['content'] * 3 }}", [{"role": "user", "content": "ab"}])
'ababab'
>>> try:
...     apply_chat_template("{{ 'x' * 10**9 }}", [])
... except ChatTemplateError as e:
...     print(e)
chat template: '*' would build a value of 1000000000 characters, over the limit of 1000000 (max_chars)
"""
from __future__ import annotations

import contextvars
import json
import re
import time
from datetime import datetime
from typing import Any

from ..errors import ChatTemplateError

__all__ = ["apply_chat_template", "MAX_RENDER_CHARS", "MAX_LOOP_STEPS", "RENDER_TIMEOUT_S"]

MAX_RENDER_CHARS = 1_000_000
MAX_LOOP_STEPS = 1_000_000
RENDER_TIMEOUT_S = 5.0
_ALLOC_FACTOR = 32
_MAX_INT_BITS = 4096        # integer results of * and ** (a loop of squarings would take hours)

_budget: contextvars.ContextVar["_Budget | None"] = contextvars.ContextVar("ember_chat_budget", default=None)


class _Budget:
    __slots__ = ("max_chars", "max_alloc", "alloc", "steps", "max_steps", "deadline", "timeout")

    def __init__(self, max_chars: int, max_steps: int, timeout: float):
        self.max_chars = max_chars
        self.max_alloc = _ALLOC_FACTOR * max_chars
        self.alloc = 0
        self.steps = 0
        self.max_steps = max_steps
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise ChatTemplateError(f"chat template: rendering took longer than {self.timeout} s (timeout)")

    def charge(self, n: int, what: str) -> None:
        if n > self.max_chars:
            raise ChatTemplateError(f"chat template: {what} would build a value of {n} characters, "
                                    f"over the limit of {self.max_chars} (max_chars)")
        self.alloc += n
        if self.alloc > self.max_alloc:
            raise ChatTemplateError(
                f"chat template: values built while rendering add up to over {self.max_alloc} "
                f"characters ({_ALLOC_FACTOR} * max_chars); last: {what}")


def _size(obj: Any, limit: int) -> int:
    """Characters in obj: len of a str, the sizes of a container's items plus one per item
    (stops counting past ``limit``). Other objects count 1."""
    if isinstance(obj, str):
        return len(obj)
    if not isinstance(obj, (list, tuple, dict, set, frozenset)):
        return 1
    total = 0
    stack = [obj]
    seen = set()
    while stack:
        o = stack.pop()
        if isinstance(o, str):
            total += len(o)
        elif isinstance(o, (list, tuple, dict, set, frozenset)):
            if id(o) in seen:
                continue
            seen.add(id(o))
            total += len(o)
            stack.extend(o.items() if isinstance(o, dict) else o)
        else:
            total += 1
        if total > limit:
            break
    return total


def _charge_value(obj: Any, what: str) -> Any:
    b = _budget.get()
    if b is not None:
        b.tick()
        if isinstance(obj, (str, list, tuple, dict, set, frozenset)):
            b.charge(_size(obj, b.max_chars + 1), what)
    return obj


_DIGITS = re.compile(r"\d+")


def _check_args(b: _Budget, args, kwargs, what: str) -> None:
    """No integer argument (a width, a count) over max_chars, no format width over it either."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > b.max_chars:
            raise ChatTemplateError(f"chat template: {what} got the number {a}, over the limit of "
                                    f"{b.max_chars} (max_chars)")


def _check_format(b: _Budget, fmt: str, what: str) -> None:
    for m in _DIGITS.finditer(fmt):
        if len(m.group()) > 7 and int(m.group()) > b.max_chars:
            raise ChatTemplateError(f"chat template: {what} has a width of {m.group()}, over the "
                                    f"limit of {b.max_chars} (max_chars)")


def _precheck_call(b: _Budget, obj: Any, args, kwargs, what: str) -> None:
    """Calls whose result can be far bigger than their arguments: estimate before running."""
    _check_args(b, args, kwargs, what)
    obj = getattr(obj, "__wrapped__", obj)      # the sandbox wraps str.format / format_map
    owner = getattr(obj, "__self__", None)
    name = getattr(obj, "__name__", "")
    if isinstance(owner, str):
        if name == "join" and args:
            est = _size(args[0], b.max_chars * 2) + len(owner) * _count(args[0])
            b.charge(est, what)
        elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
            hits = owner.count(args[0]) if args[0] else len(owner) + 1
            b.charge(len(owner) + hits * len(args[1]), what)
        elif name == "expandtabs":
            width = args[0] if args else kwargs.get("tabsize", 8)
            if isinstance(width, int):
                b.charge(len(owner) + owner.count("\t") * max(width, 0), what)
        elif name in ("format", "format_map"):
            _check_format(b, owner, what)
        elif name == "translate" and args and isinstance(args[0], dict):
            longest = max((_size(v, b.max_chars + 1) for v in args[0].values()), default=1)
            b.charge(len(owner) * max(longest, 1), what)


def _precheck_filter(b: _Budget, name: str, args, kwargs, what: str) -> None:
    """Filters whose result can be far bigger than their arguments (jinja2's signatures)."""
    if not args:
        return
    value, rest = args[0], args[1:]

    def arg(i: int, key: str, default: Any) -> Any:
        return rest[i] if len(rest) > i else kwargs.get(key, default)

    limit = b.max_chars + 1
    if name == "replace" and isinstance(value, str):
        old, new = arg(0, "old", None), arg(1, "new", None)
        if isinstance(old, str) and new is not None:
            hits = value.count(old) if old else len(value) + 1
            b.charge(len(value) + hits * _size(str(new), limit), what)
    elif name == "join" and isinstance(value, (list, tuple, dict, set, frozenset)):
        b.charge(_size(value, limit) + _size(arg(0, "d", ""), limit) * len(value), what)
    elif name == "indent" and isinstance(value, str):
        width = arg(0, "width", 4)
        w = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        b.charge(len(value) + (value.count("\n") + 1) * max(w, 0), what)
    elif name == "wordwrap" and isinstance(value, str):
        width = arg(0, "width", 79)
        wrap = arg(2, "wrapstring", None)
        wrap_len = _size(wrap, limit) if isinstance(wrap, str) else 1
        lines = len(value) // max(width, 1) if isinstance(width, int) else len(value)
        b.charge(len(value) + (lines + value.count("\n") + 1) * wrap_len, what)
    elif name == "format" and isinstance(value, str):
        _check_format(b, value, what)


def _count(obj: Any) -> int:
    try:
        return len(obj)
    except TypeError:
        return 0


def _guard_binop(b: _Budget, op: str, left: Any, right: Any) -> None:
    what = repr(op)
    if op == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0:
            if abs(left) > 1 and right * max(abs(left).bit_length(), 1) > _MAX_INT_BITS:
                raise ChatTemplateError(f"chat template: {left} ** {right} is over the integer size "
                                        f"limit of {_MAX_INT_BITS} bits")
    elif op == "*":
        if isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > _MAX_INT_BITS:
                raise ChatTemplateError(f"chat template: '*' of integers over the integer size limit of "
                                        f"{_MAX_INT_BITS} bits")
            return
        seq, n = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(n, int) and not isinstance(n, bool) and isinstance(seq, (str, list, tuple)):
            b.charge(_size(seq, b.max_chars + 1) * max(n, 0), what)
    elif op == "%" and isinstance(left, str):
        _check_format(b, left, what)
        _check_args(b, right if isinstance(right, tuple) else (right,), {}, what)


def _raise_exception(message: Any = "") -> None:
    raise ChatTemplateError(f"chat template raised: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _make_dict(*args: Any, **kwargs: Any) -> dict:
    return dict(*args, **kwargs)


_ENV = None
_CACHE: dict[str, Any] = {}
_CACHE_MAX = 32


def _environment():
    global _ENV
    if _ENV is not None:
        return _ENV
    import functools

    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.utils import Namespace

    class _SafeNamespace(Namespace):
        """namespace() that refuses attribute names starting with "_"."""

        def __init__(*args: Any, **kwargs: Any) -> None:
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for k in attrs:
                _SafeNamespace._check(k)
            Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            _SafeNamespace._check(name)
            Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if not isinstance(name, str) or name.startswith("_"):
                raise ChatTemplateError(f"chat template: namespace attribute {name!r} refused "
                                        "(names starting with '_' are not allowed)")

    class _Generation(Extension):
        """``{% generation %}...{% endgeneration %}`` (transformers marks assistant text with it):
        renders its body."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body).set_lineno(lineno)

    class _Guards(Extension):
        """Functions the rewritten template calls (reachable only through ExtensionAttribute
        nodes, which no template text can name)."""

        def loop_iter(self, iterable):
            b = _budget.get()
            if b is None:
                yield from iterable
                return
            for item in iterable:
                b.steps += 1
                if b.steps > b.max_steps:
                    raise ChatTemplateError(f"chat template: over {b.max_steps} loop steps (max_steps)")
                if not b.steps & 1023:
                    b.tick()
                yield item

        def concat(self, *items):
            b = _budget.get()
            if b is not None:
                b.charge(sum(len(i) if isinstance(i, str) else _size(str(i), b.max_chars + 1)
                             for i in items), "'~'")
            return "".join(map(str, items))

        def text(self, data):
            return data     # an output expression now: _finalize counts it

    class _Env(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**", "%", "+", "//"])

        def call_binop(self, context, operator, left, right):
            b = _budget.get()
            if b is not None:
                b.tick()
                _guard_binop(b, operator, left, right)
            return _charge_value(super().call_binop(context, operator, left, right), repr(operator))

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's signature)
            b = _budget.get()
            what = f"call of {getattr(__obj, '__name__', type(__obj).__name__)}"
            if b is not None:
                b.tick()
                _precheck_call(b, __obj, args, kwargs, what)
            rv = super().call(__context, __obj, *args, **kwargs)
            return _charge_value(rv, what)

    def _wrap_filter(name, f):
        @functools.wraps(f)
        def guarded(*args, **kwargs):
            b = _budget.get()
            what = f"filter {name}"
            if b is not None:
                b.tick()
                _check_args(b, args, kwargs, what)
                _precheck_filter(b, name, args[1:] if passes_first else args, kwargs, what)
            return _charge_value(f(*args, **kwargs), what)
        passes_first = getattr(f, "jinja_pass_arg", None) is not None
        return guarded

    def _finalize(value):
        # every {{ }} output and (through _Guards.text) every piece of literal text, wherever it
        # goes: the rendered text, a {% set %} block, a macro's or a {% call %}'s result
        b = _budget.get()
        if b is not None:
            b.charge(len(value) if isinstance(value, str) else _size(str(value), b.max_chars + 1), "output")
        return value

    env = _Env(trim_blocks=True, lstrip_blocks=True, finalize=_finalize,
               extensions=[loopcontrols, _Generation, _Guards])
    for name, f in list(env.filters.items()):
        env.filters[name] = _wrap_filter(name, f)
    env.filters["tojson"] = _wrap_filter("tojson", _tojson)
    env.globals.pop("lipsum", None)
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now,
                       namespace=_SafeNamespace, dict=_make_dict)
    env._ember_guards = env.extensions[_Guards.identifier]   # noqa: SLF001 (our own attribute)
    _ENV = env
    return env


def _rewrite(env, ast):
    """Route every loop iterable, ``~`` concatenation and piece of literal template text through
    the guards, so the limits hold wherever a template builds text."""
    from jinja2 import nodes
    from jinja2.visitor import NodeTransformer
    g = env._ember_guards

    def call(method, args):
        return nodes.Call(g.attr(method), args, [], None, None)

    class Rewrite(NodeTransformer):
        def visit_For(self, node):
            node = self.generic_visit(node)
            node.iter = call("loop_iter", [node.iter])
            return node

        def visit_Concat(self, node):
            node = self.generic_visit(node)
            return call("concat", node.nodes).set_lineno(node.lineno)

        def visit_TemplateData(self, node):
            return call("text", [nodes.Const(node.data)]).set_lineno(node.lineno)

    return Rewrite().visit(ast)


def _compile(template: str):
    t = _CACHE.get(template)
    if t is not None:
        return t
    import jinja2
    env = _environment()
    try:
        ast = env.parse(template)
        t = env.from_string(_rewrite(env, ast))
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template does not parse: line {e.lineno}: {e.message}") from None
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template does not compile: {e}") from None
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[template] = t
    return t


def apply_chat_template(template: str, messages: list[dict], *, add_generation_prompt: bool = True,
                        bos_token: str | None = None, eos_token: str | None = None,
                        max_chars: int = MAX_RENDER_CHARS, max_steps: int = MAX_LOOP_STEPS,
                        timeout: float = RENDER_TIMEOUT_S, **extra: Any) -> str:
    """Render a chat template for ``messages`` (``[{"role": ..., "content": ...}, ...]``), as
    transformers' ``tokenizer.apply_chat_template(messages, tokenize=False)`` does.

    The template sees ``messages``, ``add_generation_prompt``, ``bos_token`` and ``eos_token``
    (when given) and every keyword of ``extra`` (``tools=...``, ``documents=...``,
    ``enable_thinking=...``). See the module docstring for the limits ``max_chars``,
    ``max_steps`` and ``timeout``; everything that goes wrong is a ChatTemplateError.

    >>> t = ("{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] }}{% endfor %}"
    ...      "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    >>> apply_chat_template(t, [{"role": "user", "content": "Hi"}])
    '<|user|>Hi<|assistant|>'
    >>> try:
    ...     apply_chat_template("{{ ''.__class__.__mro__ }}", [])
    ... except ChatTemplateError as e:
    ...     print(str(e)[:57])
    chat template tried to leave the sandbox: access to attri
    """
    import jinja2
    from jinja2.exceptions import SecurityError

    if not isinstance(template, str):
        raise ChatTemplateError(f"chat template must be a str, got {type(template).__name__}")
    compiled = _compile(template)
    ctx = dict(extra)
    ctx["messages"] = messages
    ctx["add_generation_prompt"] = add_generation_prompt
    if bos_token is not None:
        ctx["bos_token"] = bos_token
    if eos_token is not None:
        ctx["eos_token"] = eos_token
    budget = _Budget(int(max_chars), int(max_steps), float(timeout))
    token = _budget.set(budget)
    out: list[str] = []
    total = 0
    try:
        for chunk in compiled.generate(**ctx):
            total += len(chunk)
            if total > budget.max_chars:
                raise ChatTemplateError(f"chat template: rendered text is over {budget.max_chars} "
                                        "characters (max_chars)")
            out.append(chunk)
    except ChatTemplateError:
        raise
    except SecurityError as e:
        raise ChatTemplateError(f"chat template tried to leave the sandbox: {e}") from None
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
    except RecursionError:
        raise ChatTemplateError("chat template: recursion too deep (macros or recursive loops)") from None
    except MemoryError:
        raise ChatTemplateError("chat template: out of memory while rendering") from None
    except Exception as e:  # any error of the template's own expressions ('a' + 1, 1 / 0...)
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
    finally:
        _budget.reset(token)
    return "".join(out)
