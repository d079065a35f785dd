// optex.DeviceArray and the DLPack protocol (__dlpack__, __dlpack_device__).
#include "dlpack.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "bindings.hpp"

namespace optex::python {
namespace {

// The DLPack ABI (dmlc/dlpack, include/dlpack/dlpack.h), declared here rather
// than vendored: these structs are all a producer needs, and their layout is
// frozen by the standard. Two capsule kinds: the unversioned DLManagedTensor
// ("dltensor", DLPack < 1.0), which every consumer reads, and
// DLManagedTensorVersioned ("dltensor_versioned", 1.0), which carries a
// read-only flag; consumers that pass max_version >= (1, 0) get the latter.
enum DLDeviceType : std::int32_t { kDLCPU = 1, kDLCUDA = 2 };
enum DLDataTypeCode : std::uint8_t { kDLFloat = 2 };
struct DLDevice {
  std::int32_t device_type;
  std::int32_t device_id;
};
struct DLDataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  std::int32_t ndim;
  DLDataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  // in elements
  std::uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
struct DLPackVersion {
  std::uint32_t major;
  std::uint32_t minor;
};
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned* self);
  std::uint64_t flags;
  DLTensor dl_tensor;
};
constexpr std::uint64_t kDLPackReadOnly = 1;  // DLPACK_FLAG_BITMASK_READ_ONLY

// Per capsule kind: the managed struct and the capsule's names.
template <class Managed>
struct CapsuleKind;
template <>
struct CapsuleKind<DLManagedTensor> {
  static constexpr const char* name = "dltensor";
  static constexpr const char* used = "used_dltensor";
};
template <>
struct CapsuleKind<DLManagedTensorVersioned> {
  static constexpr const char* name = "dltensor_versioned";
  static constexpr const char* used = "used_dltensor_versioned";
};

// What one exported tensor owns: a reference to the memory's owner and the
// shape and strides its DLTensor points at.
template <class Managed>
struct Export {
  Managed managed{};
  PyObject* owner = nullptr;
  std::int64_t shape[2] = {0, 0};
  std::int64_t strides[2] = {0, 0};
};

// Called by the consumer when it is done, from any thread, with or without the GIL.
template <class Managed>
void release_export(Managed* managed) {
  auto* e = static_cast<Export<Managed>*>(managed->manager_ctx);
  if (Py_IsInitialized()) {
    const PyGILState_STATE gil = PyGILState_Ensure();
    Py_XDECREF(e->owner);
    PyGILState_Release(gil);
  }
  delete e;
}

// A capsule that no consumer took (one that did renames it "used_...") still owns its tensor.
template <class Managed>
void release_unused_capsule(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, CapsuleKind<Managed>::used)) return;
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);  // a destructor must not disturb a pending error
  auto* managed = static_cast<Managed*>(PyCapsule_GetPointer(capsule, CapsuleKind<Managed>::name));
  if (managed != nullptr) {
    managed->deleter(managed);
  } else {
    PyErr_WriteUnraisable(capsule);
  }
  PyErr_Restore(type, value, traceback);
}

DLDevice dl_device(const Device& d) {
  return d.is_cuda() ? DLDevice{kDLCUDA, d.index} : DLDevice{kDLCPU, 0};
}

template <class Managed>
py::capsule make_capsule(const DeviceArray& a) {
  auto e = std::make_unique<Export<Managed>>();
  const bool matrix = a.ndim == 2;
  e->shape[0] = static_cast<std::int64_t>(matrix ? a.rows : a.cols);
  e->shape[1] = static_cast<std::int64_t>(a.cols);
  e->strides[0] = matrix ? static_cast<std::int64_t>(a.cols) : 1;
  e->strides[1] = 1;
  DLTensor& t = e->managed.dl_tensor;
  t.data = a.data;
  t.device = dl_device(a.device);
  t.ndim = a.ndim;
  t.dtype = DLDataType{kDLFloat, 32, 1};
  t.shape = e->shape;
  t.strides = e->strides;
  t.byte_offset = 0;
  if constexpr (std::is_same_v<Managed, DLManagedTensorVersioned>) {
    e->managed.version = DLPackVersion{1, 0};
    e->managed.flags = a.writable ? 0 : kDLPackReadOnly;
  }
  e->managed.manager_ctx = e.get();
  e->managed.deleter = release_export<Managed>;
  PyObject* capsule =
      PyCapsule_New(&e->managed, CapsuleKind<Managed>::name, release_unused_capsule<Managed>);
  if (capsule == nullptr) throw py::error_already_set();
  e->owner = a.owner.inc_ref().ptr();
  e.release();  // owned by the capsule, then by its consumer
  return py::reinterpret_steal<py::capsule>(capsule);
}

