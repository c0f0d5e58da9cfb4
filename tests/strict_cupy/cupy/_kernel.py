"""``cupy.ElementwiseKernel`` emulated: the C body is parsed (a subset of C: declarations,
assignments, arithmetic, comparisons, ``||``/``&&``/``!``, ``?:``, casts, literals with
their suffixes, CUDA's math functions and bit casts) and evaluated over whole NumPy arrays
with C's types: every variable and intermediate has the C type the rules of C give it
(integer promotion, the usual arithmetic conversions, truncating integer division), and
the operands must have the declared dtypes (CuPy: ``TypeError: Type is mismatched``).
A body outside the subset raises :class:`cupy.cuda.compiler.CompileException` when the
kernel is first called, as a compile error would."""
import re

import numpy as np

from cupy._strict import launch, ndarray, used

C_TYPES = {
    "bool": np.bool_, "signed char": np.int8, "char": np.int8, "unsigned char": np.uint8,
    "short": np.int16, "unsigned short": np.uint16, "int": np.int32, "unsigned int": np.uint32,
    "unsigned": np.uint32, "long long": np.int64, "unsigned long long": np.uint64, "long": np.int64,
    "unsigned long": np.uint64, "float": np.float32, "double": np.float64,
    "int8_t": np.int8, "uint8_t": np.uint8, "int16_t": np.int16, "uint16_t": np.uint16,
    "int32_t": np.int32, "uint32_t": np.uint32, "int64_t": np.int64, "uint64_t": np.uint64,
}
C_TYPES = {k: np.dtype(v) for k, v in C_TYPES.items()}
_TYPE_WORDS = {"bool", "signed", "unsigned", "char", "short", "int", "long", "float", "double",
               "int8_t", "uint8_t", "int16_t", "uint16_t", "int32_t", "uint32_t", "int64_t", "uint64_t"}
_INT_RANK = {1: 1, 2: 2, 4: 3, 8: 4}


class CompileException(Exception):
    """``cupy.cuda.compiler.CompileException``."""


# ---------------------------------------------------------------------------------------
# C's type rules
# ---------------------------------------------------------------------------------------


def _promote(t):
    """Integer promotion: bool, char and short become int."""
    if t.kind in "biu" and t.itemsize < 4:
        return np.dtype(np.int32)
    return t


def _arith(a, b):
    """C's usual arithmetic conversions."""
    a, b = _promote(a), _promote(b)
    if a.kind == "f" or b.kind == "f":
        return np.dtype(np.float64) if np.float64 in (a, b) else np.dtype(np.float32)
    if a == b:
        return a
    if a.kind == b.kind:
        return a if a.itemsize >= b.itemsize else b
    s, u = (a, b) if a.kind == "i" else (b, a)
    if u.itemsize >= s.itemsize:
        return u
    return s  # a wider signed type holds every value of the unsigned one


class V:
    """A C value: a NumPy array (or scalar) of the C type ``t``."""

    __slots__ = ("x", "t")

    def __init__(self, x, t):
        self.x, self.t = x, np.dtype(t)


def _cast(v, t):
    t = np.dtype(t)
    if v.t == t:
        return v
    with np.errstate(all="ignore"):
        if t.kind == "b":
            return V(np.asarray(v.x) != 0, t)
        return V(np.asarray(v.x).astype(t), t)


def _binary(op, a, b):
    if op in ("||", "&&"):
        x, y = _cast(a, np.bool_).x, _cast(b, np.bool_).x
        return V((x | y) if op == "||" else (x & y), np.int32)
    t = _arith(a.t, b.t)
    x, y = _cast(a, t).x, _cast(b, t).x
    with np.errstate(all="ignore"):
        if op in ("<", ">", "<=", ">=", "==", "!="):
            r = {"<": np.less, ">": np.greater, "<=": np.less_equal, ">=": np.greater_equal,
                 "==": np.equal, "!=": np.not_equal}[op](x, y)
            return V(np.asarray(r).astype(np.int32), np.int32)
        if op == "+":
            r = np.add(x, y)
        elif op == "-":
            r = np.subtract(x, y)
        elif op == "*":
            r = np.multiply(x, y)
        elif op == "/":
            if t.kind == "f":
                r = np.true_divide(x, y)
            else:  # C truncates toward zero
                r = _int_div(x, y, t)
        elif op == "%":
            if t.kind == "f":
                raise CompileException("invalid operands to binary % (float)")
            r = np.fmod(x, np.where(np.asarray(y) == 0, 1, y))
        elif op in ("&", "|", "^", "<<", ">>"):
            if t.kind == "f":
                raise CompileException(f"invalid operands to binary {op} (float)")
            r = {"&": np.bitwise_and, "|": np.bitwise_or, "^": np.bitwise_xor,
                 "<<": np.left_shift, ">>": np.right_shift}[op](x, y)
        else:
            raise CompileException(f"unsupported operator {op}")
    return V(np.asarray(r).astype(t), t)


