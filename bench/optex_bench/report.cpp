#include "report.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <ostream>
#include <thread>

#include "statistics.hpp"

namespace optex_bench {
namespace {

// JSON number: shortest form that reads back to the same double; null if non-finite.
std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  const auto result = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, result.ptr);
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

template <class T, class Format>
std::string json_list(const std::vector<T>& items, Format format) {
  std::string out = "[";
  for (std::size_t k = 0; k < items.size(); ++k) {
    if (k > 0) out += ", ";
    out += format(items[k]);
  }
  return out + "]";
}

std::string json_quartiles(const Quartiles& q) {
  return "{\"median\": " + json_number(q.median) + ", \"q1\": " + json_number(q.q1) +
         ", \"q3\": " + json_number(q.q3) + "}";
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        const auto start = line.find_first_not_of(' ', colon + 1);
        return start == std::string::npos ? "" : line.substr(start);
      }
    }
  }
  return "unknown CPU";
}

// Markdown number: 4 significant digits, "-" for null.
std::string md_number(double v) {
  if (!std::isfinite(v)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

std::string md_quartiles(const Quartiles& q) {
  return md_number(q.median) + " [" + md_number(q.q1) + ", " + md_number(q.q3) + "]";
}

std::string lr_selection(const Settings& s) {
  const bool tuned = s.lr_grid.size() > 1 && s.tuning_seeds > 0;
  if (s.lr_from_vanilla) {
    return std::string("learning-rate transfer: ") +
           (tuned ? "vanilla alone is tuned: lr times each lr_grid entry on the tuning "
                    "seeds (never reported), keeping the lowest median final loss (with a "
                    "given target loss: the fewest median rounds to it, then that); "
                  : "vanilla runs at lr, untuned; ") +
           "every other method runs at vanilla's learning rate (N x it for vanilla_nlr) with "
           "no tuning of its own";
  }
  if (!tuned) {
    return "none: every method runs at its centre learning rate (lr; N x lr for vanilla_nlr)";
  }
  return "each method's centre learning rate (lr; N x lr for vanilla_nlr) times each lr_grid "
         "entry, on the tuning seeds (never reported): fewest median rounds to the tuning "
         "target, then lowest median final loss. The tuning target is the target loss when "
         "given, else vanilla's median final loss on the tuning seeds, vanilla itself being "
         "tuned on median final loss alone";
}

}  // namespace

RunMetadata describe_run(int argc, char** argv) {
  RunMetadata meta;
  for (int k = 0; k < argc; ++k) {
    if (k > 0) meta.command += ' ';
    meta.command += argv[k];
  }
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char date[16];
  std::strftime(date, sizeof date, "%Y-%m-%d", &local);
  meta.date = date;
  meta.machine =
      cpu_model() + " (" + std::to_string(std::thread::hardware_concurrency()) + " cores)";
  return meta;
}

std::string target_rule(const Settings& settings) {
  if (settings.target_loss) return "fixed by --target-loss";
  return "the median over the reported seeds of the loss vanilla reaches at its last round "
         "(rounds to target: how fast each method reaches what vanilla reaches in the budget)";
}

void write_json(std::ostream& out, const RunMetadata& meta, const Settings& s,
                const std::vector<MethodSpec>& methods, const std::vector<TaskOutcome>& tasks,
                const std::vector<SummaryRow>& summary) {
  const auto quoted = [](const std::string& v) { return json_string(v); };
  const auto number = [](double v) { return json_number(v); };
  const auto integer = [](int v) { return std::to_string(v); };
  std::vector<std::string> task_names;
  for (const TaskOutcome& t : tasks) task_names.push_back(t.task);
  std::vector<int> seeds, tuning;
  for (int k = 0; k < s.seeds; ++k) seeds.push_back(k);
  if (s.lr_grid.size() > 1) {
    for (int k = 0; k < s.tuning_seeds; ++k) tuning.push_back(kFirstTuningSeed + k);
  }

  out << "{\n  \"schema\": \"optex-bench/1\",\n  \"runner\": \"optex-bench\",\n"
      << "  \"preset\": " << json_string(s.preset) << ",\n"
      << "  \"command\": " << json_string(meta.command) << ",\n"
      << "  \"date\": " << json_string(meta.date) << ",\n"
      << "  \"machine\": " << json_string(meta.machine) << ",\n"
      << "  \"metric\": \"loss\",\n  \"goal\": \"min\",\n";

  out << "  \"config\": {\n"
      << "    \"problems\": " << json_list(task_names, quoted) << ",\n"
      << "    \"dim\": " << s.dim << ",\n"
      << "    \"parallelism\": " << json_list(s.parallelism, integer) << ",\n"
      << "    \"iterations\": " << s.iterations << ",\n"
      << "    \"optimizer\": " << json_string(s.optimizer) << ",\n"
      << "    \"lr\": " << json_number(s.lr) << ",\n"
      << "    \"lr_grid\": " << (s.lr_grid.empty() ? "null" : json_list(s.lr_grid, number)) << ",\n"
      << "    \"lr_selection\": " << json_string(lr_selection(s)) << ",\n"
      << "    \"lr_from_vanilla\": " << (s.lr_from_vanilla ? "true" : "false") << ",\n"
      << "    \"seeds\": " << json_list(seeds, integer) << ",\n"
      << "    \"tuning_seeds\": " << json_list(tuning, integer) << ",\n"
      << "    \"start\": \"U(-1, 1)^d drawn from the seed\",\n"
      << "    \"noise\": " << json_number(s.noise) << ",\n"
      << "    \"problem_noise\": {";
  bool first_noisy = true;
  for (const TaskOutcome& t : tasks) {
    if (t.own_noise.empty()) continue;
    out << (first_noisy ? "" : ", ") << json_string(t.task) << ": " << json_string(t.own_noise);
    first_noisy = false;
  }
  out << "},\n"
      << "    \"rotated\": " << (s.rotated ? "true" : "false") << ",\n"
      << "    \"clip\": {";
  for (std::size_t k = 0; k < tasks.size(); ++k) {
    out << (k ? ", " : "") << json_string(tasks[k].task) << ": " << json_number(tasks[k].clip);
  }
  out << "},\n"
      << "    \"clip_rule\": \"gradient-norm clip of every gradient an optimizer or the engine "
         "sees; 0 = none\",\n"
      << "    \"target_rule\": " << json_string(target_rule(s)) << ",\n"
      << "    \"target_loss\": " << (s.target_loss ? json_number(*s.target_loss) : "null") << ",\n"
      << "    \"median_rule\": \"medians and quartiles over the reported seeds, linear "
         "interpolation; a seed that never reached the target counts as +infinity rounds, so "
         "an infinite median or quartile is null\",\n"
      << "    \"loss_measured\": \"noise-free loss at the committed iterate after each round, "
         "evaluated outside the budget (not in gradient_evaluations)\",\n"
      << "    \"seconds\": \"cumulative wall time of the method in this process, the N "
         "evaluations of a round run one after another, loss measurement excluded\",\n"
      << "    \"methods\": ";
  std::vector<std::string> method_names;
  for (const MethodSpec& m : methods) method_names.push_back(m.name);
  out << json_list(method_names, quoted) << ",\n    \"evaluations_per_round\": {";
  for (std::size_t k = 0; k < methods.size(); ++k) {
    const std::string per_round = evaluations_per_round(methods[k].kind);
    out << (k ? ", " : "") << json_string(methods[k].name) << ": "
        << (per_round == "1" ? per_round : json_string(per_round));
  }
  out << "}\n  },\n";

  out << "  \"records\": [";
  bool first = true;
  for (const TaskOutcome& t : tasks) {
    for (const MethodOutcome& m : t.methods) {
      for (std::size_t k = 0; k < m.runs.size(); ++k) {
        const Trajectory& run = m.runs[k];
        for (std::size_t r = 0; r < run.loss.size(); ++r) {
          out << (first ? "\n" : ",\n") << "    {\"task\": " << json_string(t.task)
              << ", \"parallelism\": " << m.parallelism
              << ", \"method\": " << json_string(m.method.name) << ", \"seed\": " << m.seeds[k]
              << ", \"round\": " << r << ", \"loss\": " << json_number(run.loss[r])
              << ", \"gradient_evaluations\": " << run.evaluations[r]
              << ", \"seconds\": " << json_number(run.seconds[r]) << "}";
          first = false;
        }
      }
    }
  }
  out << "\n  ],\n";

  out << "  \"summary\": [";
  for (std::size_t k = 0; k < summary.size(); ++k) {
    const SummaryRow& row = summary[k];
    const std::string note = row.best_baseline.empty()
                                 ? row.note
                                 : join_note(row.note, "best baseline: " + row.best_baseline);
    out << (k ? ",\n" : "\n") << "    {\"task\": " << json_string(row.task)
        << ", \"parallelism\": " << row.parallelism << ", \"method\": " << json_string(row.method)
        << ", \"lr\": " << json_number(row.lr) << ", \"target\": " << json_number(row.target)
        << ", \"seeds\": " << row.seeds << ", \"reached\": " << row.reached
        << ", \"rounds_to_target\": " << json_quartiles(row.rounds)
        << ", \"seconds_to_target\": " << json_quartiles(row.seconds)
        << ", \"final\": " << json_quartiles(row.final)
        << ", \"speedup_vs_vanilla\": " << json_number(row.speedup_vs_vanilla)
        << ", \"speedup_vs_best_baseline\": " << json_number(row.speedup_vs_best_baseline)
        << ", \"sqrt_parallelism\": " << json_number(row.sqrt_parallelism);
    if (!note.empty()) out << ", \"note\": " << json_string(note);
    out << "}";
  }
  out << "\n  ]\n}\n";
}

void write_markdown(std::ostream& out, const RunMetadata& meta, const Settings& s,
                    const std::vector<SummaryRow>& summary) {
  out << "# optex-bench: preset `" << s.preset << "`\n\n"
      << "- command: `" << meta.command << "`\n"
      << "- date: " << meta.date << "; machine: " << meta.machine << "\n"
      << "- d = " << s.dim << ", " << s.iterations << " rounds, " << s.optimizer << " lr "
      << md_number(s.lr) << ", " << s.seeds << " seeds (medians [q1, q3])"
      << (s.noise > 0.0 ? ", gradient noise std " + md_number(s.noise) : std::string())
      << "\n- learning rates: " << lr_selection(s) << "\n"
      << "- target: " << target_rule(s) << "\n"
      << "- rounds to target: first round (0 = start) with loss <= target; '-' where the "
         "median seed never reached it\n";
  std::string section;
  for (const SummaryRow& row : summary) {
    const std::string here = row.task + ", N = " + std::to_string(row.parallelism);
    if (here != section) {
      section = here;
      out << "\n## " << here << "\n\ntarget loss " << md_number(row.target)
          << ", sqrt(N) = " << md_number(row.sqrt_parallelism) << ", best same-budget baseline: "
          << (row.best_baseline.empty() ? "none that reached the target" : row.best_baseline)
          << "\n\n"
          << "| method | lr | reached | rounds to target | final loss | speedup vs vanilla | "
             "speedup vs best baseline | note |\n"
          << "|---|---|---|---|---|---|---|---|\n";
    }
    out << "| " << row.method << " | " << md_number(row.lr) << " | " << row.reached << "/"
        << row.seeds << " | " << md_quartiles(row.rounds) << " | " << md_quartiles(row.final)
        << " | " << md_number(row.speedup_vs_vanilla) << " | "
        << md_number(row.speedup_vs_best_baseline) << " | " << row.note << " |\n";
  }
}

}  // namespace optex_bench
