// The device backend's side of tell(): the gradients' checks, the mean of
// several evaluations, the staged step and the commit (device_backend.hpp
// describes the whole backend).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/device_backend.hpp"
#include "sharded/completed_sums.hpp"

#include "optex/engine/point_evaluations.hpp"

namespace optex::detail {

double DeviceBackend::reduce_evaluations(Batch& rows, std::span<const char> admissible,
                                         std::span<const int> evaluations, Batch& chain) {
  const BatchRows from = rows_of(rows);
  const BatchRows to = rows_of(chain);
  // Per point with two or more admissible evaluations: the squared norm of the
  // mean and the spread around it (sums over coordinates), and the count.
  std::vector<int> replicates;
  std::vector<int> which;
  std::size_t first = 0;
  std::size_t sums = 0;
  for (std::size_t p = 0; p < evaluations.size(); ++p) {
    const auto count = static_cast<std::size_t>(evaluations[p]);
    which.clear();
    double loss_sum = 0.0;
    for (std::size_t r = first; r < first + count; ++r) {
      if (!admissible[r]) continue;
      which.push_back(static_cast<int>(r));
      loss_sum += rows.loss(static_cast<int>(r));
    }
    first += count;
    float* mean = to.grad(static_cast<int>(p), d_);
    if (which.empty()) {
      p_->zero(mean, d_);
      chain.loss(static_cast<int>(p)) = kNaN;
      continue;
    }
    chain.loss(static_cast<int>(p)) = loss_sum / static_cast<double>(which.size());
    const bool measured = which.size() >= 2;
    p_->mean_of_rows(from.grads, which, d_, mean, measured ? sums_device_ + 2 * sums : nullptr);
    if (measured) {
      replicates.push_back(static_cast<int>(which.size()));
      ++sums;
    }
  }
  p_->fetch(std::vector<Fetch>{fetch_of<double>(sums_device_, sums_host_.data(), 2 * sums)});
  const std::span<double> measured(sums_host_.data(), 2 * sums);
  complete_sums(sums_, measured);
  if (sums_ != nullptr) {
    check_completed_squares(measured,
                            "squared norms of mean gradients and squared spreads about them");
  }
  return gradient_noise(measured, replicates);
}

// ---- tell() -----------------------------------------------------------------------------

void DeviceBackend::check_gradients(Batch& batch, std::span<char> finite) {
  const BatchRows rows = rows_of(batch);
  if (finite.size() > static_cast<std::size_t>(batch.size())) {
    throw std::invalid_argument("finite: " + std::to_string(finite.size()) +
                                " flags for a batch of " + std::to_string(batch.size()));
  }
  // BatchRows written through host views: upload them (one copy per run of
  // adjacent rows) and unstage them, so that a retry after a refused tell()
  // reads what the caller writes into the device rows next.
  batch.upload_staged_gradients();
  const auto n = static_cast<int>(finite.size());
  p_->within_bound(rows.grads, finite.size(), d_, bound_, flags_);
  p_->fetch(std::vector<Fetch>{fetch_of<int>(flags_, flags_host_.data(), finite.size())});
  for (int r = 0; r < n; ++r) finite[static_cast<std::size_t>(r)] = flags_host_[r] != 0 ? 1 : 0;
  complete_flags(sums_, finite);  // a pair is finite where it is on every slice
  if (sums_ != nullptr) {
    check_completed_flags(std::span<const char>(finite), flags_host_,
                          "gradients within the magnitude bound, one per row");
  }
}

bool DeviceBackend::stage_step(Batch& batch, int c) {
  const BatchRows rows = rows_of(batch);
  // From point N-1 the work state already is s_{N-1} (ask() left it there);
  // from an earlier point, replay the proxy steps from the iterate to recover
  // s_c. The first step reads x_, later ones update next_x_ in place.
  const float* from = rows.point(c, d_);
  if (c != batch.size() - 1 || !work_state_is_last_) {
    reset_work_state();
    from = x_;
    if (BatchAccess::proxy_steps_applied(batch)) {
      for (int r = 0; r < c; ++r) {
        StepGradient g;
        g.row = rows.prediction(r, d_);
        enqueue_step(g, from, next_x_);
        from = next_x_;
      }
    }
  }
  work_state_is_last_ = false;
  StepGradient g;
  g.row = rows.grad(c, d_);
  // The step's own pass checks its result and measures ||g_c||^2 for the
  // commit, and the step's length where it steps from the iterate's values
  // (x_, or point 0, the iterate's copy).
  StepChecks checks = staged_checks();
  checks.gradient_norm = staged_norm_;
  staged_length_ = from == x_ || c == 0;
  if (staged_length_) checks.step_length = staged_norm_ + 1;
  enqueue_step(g, from, next_x_, checks);
  staged_norm_row_ = c;
  return check_staged(true);
}

bool DeviceBackend::check_staged(bool checks_taken) {
  // The commit swaps the work state in: it must hold the staged state (a
  // step wrote it; copies of the committed one where nothing stepped).
  materialize_work_state();
  const int checks = checks_taken ? 1 + slots_.count() : enqueue_within(next_x_, 1);
  const bool backing_up = keeps_backup_ && !backed_up_;
  if (backing_up) enqueue_backup();
  std::vector<Fetch> values{fetch_of<int>(flags_, flags_host_.data(), checks)};
  if (staged_norm_row_ >= 0) {
    values.push_back(fetch_of<double>(staged_norm_, staged_norm_host_, staged_length_ ? 2 : 1));
  }
  p_->fetch(values);
  backed_up_ = backed_up_ || backing_up;
  return checked_on_every_slice(sums_, flags_all(checks),
                                "the staged step's iterate and state within their bounds");
}

void DeviceBackend::keep_coordinates(std::span<const CoordinateRange> ranges) {
  staged_length_ = false;  // the kept coordinates change the step
  for (const CoordinateRange& r : ranges) {
    p_->copy(x_ + r.offset, next_x_ + r.offset, r.size);
    for (int j = 0; j < kMaxStateSlots; ++j) {
      if (slots_.uses(j)) p_->copy(state_.slot[j] + r.offset, work_.slot[j] + r.offset, r.size);
    }
  }
}

std::size_t DeviceBackend::plan_push(std::span<const char> keep) {
  // Kept pairs take slots next, next+1, ... in order; only the last T0 of
  // them survive (earlier ones still advance the ring, as their pushes would).
  std::size_t pushes = 0;
  for (const char k : keep) pushes += k ? 1 : 0;
  const std::size_t skipped = pushes > capacity_ ? pushes - capacity_ : 0;
  pushes_.clear();
  std::size_t k = 0;
  for (std::size_t r = 0; r < keep.size(); ++r) {
    if (!keep[r]) continue;
    if (k >= skipped) pushes_.push_back({(gram_.next_slot() + k) % capacity_, static_cast<int>(r)});
    ++k;
  }
  return pushes;
}

void DeviceBackend::enqueue_backup() {
  const std::size_t slots = std::min(static_cast<std::size_t>(n_), capacity_);
  for (std::size_t k = 0; k < slots; ++k) {
    const std::size_t slot = (gram_.next_slot() + k) % capacity_;
    if (slot >= gram_.size()) continue;  // an empty slot
    p_->copy_stored(history_x_.row(slot, d_), backup_x_.row(k, d_), d_);
    p_->copy_stored(history_g_.row(slot, d_), backup_g_.row(k, d_), d_);
  }
}

void DeviceBackend::store_pushes(const BatchRows& rows, std::size_t& stored) {
  for (const Push& push : pushes_) {
    ++stored;
    p_->store(rows.point(push.row, d_), history_x_.row(push.slot, d_), d_);
    p_->store(rows.grad(push.row, d_), history_g_.row(push.slot, d_), d_);
  }
}

void DeviceBackend::restore_overwritten(std::size_t stored) {
  for (std::size_t k = 0; k < stored; ++k) {
    const std::size_t slot = pushes_[k].slot;
    if (slot >= gram_.size()) continue;
    const std::size_t kept = (slot + capacity_ - gram_.next_slot()) % capacity_;
    p_->copy_stored(backup_x_.row(kept, d_), history_x_.row(slot, d_), d_);
    p_->copy_stored(backup_g_.row(kept, d_), history_g_.row(slot, d_), d_);
  }
  p_->fetch({});
}

CommitStats DeviceBackend::commit(Batch& batch, int c, std::span<const char> keep,
                                  std::span<const char> predicted) {
  const BatchRows rows = rows_of(batch);
  const auto n = static_cast<int>(keep.size());
  // The statistics first: per compared row <p,p>, <p,g>, <g,g>, ||p - g||^2,
  // then ||g_c||^2 and ||next iterate - iterate||^2.
  std::vector<int> compared;
  for (int i = 0; i + 1 < n; ++i) {
    if (keep[static_cast<std::size_t>(i)] && predicted[static_cast<std::size_t>(i)]) {
      p_->pair_statistics(rows.prediction(i, d_), rows.grad(i, d_), d_,
                          sums_device_ + 4 * compared.size());
      compared.push_back(i);
    }
  }
  const auto own = std::find(compared.begin(), compared.end(), c);
  const std::size_t stats = 4 * compared.size();
  // ||g_c||^2: from its pair's statistics, else from the staged step's pass.
  const bool staged_norm = own == compared.end() && staged_norm_row_ == c;
  if (own == compared.end() && !staged_norm) {
    p_->dot(rows.grad(c, d_), rows.grad(c, d_), d_, sums_device_ + stats);
  }
  // ||next iterate - iterate||^2: from the staged step's pass where it stepped
  // from the iterate's values, else a pass of its own.
  if (!staged_length_) {
    const StoredRows iterate = fp32_rows(x_);
    p_->squared_distances(fp32_rows(next_x_), 1, d_, {&iterate, 1}, sums_device_ + stats + 1);
  }

  // The history push: the surviving pairs stored, then their new Gram rows
  // over the final history, one pass over the points and one over the gradients.
  const std::size_t pushes = plan_push(keep);
  const std::size_t size = std::min(gram_.size() + pushes, capacity_);
  const std::size_t pairs = pushes_.size();
  const std::size_t values = stats + 2 + (lazy_gram_ ? 0 : pairs * (2 * size + 1));
  if (keeps_backup_ && !backed_up_) {
    throw std::logic_error("device backend: commit() without a stage_step() that returned true");
  }
  std::size_t stored = 0;
  try {
    store_pushes(rows, stored);
    if (!lazy_gram_) enqueue_gram_rows(0, pairs, size, sums_device_ + stats + 2);
    p_->fetch(std::vector<Fetch>{fetch_of<double>(sums_device_, sums_host_.data(), values)});
    if (own != compared.end()) {
      sums_host_[stats] = sums_host_[4 * static_cast<std::size_t>(own - compared.begin()) + 2];
    } else if (staged_norm) {
      sums_host_[stats] = staged_norm_host_[0];
    }
    if (staged_length_) sums_host_[stats + 1] = staged_norm_host_[1];
    complete_sums(sums_, {sums_host_.data(), values});
    if (sums_ != nullptr) check_commit_sums(compared, c, size);
  } catch (...) {
    if (keeps_backup_) restore_overwritten(stored);
    throw;
  }
  // From here on only host bookkeeping: nothing throws.
  record_pushes(pushes, size, sums_host_.data() + stats + 2);
  CommitStats result = statistics(compared);
  std::swap(x_, next_x_);
  std::swap(state_, work_);
  step_ = work_step_;
  return result;
}

void DeviceBackend::enqueue_gram_rows(std::size_t first, std::size_t count, std::size_t size,
                                      double* out) {
  query_x_.clear();  // capacity T0, reserved: count <= T0 pairs survive a push
  query_g_.clear();
  for (std::size_t k = first; k < first + count; ++k) {
    query_x_.push_back(history_x_.row(pushes_[k].slot, d_));
    query_g_.push_back(history_g_.row(pushes_[k].slot, d_));
  }
  p_->squared_distances(history_x_, size, d_, query_x_, out, out + count * size);
  p_->inner_products(history_g_, size, d_, query_g_, out + count * size + count);
}

void DeviceBackend::record_pushes(std::size_t pushes, std::size_t size, const double* rows) {
  const std::size_t pairs = pushes_.size();
  for (std::size_t k = 0; k < pushes; ++k) gram_.advance();
  for (std::size_t k = 0; k < pairs; ++k) {
    if (!pair_known_.empty()) pair_known_[pushes_[k].slot] = 0;  // renewed: its pair products
    if (lazy_gram_) {
      std::erase(stale_, pushes_[k].slot);  // capacity T0, reserved: no allocation
      stale_.push_back(pushes_[k].slot);
      continue;
    }
    gram_.set_row(pushes_[k].slot, rows + k * size, rows[pairs * size + k],
                  rows + pairs * size + pairs + k * size);
  }
  backed_up_ = false;  // the history changed
  fitted_size_ = 0;
  history_host_current_ = false;
}

// ---- between rounds -------------------------------------------------------------------

void DeviceBackend::observe(std::span<const float> points, std::span<const float> gradients) {
  if (sums_ != nullptr) {
    throw std::logic_error("device backend: observe() on a slice of a sharded engine");
  }
  if (points.size() % d_ != 0 || gradients.size() != points.size()) {
    throw std::invalid_argument("observe: " + std::to_string(points.size()) + " point and " +
                                std::to_string(gradients.size()) +
                                " gradient values are not pairs of dimension " +
                                std::to_string(d_));
  }
  const std::size_t m = points.size() / d_;
  if (m == 0) return;
  // The pushes of a commit that keeps every pair: row k of the plan is pair k.
  const std::size_t pushes = plan_push(std::vector<char>(m, 1));
  const std::size_t pairs = pushes_.size();  // the last min(m, T0)
  const std::size_t size = std::min(gram_.size() + pushes, capacity_);
  // Their Gram rows over the final history, as many pairs per fetch as the
  // sums buffer holds (at least min(N, T0)); more than one fetch gathers
  // them on the host, in the layout of one.
  const std::size_t per_fetch = std::max<std::size_t>(1, sums_host_.size() / (2 * size + 1));
  const bool one_fetch = lazy_gram_ || pairs <= per_fetch;
  std::vector<double> gathered(one_fetch ? 0 : pairs * (2 * size + 1));
  // Where copies can fail, what the stores overwrite is kept first: in the
  // commit's backup rows when they hold every overwritten slot (at most
  // min(N, T0) pairs), else on the host (a wait).
  const bool device_backup = keeps_backup_ && pairs <= std::min<std::size_t>(n_, capacity_);
  std::vector<std::size_t> saved_slots;
  std::vector<float> saved_x, saved_g;
  if (keeps_backup_ && !device_backup) {
    for (const Push& push : pushes_) {
      if (push.slot < gram_.size()) saved_slots.push_back(push.slot);  // not an empty slot
    }
    saved_x.reserve(saved_slots.size() * d_);
    saved_g.reserve(saved_slots.size() * d_);
    std::vector<float> row;
    for (const std::size_t slot : saved_slots) {
      p_->view_stored(history_x_.row(slot, d_), d_, row);
      saved_x.insert(saved_x.end(), row.begin(), row.end());
      p_->view_stored(history_g_.row(slot, d_), d_, row);
      saved_g.insert(saved_g.end(), row.begin(), row.end());
    }
  }
  backed_up_ = false;  // the backup rows are rewritten below, or stale after the push
  if (device_backup) {
    enqueue_backup();
    p_->fetch({});  // proves the copies good before anything is overwritten
  }
  std::size_t stored = 0;
  try {
    for (const Push& push : pushes_) {
      const auto row = static_cast<std::size_t>(push.row) * d_;
      ++stored;
      put_row(points.data() + row, history_x_.row(push.slot, d_));
      put_row(gradients.data() + row, history_g_.row(push.slot, d_));
    }
    if (lazy_gram_) p_->fetch({});  // the caller's rows are read by then
    for (std::size_t first = 0; first < pairs && !lazy_gram_; first += per_fetch) {
      const std::size_t count = std::min(per_fetch, pairs - first);
      enqueue_gram_rows(first, count, size, sums_device_);
      p_->fetch(std::vector<Fetch>{
          fetch_of<double>(sums_device_, sums_host_.data(), count * (2 * size + 1))});
      if (one_fetch) break;
      const double* host = sums_host_.data();
      std::copy(host, host + count * size, gathered.begin() + first * size);
      std::copy(host + count * size, host + count * size + count,
                gathered.begin() + pairs * size + first);
      std::copy(host + count * size + count, host + count * (2 * size + 1),
                gathered.begin() + pairs * size + pairs + first * size);
    }
  } catch (...) {
    if (device_backup) restore_overwritten(stored);
    if (!saved_slots.empty()) {
      for (std::size_t k = 0; k < saved_slots.size(); ++k) {
        put_row(saved_x.data() + k * d_, history_x_.row(saved_slots[k], d_));
        put_row(saved_g.data() + k * d_, history_g_.row(saved_slots[k], d_));
      }
      p_->fetch({});
    }
    throw;
  }
  // From here on only host bookkeeping: nothing throws.
  record_pushes(pushes, size, one_fetch ? sums_host_.data() : gathered.data());
}

void DeviceBackend::check_commit_sums(std::span<const int> compared, int c, std::size_t size) {
  const double* host = sums_host_.data();
  const std::size_t stats = 4 * compared.size();
  const std::size_t values = stats + 2 + pushes_.size() * (2 * size + 1);
  // Per compared row <p,p>, <p,g>, <g,g>, ||p - g||^2: the gradient row is
  // within the magnitude bound, the prediction p need not be (its squares may
  // honestly overflow to +inf); where all are finite, Cauchy-Schwarz and
  // ||p - g||^2 = <p,p> - 2 <p,g> + <g,g> hold up to the passes' rounding.
  for (std::size_t k = 0; k < compared.size(); ++k) {
    const double aa = host[4 * k], ab = host[4 * k + 1], bb = host[4 * k + 2];
    const double dd = host[4 * k + 3];
    check_completed_square(aa, 4 * k, values, "squared norms of predicted gradients", true);
    check_completed_square(bb, 4 * k + 2, values, "squared norms of gradients");
    check_completed_square(dd, 4 * k + 3, values, "squared prediction errors", true);
    if (!std::isfinite(aa) || !std::isfinite(ab) || !std::isfinite(dd)) continue;
    const auto row = [&] {
      return "the statistics of row " + std::to_string(compared[k]) +
             " to <p,p> = " + sums_number(aa) + ", <p,g> = " + sums_number(ab) +
             ", <g,g> = " + sums_number(bb) + ", ||p - g||^2 = " + sums_number(dd);
    };
    if (!(std::abs(ab) <=
          (1.0 + kSumsAgreement) * std::sqrt((aa + sums_slack_) * (bb + sums_slack_)))) {
      refuse_completion(row() + ", impossible by Cauchy-Schwarz");
    }
    check_agreement(dd, aa - 2.0 * ab + bb, aa + bb, 4.0 * sums_slack_,
                    [&] { return row() + ": ||p - g||^2 and <p,p> - 2 <p,g> + <g,g>"; });
  }
  // ||g_c||^2 and the step's squared length: vectors within the bound. With c
  // compared, ||g_c||^2 was handed over as a copy of its <g,g> partials, and
  // the same partials added in slice order are the same bits.
  check_completed_square(host[stats], stats, values, "squared norms of gradients");
  check_completed_square(host[stats + 1], stats + 1, values, "squared step lengths");
  const auto own = std::lower_bound(compared.begin(), compared.end(), c);
  if (own != compared.end() && *own == c) {
    const double copy = host[4 * static_cast<std::size_t>(own - compared.begin()) + 2];
    if (host[stats] != copy) {
      refuse_completion("the same partials (the committed row " + std::to_string(c) +
                        "'s squared gradient norm, handed over twice) to " +
                        sums_number(host[stats]) + " and " + sums_number(copy) +
                        "; added in slice order, equal partials complete to equal sums");
    }
  }
  // The new Gram rows, and each new pair's <g,g> against the same row's
  // squared gradient norm in the statistics above (another pass, and the
  // history's storage: within kSumsAgreement).
  for (std::size_t k = 0; k < pushes_.size(); ++k)
    push_of_slot_[pushes_[k].slot] = static_cast<int>(k);
  const double* distances = host + stats + 2;
  const GramRows rows{pushes_.size(), size, distances, distances + pushes_.size() * size,
                      distances + pushes_.size() * size + pushes_.size()};
  const auto slot_of = [&](std::size_t k) { return pushes_[k].slot; };
  const auto push_of = [&](std::size_t j) { return static_cast<std::ptrdiff_t>(push_of_slot_[j]); };
  // The inner products' relations only where the CPU's passes computed them
  // (completed_sums.hpp: a device's fp32 GEMM has no bound by a block).
  const bool inner_relations = !p_->device().is_cuda();
  try {
    check_gram_rows(rows, slot_of, push_of, sums_slack_, inner_relations);
    for (std::size_t k = 0; k < pushes_.size() && inner_relations; ++k) {
      const int r = pushes_[k].row;
      const double diagonal = rows.inner[k * size + pushes_[k].slot];
      const auto at = std::lower_bound(compared.begin(), compared.end(), r);
      double norm = -1.0;
      if (at != compared.end() && *at == r) {
        norm = host[4 * static_cast<std::size_t>(at - compared.begin()) + 2];
      } else if (r == c) {
        norm = host[stats];
      }
      if (norm < 0.0) continue;
      check_agreement(diagonal, norm, std::max(diagonal, norm), sums_slack_, [&] {
        return "the squared norm of row " + std::to_string(r) +
               "'s gradient (in its history slot " + std::to_string(pushes_[k].slot) +
               "'s Gram row and in the commit's statistics)";
      });
    }
  } catch (...) {
    for (const Push& push : pushes_) push_of_slot_[push.slot] = -1;
    throw;
  }
  for (const Push& push : pushes_) push_of_slot_[push.slot] = -1;
}

CommitStats DeviceBackend::statistics(std::span<const int> compared) const {
  CommitStats stats;
  stats.prediction_error.assign(n_ > 1 ? static_cast<std::size_t>(n_ - 1) : 0, kNaN);
  for (std::size_t k = 0; k < compared.size(); ++k) {
    const double aa = sums_host_[4 * k], ab = sums_host_[4 * k + 1], bb = sums_host_[4 * k + 2];
    const double denom = std::sqrt(aa * bb);
    if (denom > 0.0) {
      stats.cosine_sum += ab / denom;
      ++stats.cosine_count;
      stats.prediction_error[static_cast<std::size_t>(compared[k])] =
          std::sqrt(sums_host_[4 * k + 3]) / std::sqrt(bb);
    }
  }
  const std::size_t tail = 4 * compared.size();
  stats.grad_norm = std::sqrt(sums_host_[tail]);
  stats.step_norm = std::sqrt(sums_host_[tail + 1]);
  return stats;
}

}  // namespace optex::detail