def _int_div(x, y, t):
    x, y = np.asarray(x, dtype=t), np.asarray(y, dtype=t)
    safe = np.where(y == 0, np.ones((), t), y)
    q = np.floor_divide(x, safe)
    if t.kind == "i":  # floor -> truncation where the signs differ and the division is inexact
        fix = (np.remainder(x, safe) != 0) & ((x < 0) != (safe < 0))
        q = q + fix.astype(t)
    return np.where(y == 0, np.zeros((), t), q).astype(t)


def _erf(x):
    try:
        from scipy.special import erf
        return erf(x)
    except ImportError:  # pragma: no cover - scipy comes with the test extras
        import math
        return np.vectorize(math.erf, otypes=[np.asarray(x).dtype])(x)


_FUNCTIONS = {
    "exp": np.exp, "log": np.log, "log1p": np.log1p, "expm1": np.expm1, "sqrt": np.sqrt, "tanh": np.tanh,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "log2": np.log2, "log10": np.log10, "atan": np.arctan,
    "asin": np.arcsin, "acos": np.arccos, "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh,
    "acosh": np.arccosh, "atanh": np.arctanh, "fabs": np.abs, "floor": np.floor, "ceil": np.ceil,
    "trunc": np.trunc, "round": np.round, "rint": np.rint, "cbrt": np.cbrt, "exp2": np.exp2, "erf": _erf,
    "pow": np.power, "atan2": np.arctan2, "fmax": np.fmax, "fmin": np.fmin, "fmod": np.fmod,
    "copysign": np.copysign, "hypot": np.hypot,
}
_FLOAT_SUFFIXED = {name + "f": name for name in list(_FUNCTIONS)}


def _call(name, args):
    if name == "__int_as_float":
        return V(np.asarray(_cast(args[0], np.int64).x).astype(np.uint32).view(np.float32), np.float32)
    if name == "__longlong_as_double":
        return V(np.asarray(_cast(args[0], np.int64).x).astype(np.int64).view(np.float64), np.float64)
    if name in ("isnan", "isinf", "isfinite", "signbit"):
        return V(getattr(np, name)(args[0].x), np.bool_)
    if name in ("max", "min") and len(args) == 2:
        t = _arith(args[0].t, args[1].t)
        x, y = _cast(args[0], t).x, _cast(args[1], t).x
        return V(np.asarray(np.maximum(x, y) if name == "max" else np.minimum(x, y)).astype(t), t)
    if name in ("abs",) and len(args) == 1:
        return V(np.abs(args[0].x), args[0].t)
    if name in _FLOAT_SUFFIXED:  # expf, powf...: the float versions
        t = np.dtype(np.float32)
        fn = _FUNCTIONS[_FLOAT_SUFFIXED[name]]
    elif name in _FUNCTIONS:
        fn = _FUNCTIONS[name]
        # CUDA's overloads: float arguments stay float, anything else is double
        kinds = [_promote(a.t) for a in args]
        t = np.dtype(np.float32) if all(k == np.float32 for k in kinds) else np.dtype(np.float64)
    else:
        raise CompileException(f"identifier \"{name}\" is undefined")
    with np.errstate(all="ignore"):
        r = fn(*[_cast(a, t).x for a in args])
    return V(np.asarray(r).astype(t), t)


# ---------------------------------------------------------------------------------------
# The parser: tokens, then statements and expressions, evaluated as they are parsed
# ---------------------------------------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<ws>\s+|//[^\n]*|/\*.*?\*/)
  | (?P<num>0[xX][0-9a-fA-F]+[uUlL]*|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[fFuUlL]*)
  | (?P<id>[A-Za-z_]\w*)
  | (?P<op>\|\||&&|==|!=|<=|>=|<<|>>|[-+*/%<>!?:;=(),&|^~])
