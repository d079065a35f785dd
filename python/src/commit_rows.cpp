// Committing the pending batch's written gradient rows (commit_rows.hpp):
// tell() on a slice and tell_device().
#include "commit_rows.hpp"

#include <algorithm>
#include <stdexcept>

#include "arrays.hpp"
#include "optex/engine/magnitude_bound.hpp"

namespace optex::python {

const char* const kTellHint = "; pass drop_nonfinite=True to let the engine drop such points";

std::vector<double> losses_from(const py::array& losses) {
  std::vector<double> values(static_cast<std::size_t>(losses.size()));
  if (is_float32(losses)) {
    widen_to_float64(values_of<float>(losses), values);
  } else {
    const auto given = values_of<double>(losses);
    std::copy(given.begin(), given.end(), values.begin());
  }
  return values;
}

NonfiniteRows nonfinite_rows(bool drop_nonfinite) {
  return drop_nonfinite ? NonfiniteRows::drop : NonfiniteRows::refuse;
}

Info commit_rows(Engine& engine, Batch& batch, std::span<const double> losses, bool drop_nonfinite,
                 std::span<const CoordinateRange> unchanged, const std::string& rows) {
  const std::vector<double> before(batch.losses().begin(), batch.losses().end());
  std::copy(losses.begin(), losses.end(), batch.losses().begin());
  try {
    // The engine's commit checks the rows, once, and refuses before changing anything.
    return Info(engine.tell(batch, unchanged, nonfinite_rows(drop_nonfinite)));
  } catch (const RefusedRowsError& refused) {
    std::copy(before.begin(), before.end(), batch.losses().begin());
    std::string points;
    for (const int i : refused.rows()) points += (points.empty() ? "" : ", ") + std::to_string(i);
    throw std::invalid_argument("grads: the gradient rows of points " + points + rows +
                                " are not finite or exceed the magnitude bound " +
                                std::to_string(magnitude_bound(engine.shard().dim)) + kTellHint);
  } catch (...) {
    std::copy(before.begin(), before.end(), batch.losses().begin());
    throw;
  }
}

}  // namespace optex::python
