"""The expression language front end (LGen's "LL"): parse, declare, type check, evaluate.

    from blacc.frontend import parse, check, evaluate, Matrix, Vector, Scalar
    decls = {"A": Matrix(5, 9), "x": Vector(9), "y": Vector(5), "alpha": Scalar()}
    typed = check(parse("y = alpha*A*x + y"), decls)     # TypedProgram
    evaluate(typed, {"A": A, "x": x, "y": y, "alpha": 2.0})  # {"y": ...}, float64

or build the same program in Python: ``to_program({"y": alpha * A @ x + y}, names=decls)``.

Modules: ``ast`` (syntax tree), ``parser``, ``types`` (declarations), ``typed`` (typed
tree), ``typecheck``, ``builder``, ``reference`` (NumPy interpreter), ``names``.
"""

from .ast import Program
from .builder import to_program
from .parser import parse
from .reference import evaluate
from .typecheck import check
from .typed import TypedProgram
from .types import Matrix, Scalar, Vector

__all__ = ["Matrix", "Program", "Scalar", "TypedProgram", "Vector", "check", "evaluate",
           "parse", "to_program"]
