// Runs a test body on every rank of an in-process world: W ranks as W threads.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "optex/distributed/communicator.hpp"
#include "optex/distributed/in_process_communicator.hpp"

namespace optex::test {

// Runs body(rank's communicator) on `world` threads and waits for all; an
// exception that escapes a rank is a test failure naming the rank.
inline void RunOnRanks(int world, const std::function<void(Communicator&)>& body) {
  InProcessWorld w(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&body, r, comm = w.communicator(r)] {
      try {
        body(*comm);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << " threw: " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace optex::test
