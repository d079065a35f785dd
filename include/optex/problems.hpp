// All shipped test problems and their wrappers, in namespace optex::problems.
// Formulas, domains and minima follow the SFU virtual library of test functions
// (Surjanovic and Bingham), in any dimension d.
#pragma once

#include "optex/problems/ackley.hpp"
#include "optex/problems/domain.hpp"
#include "optex/problems/gradient_noise.hpp"
#include "optex/problems/griewank.hpp"
#include "optex/problems/levy.hpp"
#include "optex/problems/problem_base.hpp"
#include "optex/problems/rastrigin.hpp"
#include "optex/problems/rosenbrock.hpp"
#include "optex/problems/rotated.hpp"
#include "optex/problems/schwefel.hpp"
#include "optex/problems/sphere.hpp"
#include "optex/problems/styblinski_tang.hpp"
