// An engine's whole state (optex::EngineSnapshot) as a dict of Python scalars,
// lists, dicts and numpy arrays, and back: OptEx.state_arrays() and
// OptEx.from_state_arrays(). The dict's keys are documented in
// python/optex/_optex.pyi (_StateArrays); reading one back is strict, so
// that a state that loads is exactly a state that was written.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "optex/engine/engine_snapshot.hpp"

namespace optex::python {

namespace py = pybind11;

// The layout of the dict, its "format" key: changes when a key does.
inline constexpr int kStateArraysFormat = 1;

// The dict of `snapshot`, whose arrays it takes over (copies of the engine's
// memory, never views of it); without the "history" key when `with_history`
// is false (the snapshot forgot its history).
py::dict state_arrays(EngineSnapshot snapshot, bool with_history);

// The snapshot a dict holds: every documented key present ("history" may be
// omitted: an empty history), no other key, each value of its type and each
// array of exactly its dtype and number of dimensions (any strides: it is
// copied). Raises ValueError naming the key. The values themselves are
// validate()'s to check (state_key names the key of its refusal).
EngineSnapshot snapshot_from_arrays(py::handle state);

// The key of the dict ("history['points']", "slots['exp_avg']") that holds
// the field a refusal of validate() names, for an optimizer of kind `kind`.
std::string state_key(const InvalidSnapshot& refusal, const Optimizer& kind);

}  // namespace optex::python
