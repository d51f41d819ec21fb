"""The exceptions blacc raises. Each names the problem in its message."""


class BlaccError(Exception):
    """Base class of every error blacc raises on purpose."""


class ArgumentError(BlaccError, ValueError):
    """A call got an argument it cannot use (read-only output, bad scalar, ...)."""


class ShapeError(ArgumentError):
    """Operand shapes disagree, or an operand has the wrong number of dimensions."""


class AliasingError(ArgumentError):
    """The output shares memory with an input where that is not safe."""


class DTypeError(BlaccError, TypeError):
    """An operand has an unsupported dtype, or operands have mixed dtypes."""


class ScheduleError(BlaccError, ValueError):
    """A transformation's preconditions do not hold; the tuner skips such candidates."""


class CompilerError(BlaccError, RuntimeError):
    """The system C compiler failed, or no working compiler was found."""


class CompilerNotFoundError(CompilerError):
    """No working C compiler: neither $CC nor cc, gcc or clang on PATH."""


class ParseError(BlaccError, ValueError):
    """Source text of the expression language does not parse; the message shows where."""


class TypeCheckError(BlaccError, ValueError):
    """A program parses but is ill-typed: shapes disagree, an undeclared name, an output
    that cannot be computed in place, ...; the message names the statement and column."""