py::capsule to_dlpack(const DeviceArray& a, const py::object& stream, const py::object& max_version,
                      const py::object& dl_device_arg, const py::object& copy) {
  // The rows are complete when the engine hands them out (ask() and the
  // iterate wait for the engine's stream), so any consumer stream may read
  // them at once: `stream` needs no synchronisation and is only checked.
  if (!stream.is_none() && !py::isinstance<py::int_>(stream)) {
    throw std::invalid_argument("stream: expected None or an int, got " +
                                py::repr(stream).cast<std::string>());
  }
  if (!copy.is_none() && copy.cast<bool>()) {
    throw py::buffer_error("copy: an optex.DeviceArray exports its own memory only (copy=True)");
  }
  if (!dl_device_arg.is_none()) {
    const auto wanted = dl_device_arg.cast<std::pair<int, int>>();
    const DLDevice mine = dl_device(a.device);
    if (wanted.first != mine.device_type || wanted.second != mine.device_id) {
      throw py::buffer_error("dl_device: the rows live on (" + std::to_string(mine.device_type) +
                             ", " + std::to_string(mine.device_id) + "), not (" +
                             std::to_string(wanted.first) + ", " + std::to_string(wanted.second) +
                             "); this array cannot move them");
    }
  }
  const bool versioned =
      !max_version.is_none() && max_version.cast<std::pair<int, int>>().first >= 1;
  return versioned ? make_capsule<DLManagedTensorVersioned>(a) : make_capsule<DLManagedTensor>(a);
}

}  // namespace

void register_device_array(py::module_& m) {
  py::class_<DeviceArray> cls(m, "DeviceArray", py::is_final(),
                              R"doc(Rows of an optex.OptEx where they live, without a copy.

A float32 array, (rows, dim) row-major or (dim,), in host memory or in the GPU memory
of a CUDA engine, for other libraries to wrap through the DLPack protocol:
torch.from_dlpack(a), cupy.from_dlpack(a), numpy.from_dlpack(a) (host rows
only). The wrapping tensor shares the memory, and keeps the engine alive.

The memory is complete when the array is handed out (the engine has waited
for its own CUDA stream). It stays the same memory for the engine's lifetime
and is rewritten in place by the engine's next ask() or tell(): wrap it again
rather than keep it across iterations. Only arrays whose `writable` is True
may be written through, and only before the call they feed (tell_device).
)doc");
  exported_from(cls, "optex");
  cls.def_property_readonly(
      "shape",
      [](const DeviceArray& a) -> py::tuple {
        if (a.ndim == 2) return py::make_tuple(a.rows, a.cols);
        return py::make_tuple(a.cols);
      },
      "(rows, dim) for batch rows, (dim,) for the iterate.");
  cls.def_property_readonly(
      "device", [](const DeviceArray& a) { return a.device.name(); },
      "Where the memory lives: 'cpu' or 'cuda:<index>'.");
  cls.def_readonly("writable", &DeviceArray::writable,
                   "Whether writing through the array is part of its contract.");
  cls.def("__dlpack__", &to_dlpack, py::kw_only(), py::arg("stream") = py::none(),
          py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(),
          py::arg("copy") = py::none(),
          "The DLPack capsule of the memory (float32, no copy): DLPack 1.0 with the "
          "read-only flag when max_version allows it, else the unversioned capsule.");
  cls.def("__dlpack_device__", [](const DeviceArray& a) {
    const DLDevice d = dl_device(a.device);
    return py::make_tuple(d.device_type, d.device_id);
  });
  cls.def("__repr__", [](const DeviceArray& a) {
    const std::string shape = a.ndim == 2 ? std::to_string(a.rows) + ", " + std::to_string(a.cols)
                                          : std::to_string(a.cols) + ",";
    return "optex.DeviceArray(shape=(" + shape + "), device='" + a.device.name() +
           "', writable=" + (a.writable ? "True" : "False") + ")";
  });
}

}  // namespace optex::python
