// All shipped test problems and their wrappers, in namespace optex::problems.
// Formulas, domains and minima of the eight classic functions follow the SFU virtual
// library of test functions (Surjanovic and Bingham), in any dimension d; Ellipsoid
// and NoisyQuadratic are the quadratics of conditioning and batch-size studies.
#pragma once

#include "optex/problems/ackley.hpp"
#include "optex/problems/domain.hpp"
#include "optex/problems/ellipsoid.hpp"
#include "optex/problems/gradient_noise.hpp"
#include "optex/problems/griewank.hpp"
#include "optex/problems/levy.hpp"
#include "optex/problems/noisy_quadratic.hpp"
#include "optex/problems/problem_base.hpp"
#include "optex/problems/rastrigin.hpp"
#include "optex/problems/rosenbrock.hpp"
#include "optex/problems/rotated.hpp"
#include "optex/problems/schwefel.hpp"
#include "optex/problems/sphere.hpp"
#include "optex/problems/styblinski_tang.hpp"
