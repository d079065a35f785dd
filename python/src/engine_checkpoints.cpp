// OptEx.save, OptEx.load, OptEx.state_arrays and OptEx.from_state_arrays: a
// run's state to a checkpoint file or a dict of arrays, and back; pickle,
// copy.copy and copy.deepcopy over the same dict of arrays.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "names.hpp"
#include "optex/util/random.hpp"
#include "py_optex.hpp"
#include "shard.hpp"
#include "state_arrays.hpp"

namespace optex::python {
namespace {

std::string fspath(py::handle path) {
  return py::module_::import("os").attr("fsdecode")(path).cast<std::string>();
}

// The pickled form of an OptEx: (kPickleTag, kPickleVersion, state_arrays(),
// checksum of that state). The checksum makes a payload corrupted in transit (a
// flipped bit in an array that still holds finite values) an error instead of
// another run.
constexpr const char* kPickleTag = "optex.OptEx";
constexpr int kPickleVersion = 1;

// FNV-1a over a canonical encoding of a state_arrays() value: a type letter, then
// the value (dict keys in sorted order; arrays by dtype, shape and C-order bytes).
class StateChecksum {
 public:
  std::uint64_t value() const { return hash_; }

  void add(py::handle v) {
    if (v.is_none()) {
      tag('n');
    } else if (py::isinstance<py::bool_>(v)) {
      tag('b');
      tag(v.cast<bool>() ? '1' : '0');
    } else if (py::isinstance<py::int_>(v)) {
      tag('i');
      text(py::str(v).cast<std::string>());
    } else if (py::isinstance<py::float_>(v)) {
      tag('f');
      const double d = v.cast<double>();
      bytes(&d, sizeof d);
    } else if (py::isinstance<py::str>(v)) {
      tag('s');
      text(v.cast<std::string>());
    } else if (py::isinstance<py::array>(v)) {
      add_array(py::reinterpret_borrow<py::array>(v));
    } else if (py::isinstance<py::dict>(v)) {
      add_dict(py::reinterpret_borrow<py::dict>(v));
    } else if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
      const py::sequence items = py::reinterpret_borrow<py::sequence>(v);
      tag('l');
      count(items.size());
      for (py::handle item : items) add(item);
    } else {
      throw std::invalid_argument("unexpected value of type " +
                                  py::str(py::type::of(v).attr("__name__")).cast<std::string>());
    }
  }

 private:
  void bytes(const void* data, std::size_t n) {
    hash_ = fnv1a64(static_cast<const unsigned char*>(data), n, hash_);
  }
  void tag(char c) { bytes(&c, 1); }
  void count(std::size_t n) {
    const std::uint64_t v = n;
    bytes(&v, sizeof v);
  }
  void text(const std::string& s) {
    count(s.size());
    bytes(s.data(), s.size());
  }
  void add_array(const py::array& a) {
    tag('a');
    text(py::str(a.dtype().attr("str")).cast<std::string>());
    count(static_cast<std::size_t>(a.ndim()));
    for (py::ssize_t i = 0; i < a.ndim(); ++i) count(static_cast<std::size_t>(a.shape(i)));
    const py::array c = py::module_::import("numpy").attr("ascontiguousarray")(a);
    bytes(c.data(), static_cast<std::size_t>(c.nbytes()));
  }
  void add_dict(const py::dict& d) {
    std::vector<std::string> keys;
    for (auto item : d) keys.push_back(py::str(item.first).cast<std::string>());
    std::sort(keys.begin(), keys.end());
    tag('d');
    count(keys.size());
    for (const std::string& k : keys) {
      text(k);
      add(d[py::str(k)]);
    }
  }