""", re.X | re.S)


def tokenize(src):
    tokens, pos = [], 0
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if m is None:
            raise CompileException(f"unexpected character {src[pos]!r} in the kernel body")
        pos = m.end()
        if m.lastgroup != "ws":
            tokens.append((m.lastgroup, m.group()))
    return tokens


def _literal(text):
    t = text.lower()
    if t.startswith("0x"):
        digits = t.rstrip("ul")
        suffix = t[len(digits):]
        value = int(digits, 16)
    elif any(c in t for c in ".e") or (t.endswith("f") and not t.startswith("0x")):
        if t.endswith("f"):
            return V(np.float32(float(t[:-1])), np.float32)
        return V(np.float64(float(t)), np.float64)
    else:
        digits = t.rstrip("ul")
        suffix = t[len(digits):]
        value = int(digits)
    unsigned, longs = "u" in suffix, suffix.count("l")
    if longs >= 1 or value > 2**31 - 1:
        t = np.uint64 if unsigned or value > 2**63 - 1 else np.int64
    else:
        t = np.uint32 if unsigned else np.int32
    return V(np.array(value, dtype=t)[()], t)


class _Parser:
    def __init__(self, tokens, env):
        self.toks, self.i, self.env = tokens, 0, env

    def peek(self, k=0):
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else (None, None)

    def take(self, want=None):
        tok = self.peek()
        if tok[0] is None or (want is not None and tok[1] != want):
            raise CompileException(f"expected {want!r}, found {tok[1]!r}")
        self.i += 1
        return tok[1]

    def type_at(self, k=0):
        """The C type name starting at token k ahead, and its length in tokens (or None)."""
        words, j = [], k
        while self.peek(j)[0] == "id" and self.peek(j)[1] in _TYPE_WORDS:
            words.append(self.peek(j)[1])
            j += 1
        if not words:
            return None, 0
        name = " ".join(words).replace("signed char", "signed char")
        if name.startswith("signed ") and name != "signed char":
            name = name[len("signed "):]
        if name.endswith(" int") and name not in ("unsigned int",):
            name = name[:-4]
        if name not in C_TYPES:
            raise CompileException(f"unknown type {name!r}")
        return name, j - k

    # statements
    def run(self):
        while self.peek()[0] is not None:
            if self.peek()[1] == ";":
                self.take()
                continue
            name, n = self.type_at()
            if name is not None:
                self.i += n
                var = self.take()
                self.take("=")
                self.env[var] = _cast(self.expr(), C_TYPES[name])
                self.take(";")
                continue
            var = self.take()
            op = self.take()
            if op not in ("=",):
                raise CompileException(f"unsupported statement at {var} {op}")
            value = self.expr()
            target = self.env.get(var)
            if target is None:
                raise CompileException(f"identifier \"{var}\" is undefined")
            self.env[var] = _cast(value, target.t)
            self.take(";")

    # expressions, by precedence
    def expr(self):
        cond = self.binary(0)
        if self.peek()[1] == "?":
            self.take("?")
            a = self.expr()
            self.take(":")
            b = self.expr()
            t = _arith(a.t, b.t) if not (a.t == b.t) else a.t
            c = _cast(cond, np.bool_).x
            return V(np.where(c, _cast(a, t).x, _cast(b, t).x).astype(t), t)
        return cond

    _LEVELS = [("||",), ("&&",), ("|",), ("^",), ("&",), ("==", "!="), ("<", ">", "<=", ">="), ("<<", ">>"),
               ("+", "-"), ("*", "/", "%")]

    def binary(self, level):
        if level == len(self._LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while self.peek()[0] == "op" and self.peek()[1] in self._LEVELS[level]:
            op = self.take()
            right = self.binary(level + 1)
            left = _binary(op, left, right)
        return left

    def unary(self):
        kind, tok = self.peek()
        if tok == "-":
            self.take()
            v = self.unary()
            t = _promote(v.t)
            with np.errstate(all="ignore"):
                return V(np.negative(_cast(v, t).x), t)
        if tok == "+":
            self.take()
            v = self.unary()
            return _cast(v, _promote(v.t))
        if tok == "!":
            self.take()
            return V(np.logical_not(_cast(self.unary(), np.bool_).x).astype(np.int32), np.int32)
        if tok == "~":
            self.take()
            v = self.unary()
            t = _promote(v.t)
            return V(np.invert(_cast(v, t).x), t)
        if tok == "(":
            name, n = self.type_at(1)
            if name is not None and self.peek(1 + n)[1] == ")":  # a cast
                self.i += 2 + n
                return _cast(self.unary(), C_TYPES[name])
        return self.primary()

    def primary(self):
        kind, tok = self.peek()
        if tok == "(":
            self.take()
            v = self.expr()
            self.take(")")
            return v
        if kind == "num":
            self.take()
            return _literal(tok)
        if kind == "id":
            self.take()
            if tok in ("true", "false"):
                return V(np.bool_(tok == "true"), np.bool_)
            if self.peek()[1] == "(":
                self.take()
                args = []
                if self.peek()[1] != ")":
                    args.append(self.expr())
                    while self.peek()[1] == ",":
                        self.take()
                        args.append(self.expr())
                self.take(")")
                return _call(tok, args)
            if tok not in self.env:
                raise CompileException(f"identifier \"{tok}\" is undefined")
            return self.env[tok]
        raise CompileException(f"unexpected token {tok!r}")


# ---------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------


def _params(text):
    """``[(dtype or None, type placeholder, name, raw)]`` of ``"float32 x, T y"``."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        words = part.split()
        raw = words[0] == "raw"
        if raw:
            words = words[1:]
        if len(words) != 2:
            raise CompileException(f"cannot parse the parameter {part!r}")
        type_name, name = words
        try:
            dtype = np.dtype(type_name)
            if len(type_name) == 1:  # a one-letter name is a type placeholder (T), not a dtype code
                raise TypeError
        except TypeError:
            dtype = None
        out.append((dtype, type_name, name, raw))
    return out


