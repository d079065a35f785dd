// ThrowsWith<E>(f, needles): passes when f() throws E (or a subclass) whose
// message contains every needle; another exception (a bare std::bad_alloc
// included) or none fails, saying which.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <vector>

namespace optex::test {

template <class E, class F>
::testing::AssertionResult ThrowsWith(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
  } catch (const E& e) {
    const std::string what = e.what();
    for (const std::string& n : needles) {
      if (what.find(n) == std::string::npos) {
        return ::testing::AssertionFailure() << "message \"" << what << "\" lacks \"" << n << "\"";
      }
    }
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw the wrong type: " << e.what();
  } catch (...) {
    return ::testing::AssertionFailure() << "threw a non-std exception";
  }
  return ::testing::AssertionFailure() << "did not throw";
}

}  // namespace optex::test