  std::uint64_t hash_ = 0xCBF29CE484222325ull;
};

std::uint64_t state_checksum(py::handle state) {
  StateChecksum sum;
  sum.add(state);
  return sum.value();
}

// What pickle and copy.deepcopy carry: the whole state, history included.
// TypeError (pickle's word for "cannot be pickled") where that would not continue
// the run bit for bit.
py::dict state_to_copy(PyOptEx& self, const char* what) {
  if (self.is_slice()) {
    throw py::type_error(std::string(what) +
                         ": this OptEx is a slice of a sharded engine (shard=), whose sums "
                         "exchange with the other slices and do not travel; copy its "
                         "state_arrays() and resume it with from_state_arrays(state, shard=...)");
  }
  if (self.idle_engine(what).pending()) {
    throw py::type_error(std::string(what) +
                         ": a round is pending (ask() without tell()); an OptEx is copied or "
                         "pickled between rounds: call tell() first, or copy it before ask()");
  }
  EngineSnapshot snapshot;
  {
    PyOptEx::Exclusive busy(self, what);
    py::gil_scoped_release release;
    snapshot = self.engine().snapshot(true);
  }
  return state_arrays(std::move(snapshot), true);
}

// from_state_arrays' engine: a whole one (a slice when `shard` is given).
// ValueError naming the key for a state the engine refuses; nothing is built then.
std::unique_ptr<PyOptEx> engine_from_state(py::handle state, const std::optional<Device>& dev,
                                           const std::optional<Precision>& precision,
                                           std::optional<ShardArgument> shard) {
  EngineSnapshot snapshot = snapshot_from_arrays(state);
  const Optimizer kind = snapshot.optimizer.front();
  std::unique_ptr<PyOptEx> made;
  py::gil_scoped_release release;
  try {
    if (shard) {
      const std::size_t size = snapshot.iterate.size();
      Engine slice = Engine::from_snapshot(std::move(snapshot), shard->shard(size));
      made = std::make_unique<PyOptEx>(std::move(slice), std::move(shard->sums));
    } else {
      made = std::make_unique<PyOptEx>(Engine::from_snapshot(std::move(snapshot), dev, precision));
    }
  } catch (const InvalidSnapshot& e) {
    // The key first, unless the message starts with it ("options: ...").
    const std::string key = state_key(e, kind);
    const std::string what = e.what();
    const bool named = what.starts_with(key + ":") || what.starts_with(key + ".");
    throw std::invalid_argument(named ? what : key + ": " + what);
  }
  return made;
}

std::unique_ptr<PyOptEx> engine_from_copy(py::handle state) {
  return engine_from_state(state, std::nullopt, std::nullopt, std::nullopt);
}

// The other half of __getstate__: ValueError naming what is wrong with a payload
// that is not one (truncated tuple, another tag or version, a checksum mismatch).
std::unique_ptr<PyOptEx> engine_from_pickle(const py::tuple& t) {
  const std::string what = "OptEx.__setstate__: ";
  if (t.size() != 4 || !py::isinstance<py::str>(t[0]) || t[0].cast<std::string>() != kPickleTag) {
    throw std::invalid_argument(what +
                                "not a pickled optex.OptEx (expected a 4-tuple starting with '" +
                                kPickleTag + "'); the payload is corrupted");
  }
  if (!py::isinstance<py::int_>(t[1]) ||
      t[1].cast<py::int_>().cast<long long>() != kPickleVersion) {
    throw std::invalid_argument(what + "pickle format " + py::str(t[1]).cast<std::string>() +
                                " is not one this optex reads (" + std::to_string(kPickleVersion) +
                                ")");
  }
  if (!py::isinstance<py::dict>(t[2]) || !py::isinstance<py::int_>(t[3])) {
    throw std::invalid_argument(what + "the payload is corrupted (no state or no checksum)");
  }
  std::uint64_t expected = 0;
  try {
    expected = t[3].cast<std::uint64_t>();
  } catch (const py::cast_error&) {
    throw std::invalid_argument(what + "the payload is corrupted (a checksum out of range)");
  }
  std::uint64_t actual = 0;
  try {
    actual = state_checksum(t[2]);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(what + "the payload is corrupted (" + e.what() + ")");
  }
  if (actual != expected) {
    throw std::invalid_argument(what +
                                "the payload is corrupted: its state does not match its "
                                "checksum (changed in transit or storage); nothing was built");
  }
  return engine_from_copy(t[2]);
}

}  // namespace

