"""The shipped test problems, computed by the C++ optex::problems code.

Each problem evaluates one point (d,) or a batch of points (B, d):

    f = optex.problems.Rosenbrock()
    loss, grad = f.value_and_grad(f.standard_start(20))     # float, (20,) float32
    losses, grads = f.value_and_grad(points)                 # (B,), (B, 20)

Rotated and WithGradientNoise wrap any of them.
"""

from ._optex import problems as _compiled

Problem = _compiled.Problem
Domain = _compiled.Domain
Sphere = _compiled.Sphere
Rosenbrock = _compiled.Rosenbrock
Ackley = _compiled.Ackley
Rastrigin = _compiled.Rastrigin
Levy = _compiled.Levy
Griewank = _compiled.Griewank
StyblinskiTang = _compiled.StyblinskiTang
Schwefel = _compiled.Schwefel
Rotated = _compiled.Rotated
WithGradientNoise = _compiled.WithGradientNoise
uniform_start = _compiled.uniform_start

__all__ = [
    "Ackley",
    "Domain",
    "Griewank",
    "Levy",
    "Problem",
    "Rastrigin",
    "Rosenbrock",
    "Rotated",
    "Schwefel",
    "Sphere",
    "StyblinskiTang",
    "WithGradientNoise",
    "uniform_start",
]