class ElementwiseKernel:
    """``cupy.ElementwiseKernel(in_params, out_params, operation, name, ...)``."""

    def __init__(self, in_params, out_params, operation, name="kernel", reduce_dims=True, preamble="",
                 no_return=False, return_tuple=False, loop_prep="", after_loop="", options=(), **kwargs):
        self.in_params = _params(in_params)
        self.out_params = _params(out_params)
        self.nin, self.nout = len(self.in_params), len(self.out_params)
        self.operation, self.name = operation, name
        self.return_tuple, self.no_return, self.options = return_tuple, no_return, tuple(options)
        self._tokens = None

    def _compile(self):
        if self._tokens is None:
            self._tokens = tokenize(self.operation)
        return self._tokens

    def __call__(self, *args, size=None, block_size=None, stream=None):
        used("cupy.ElementwiseKernel")
        if len(args) not in (self.nin, self.nin + self.nout):
            raise TypeError(f"Wrong number of arguments for {self.name!r}")
        for a in args:
            if type(a) is np.ndarray:
                raise TypeError(f"Unsupported type {type(a)}")
        types = {}
        for (dtype, tname, pname, _), a in zip(self.in_params + self.out_params, args):
            if type(a) is not ndarray:
                continue
            want = dtype if dtype is not None else types.setdefault(tname, a.dtype)
            if a.dtype != want:
                raise TypeError(f"Type is mismatched. {pname} {a.dtype.type} {want.type}")
        ins, outs = list(args[:self.nin]), list(args[self.nin:])
        shape = np.broadcast_shapes(*[a.shape for a in args if type(a) is ndarray])
        if not outs:
            for dtype, tname, _, _ in self.out_params:
                t = dtype if dtype is not None else types.get(tname)
                if t is None:
                    raise TypeError(f"Cannot determine the output type of {self.name!r}")
                import cupy
                outs.append(cupy.empty(shape, dtype=t))
        for o in outs:
            if type(o) is not ndarray:
                raise TypeError("Output arguments must be cupy.ndarray")
            if o.shape != shape:
                raise ValueError(f"Out shape is mismatched: {o.shape} against {shape}")
        tokens = self._compile()

        def run(*arrays):
            ins_a, outs_a = arrays[:self.nin], arrays[self.nin:]
            env = {}
            for (dtype, tname, pname, _), a in zip(self.in_params, ins_a):
                t = dtype if dtype is not None else types[tname]
                env[pname] = V(np.broadcast_to(np.asarray(a, dtype=t) if not isinstance(a, np.ndarray) else a,
                                               shape), t)
            for (dtype, tname, pname, _), o in zip(self.out_params, outs_a):
                env[pname] = V(o, o.dtype)
            _Parser(tokens, env).run()
            for (_, _, pname, _), o in zip(self.out_params, outs_a):
                np.copyto(o, np.broadcast_to(env[pname].x, shape), casting="unsafe")

        launch(self.name, run, tuple(ins) + tuple(outs))
        if self.no_return:
            return None
        if self.return_tuple or len(outs) > 1:
            return tuple(outs)
        return outs[0]