void define_checkpoints(OptExClass& cls) {
  cls.def(
      "save",
      [](PyOptEx& self, py::handle path) {
        const std::string p = fspath(path);
        PyOptEx::Exclusive busy(self, "save");
        if (self.is_slice()) {
          // Engine::load would resume the file as a whole engine of the slice's size.
          throw std::runtime_error(
              "save: this engine is a slice of a sharded engine (shard=), which load() cannot "
              "resume; keep its state_arrays() and resume it with from_state_arrays(state, "
              "shard=...)");
        }
        py::gil_scoped_release release;
        self.engine().save(p);
      },
      py::arg("path"), R"doc(save(self, path: str | os.PathLike) -> None

Writes a checkpoint (the C++ Engine::save format): options, optimizer, iterate,
optimizer state, history, lengthscale, random state and counters. A run loaded
from it continues bit for bit. path is a str, bytes or os.PathLike. The file
is replaced atomically: a reader sees the old checkpoint or the new one. A
symbolic link is followed (its target is replaced, the link kept); anything
else that is not a regular file (a directory, fifo, device) is refused.
Raises ValueError for an empty path or one with a NUL byte, RuntimeError
between ask() and tell() and for a failed write (naming the path and the
OS's reason; no temporary file is left behind), and for a slice
(shard=), which load() could not resume as one: use state_arrays().
)doc");
  cls.def_static(
      "load",
      [](py::handle path, const std::optional<std::string>& device,
         const std::optional<std::string>& history_precision) {
        const std::string p = fspath(path);
        std::optional<Device> dev;
        if (device) dev = parse_device("device", *device);
        std::optional<Precision> precision;
        if (history_precision) {
          precision = parse_name<Precision>("history_precision", *history_precision);
        }
        std::unique_ptr<PyOptEx> made;
        {
          py::gil_scoped_release release;
          made = std::make_unique<PyOptEx>(Engine::load(p, dev, precision));
        }
        return made;
      },
      py::arg("path"), py::arg("device") = py::none(), py::arg("history_precision") = py::none(),
      R"doc(load(path: str | os.PathLike, device: str | None = None, history_precision: str | None = None) -> OptEx

Resumes a checkpoint written by save() (or by the C++ Engine::save). device
('cpu', 'cuda', 'cuda:<index>') moves the run to another device and
history_precision ('fp32', 'bf16', 'bf16_gradients') changes the history's
storage; without them the run resumes as saved. Raises ValueError for a bad
argument (an empty path or one with a NUL byte, a device that is not there,
bf16 on the CPU), checked before the file is read, and RuntimeError naming the
path, the field and the reason for a missing, truncated, corrupted, foreign or
invalid file, or one that is not a regular file. A gradient oracle is not part
of a checkpoint: set it again.
)doc");

  cls.def(
      "state_arrays",
      [](PyOptEx& self, bool history) {
        EngineSnapshot snapshot;
        {
          PyOptEx::Exclusive busy(self, "state_arrays");
          py::gil_scoped_release release;
          snapshot = self.engine().snapshot(history);
        }
        return state_arrays(std::move(snapshot), history);
      },
      py::arg("history") = true, R"doc(state_arrays(self, history: bool = True) -> dict

The engine's whole state as a dict of Python scalars, lists, dicts and numpy
arrays (new copies, never views of the engine's memory), from which
OptEx.from_state_arrays builds an engine that continues bit for bit: what
save() writes to a file, in a form torch.save / torch.load(weights_only=True)
and other containers can hold. With history=False the "history" key is
left out: an engine built from it has an empty history and warms up again,
everything else as it was. RuntimeError between ask() and tell().

The keys (python/optex/_optex.pyi, _StateArrays, documents each):
"format" (1, the layout), "options" (every Options field: Options(**d)),
"optimizer" (a list of per-range dicts: "size", "kind" (the class name),
"step_offset" and each hyperparameter), "x" (float32 (d,)), "step",
"slots" (slot name -> float32 (d,), the names of the optimizer's
state_slot_names), "lengthscale", "rng", "iteration", "evaluations",
"history" ("size", "next", float32 (size, d) "points" and "gradients",
float64 (T0, T0) "squared_distances", (T0,) "squared_norms" and (T0, T0)
"gradient_inner_products"), "round" ("evaluations_per_point",
"gradient_noise", "rounds_since_measured", "last_step_norm").
)doc");
  cls.def_static(
      "from_state_arrays",
      [](py::handle state, const std::optional<std::string>& device,
         const std::optional<std::string>& history_precision, py::handle shard_arg) {
        std::optional<Device> dev;
        if (device) dev = parse_device("device", *device);
        std::optional<Precision> precision;
        if (history_precision) {
          precision = parse_name<Precision>("history_precision", *history_precision);
        }
        std::optional<ShardArgument> shard = shard_from_python(shard_arg, "shard");
        if (shard && (device || history_precision)) {
          throw std::invalid_argument(
              "shard: a slice resumes on the CPU with the history precision it was saved with; "
              "pass neither device nor history_precision with shard");
        }
        return engine_from_state(state, dev, precision, std::move(shard));
      },
      py::arg("state"), py::kw_only(), py::arg("device") = py::none(),
      py::arg("history_precision") = py::none(), py::arg("shard") = py::none(),
      R"doc(from_state_arrays(state: Mapping[str, Any], *, device: str | None = None, history_precision: str | None = None, shard: tuple[int, int, ShardSums] | None = None) -> OptEx

An engine that continues the state OptEx.state_arrays() gave (bit for bit:
the same points, seeds and commits from here on), on `device` with
`history_precision` when given, as load() takes them. Without "history" the
engine starts with an empty history. The optimizer's ranges, sizes and step
offsets may differ from the engine the state came from, as long as the state
is consistent: a state for other coordinates can be built by hand.

Strict: every key documented by state_arrays() must be there ("history" may
be left out) and no other, each scalar of its type (an int or a float, not a
bool), each array a numpy array of exactly its dtype and shape (any strides:
it is copied). Raises ValueError naming the key (and the element) for
anything else, and for a value the engine refuses: non-finite values, points
or gradients above the magnitude bound, negative counters, a ring position
out of range, slots the optimizer does not keep, ranges whose sizes do not
add up to the dimension of x, a step offset beyond "step". Nothing is built
then.

shard=(dim, offset, sums) resumes the state of a slice (state_arrays() of an
engine built with shard=) as that slice, on the CPU (neither device nor
history_precision then): "x" holds its coordinates, which must fit in dim.
)doc");

  // pickle: the whole state (state_arrays, history included) and its checksum.
  cls.def(py::pickle(
      [](PyOptEx& self) {
        py::dict state = state_to_copy(self, "pickle");
        const std::uint64_t sum = state_checksum(state);
        return py::make_tuple(kPickleTag, kPickleVersion, state, sum);
      },
      [](const py::tuple& t) { return engine_from_pickle(t); }));
  // An engine's state is never shared between two engines: copy.copy makes the
  // same independent copy as copy.deepcopy.
  const auto copy_engine = [](PyOptEx& self) {
    return engine_from_copy(state_to_copy(self, "copy"));
  };
  cls.def("__copy__", copy_engine,
          R"doc(__copy__(self) -> OptEx

copy.copy: an independent engine with the same state (as copy.deepcopy; an
engine's state is never shared). See __deepcopy__.
)doc");
  cls.def(
      "__deepcopy__",
      [copy_engine](PyOptEx& self, py::handle /*memo*/) { return copy_engine(self); },
      py::arg("memo"), R"doc(__deepcopy__(self, memo: dict) -> OptEx

copy.deepcopy (and pickle, copy.copy): an engine that continues this one's run
bit for bit, independently (iterate, optimizer state, history, lengthscale,
random state, counters; on the same device with the same history precision).
A gradient oracle (set_gradient_oracle) is not copied, as save() does not
keep it: set it on the copy. TypeError between ask() and tell() (copy after
tell(), or before ask()) and for a slice of a sharded engine (shard=). A
pickled payload that is truncated or altered raises pickle's error or
ValueError naming the corruption (its checksum); nothing is built.
)doc");
}

}  // namespace optex::python
