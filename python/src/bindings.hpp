// What the files of the extension module optex._optex share: one register
// function per concept, called in dependency order by module.cpp.
#pragma once

#include <pybind11/pybind11.h>

namespace optex::python {

namespace py = pybind11;

// The module the user imports a class from ("optex" or "optex.problems"),
// rather than the private extension's name: it is what repr(), help(), the
// generated signatures and pickle show and use. Call it right after creating a
// class, before any signature that mentions the class is generated.
//
// It also makes pickle protocols 0 and 1 work as protocol 2 does. pybind11
// supports protocols 2 and up only: with 0 or 1, copyreg asks pybind11's base
// type for a bare instance, which throws through C and aborts the interpreter,
// for a class with py::pickle and without. Protocol 2's reduction
// (copyreg.__newobj__ and the state, or TypeError for a class without
// py::pickle) is one that protocols 0 and 1 can write, as an ordinary call.
template <class Class>
Class& exported_from(Class& cls, const char* module) {
  cls.attr("__module__") = module;
  cls.def(
      "__reduce_ex__",
      [](py::handle self, int /*protocol*/) {
        return py::module_::import("builtins").attr("object").attr("__reduce_ex__")(self, 2);
      },
      py::arg("protocol"), "Pickle support: every protocol reduces as protocol 2 does.");
  return cls;
}

// Errors are raised as the C++ exception types pybind11 translates
// (std::invalid_argument -> ValueError, std::runtime_error -> RuntimeError,
// std::out_of_range -> IndexError), like the core library's own.
void register_optimizers(py::module_& m);       // Sgd, Adam, AdamW, RmsProp, Lion
void register_optimizer_state(py::module_& m);  // OptimizerState, init_state, apply_step
void register_options(py::module_& m);          // Options
void register_engine(py::module_& m);           // OptEx, IterationInfo
void register_problems(py::module_& m);         // the optex.problems submodule
void register_point_split(py::module_& m);      // point_range
void register_shard(py::module_& m);            // shard_of, slice_ranges
void register_plan(py::module_& m);             // plan, Plan, PlanCandidate

}  // namespace optex::python
