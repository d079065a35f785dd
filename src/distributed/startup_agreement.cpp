#include "optex/distributed/startup_agreement.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace optex {
namespace {

// Length-prefixed fields: any byte may occur in a reason or a value.
void put_text(std::string& out, std::string_view text) {
  out += std::to_string(text.size());
  out += ':';
  out += text;
}

std::string take_text(std::string_view& in) {
  const std::size_t colon = in.find(':');
  std::size_t length = 0;
  const auto [end, error] = std::from_chars(in.data(), in.data() + colon, length);
  if (colon == std::string_view::npos || error != std::errc{} || end != in.data() + colon ||
      length > in.size() - colon - 1) {
    throw std::runtime_error("agree_on_startup: a rank sent a malformed status");
  }
  std::string text(in.substr(colon + 1, length));
  in.remove_prefix(colon + 1 + length);
  return text;
}

std::string encode(const StartupStatus& s) {
  std::string out;
  put_text(out, std::to_string(static_cast<int>(s.kind)));
  put_text(out, s.reason);
  put_text(out, std::to_string(s.settings.size()));
  for (const auto& [name, value] : s.settings) {
    put_text(out, name);
    put_text(out, value);
  }
  return out;
}

StartupStatus decode(std::string_view in) {
  StartupStatus s;
  const int kind = std::stoi(take_text(in));
  if (kind < 0 || kind > 2) throw std::runtime_error("agree_on_startup: a rank sent a bad status");
  s.kind = static_cast<StartupStatus::Kind>(kind);
  s.reason = take_text(in);
  const std::size_t count = std::stoul(take_text(in));
  for (std::size_t k = 0; k < count; ++k) {
    std::string name = take_text(in);
    s.settings.emplace_back(std::move(name), take_text(in));
  }
  return s;
}

// The first setting (in rank 0's order) on which a rank differs from rank 0,
// at the lowest such rank; empty when all agree.
std::string disagreement(const std::vector<StartupStatus>& all) {
  const auto& first = all[0].settings;
  for (std::size_t r = 1; r < all.size(); ++r) {
    const auto& other = all[r].settings;
    const std::size_t n = std::max(first.size(), other.size());
    for (std::size_t k = 0; k < n; ++k) {
      const bool mine = k < first.size();
      const bool theirs = k < other.size();
      if (mine && theirs && first[k] == other[k]) continue;
      const std::string name = mine ? first[k].first : other[k].first;
      const std::string ours = mine ? first[k].first + " = " + first[k].second : "nothing";
      const std::string its = theirs ? other[k].first + " = " + other[k].second : "nothing";
      if (mine && theirs && first[k].first == other[k].first) {
        return "ranks disagree on " + name + ": rank 0 has " + first[k].second + ", rank " +
               std::to_string(r) + " has " + other[k].second;
      }
      return "ranks disagree on the settings: rank 0 has " + ours + ", rank " + std::to_string(r) +
             " has " + its + " (different programs or versions?)";
    }
  }
  return {};
}

}  // namespace

void StartupStatus::add(std::string name, std::string value) {
  settings.emplace_back(std::move(name), std::move(value));
}

void StartupStatus::add(std::string name, double value) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof text, value);
  add(std::move(name), std::string(text, result.ptr));
}

namespace {

std::vector<StartupStatus> exchange(Communicator& comm, const StartupStatus& mine) {
  const std::vector<std::string> texts = comm.all_gather_text(encode(mine));
  std::vector<StartupStatus> all;
  all.reserve(texts.size());
  for (const std::string& t : texts) all.push_back(decode(t));
  return all;
}

}  // namespace

std::string first_disagreement(Communicator& comm,
                               const std::vector<std::pair<std::string, std::string>>& settings) {
  StartupStatus mine;
  mine.settings = settings;
  return disagreement(exchange(comm, mine));
}

StartupOutcome agree_on_startup(Communicator& comm, const StartupStatus& mine) {
  const std::vector<StartupStatus> all = exchange(comm, mine);

  StartupOutcome outcome;
  // Each reason once, with the ranks that gave it, in the order of the
  // lowest such rank: "ranks 0, 1 could not start: ...; rank 3 printed ...".
  std::vector<std::pair<std::string, std::vector<int>>> reasons;
  int helped = 0;
  for (std::size_t r = 0; r < all.size(); ++r) {
    const StartupStatus& s = all[r];
    if (s.kind == StartupStatus::Kind::ok) continue;
    if (s.kind == StartupStatus::Kind::help) ++helped;
    const std::string why = s.kind == StartupStatus::Kind::failed
                                ? "could not start: " + s.reason
                                : "printed the help (--help) instead of running";
    auto same = std::find_if(reasons.begin(), reasons.end(),
                             [&](const auto& entry) { return entry.first == why; });
    if (same == reasons.end()) same = reasons.insert(reasons.end(), {why, {}});
    same->second.push_back(static_cast<int>(r));
  }
  std::string problems;
  for (const auto& [why, ranks] : reasons) {
    if (!problems.empty()) problems += "; ";
    problems += ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t k = 0; k < ranks.size(); ++k) {
      problems += (k > 0 ? ", " : "") + std::to_string(ranks[k]);
    }
    problems += " " + why;
  }
  const auto me = static_cast<std::size_t>(comm.rank());
  if (helped == comm.size()) {
    outcome.print_help = comm.rank() == 0;
    return outcome;  // nothing to run, nothing wrong
  }
  outcome.print_help = all[me].kind == StartupStatus::Kind::help;
  outcome.message = problems.empty() ? disagreement(all) : problems;
  outcome.run = outcome.message.empty();
  outcome.exit_code = outcome.run ? 0 : 2;
  return outcome;
}

bool report_startup(const StartupOutcome& outcome, const Communicator& comm,
                    std::string_view program, const std::string& help) {
  if (outcome.print_help) std::fputs(help.c_str(), stdout);
  if (!outcome.run && !outcome.message.empty()) {
    std::fprintf(stderr, "%.*s: rank %d of %d: %s\n", static_cast<int>(program.size()),
                 program.data(), comm.rank(), comm.size(), outcome.message.c_str());
  }
  return outcome.run;
}

}  // namespace optex
