// OptEx.save, OptEx.load, OptEx.state_arrays and OptEx.from_state_arrays: a
// run's state to a checkpoint file or a dict of arrays, and back.
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "names.hpp"
#include "py_optex.hpp"
#include "shard.hpp"
#include "state_arrays.hpp"

namespace optex::python {
namespace {

std::string fspath(py::handle path) {
  return py::module_::import("os").attr("fsdecode")(path).cast<std::string>();
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
        EngineSnapshot snapshot = snapshot_from_arrays(state);
        const Optimizer kind = snapshot.optimizer.front();
        std::optional<ShardArgument> shard = shard_from_python(shard_arg, "shard");
        if (shard && (device || history_precision)) {
          throw std::invalid_argument(
              "shard: a slice resumes on the CPU with the history precision it was saved with; "
              "pass neither device nor history_precision with shard");
        }
        std::unique_ptr<PyOptEx> made;
        {
          py::gil_scoped_release release;
          try {
            if (shard) {
              const std::size_t size = snapshot.iterate.size();
              Engine slice = Engine::from_snapshot(std::move(snapshot), shard->shard(size));
              made = std::make_unique<PyOptEx>(std::move(slice), std::move(shard->sums));
            } else {
              made = std::make_unique<PyOptEx>(
                  Engine::from_snapshot(std::move(snapshot), dev, precision));
            }
          } catch (const InvalidSnapshot& e) {
            // The key first, unless the message starts with it ("options: ...").
            const std::string key = state_key(e, kind);
            const std::string what = e.what();
            const bool named = what.starts_with(key + ":") || what.starts_with(key + ".");
            throw std::invalid_argument(named ? what : key + ": " + what);
          }
        }
        return made;
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
}

}  // namespace optex::python
