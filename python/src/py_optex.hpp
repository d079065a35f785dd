// optex.OptEx's C++ side: the object that owns the Engine and lets one call
// in at a time, and the functions that add the class's methods, one file per
// concept, called in this order by register_engine (engine.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "optex/engine/engine.hpp"
#include "shard.hpp"

namespace optex::python {

namespace py = pybind11;

// The Python object's C++ side. The engine is never replaced for the object's
// lifetime: the arrays ask() returns point into its batch. A slice of a
// sharded engine also owns the object that completes its sums (declared
// first: it outlives the engine that points to it).
class PyOptEx {
 public:
  explicit PyOptEx(Engine engine, std::unique_ptr<PythonShardSums> sums = nullptr)
      : sums_(std::move(sums)), engine_(std::move(engine)) {}

  Engine& engine() { return engine_; }
  bool is_slice() const { return !engine_.shard().is_whole(); }

  // An Engine is not thread-safe, and ask(), tell(), save() and the gradient
  // oracle run with the GIL released: a second thread calling into the same
  // object meanwhile gets a RuntimeError instead of a data race. `busy_` is
  // only read and written with the GIL held.
  void check_idle(const char* what) const {
    if (busy_) {
      throw std::runtime_error(std::string(what) +
                               ": this OptEx is busy in another call (ask, tell, save or the "
                               "gradient oracle, or its shard's sums); an OptEx must not be "
                               "used from two threads at once");
    }
  }

  // One call at a time. A call that fails leaves the engine unchanged, on a
  // slice too: a history push keeps what it overwrites until its sums are
  // complete (GradientHistory::push_all).
  class Exclusive {
   public:
    Exclusive(PyOptEx& owner, const char* what) : owner_(owner) {
      owner_.check_idle(what);
      owner_.busy_ = true;
    }
    ~Exclusive() { owner_.busy_ = false; }
    Exclusive(const Exclusive&) = delete;
    Exclusive& operator=(const Exclusive&) = delete;

   private:
    PyOptEx& owner_;
  };

  // Reads with the object idle.
  const Engine& idle_engine(const char* what) const {
    check_idle(what);
    return engine_;
  }

 private:
  std::unique_ptr<PythonShardSums> sums_;  // a slice's; nullptr for a whole engine
  Engine engine_;
  bool busy_ = false;
};

inline std::runtime_error no_pending_batch(const char* what, const Engine& e) {
  return std::runtime_error(std::string(what) + ": no pending batch (iteration " +
                            std::to_string(e.iteration()) + "): call ask() first");
}

using OptExClass = py::class_<PyOptEx>;

// The methods of optex.OptEx, one function per concept in the file named
// after it; register_engine (engine.cpp) calls them in this order.
void define_ask_tell(OptExClass& cls);     // ask_tell.cpp: ask, tell, observe
void define_device_rows(OptExClass& cls);  // device_rows.cpp: device_*, tell_device
void define_settings(OptExClass& cls);     // engine_settings.cpp: set_*
void define_checkpoints(OptExClass& cls);  // engine_checkpoints.cpp: save, load, *state_arrays
void define_properties(OptExClass& cls);   // engine_properties.cpp: x, dim, ..., __repr__

}  // namespace optex::python
