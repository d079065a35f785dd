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
template <class Class>
Class& exported_from(Class& cls, const char* module) {
  cls.attr("__module__") = module;
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

}  // namespace optex::python
